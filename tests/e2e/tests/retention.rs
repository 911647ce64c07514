//! The safety net under the one irreversible step, on the real cluster and its hostPath
//! provisioner (`drain-retain-volume-for`): a drained claim's volume outlives the claim with its
//! data, `kubectl drain-status --volumes` says how to restore it and its steps work, a restored
//! volume is an ordinary claim's again, and a volume whose retention ended is freed by the
//! provisioner. The data is judged on the node's disk, not by the controller's marks. Without
//! the right to patch volumes (RBAC), the claim is kept.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use drain_api::{annotations, retained};
use e2e::faults::*;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client, kubectl, release_dir, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use serde_json::json;

/// Long enough to look at a retained volume and restore one; short enough to see one freed.
const RETAIN_FOR: &str = "40s";

/// The set `web` of 3, Parallel, whose drain pods succeed at once, retaining for
/// `RETAIN_FOR`. At once: a restore creates the claim and then scales the set up, and a drain
/// started on the claim in between would finish before the scale-up (the restored claim is
/// held, so none starts).
fn retaining_set() -> SetBuilder {
    SetBuilder::new("web")
        .parallel()
        .annotation(
            annotations::DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({})),
        )
        .annotation(annotations::RETAIN_VOLUME_FOR, RETAIN_FOR)
}

/// The volume bound to `claim`, and its directory on this node (hostPath provisioner).
async fn volume_of(ns: &TestNamespace, claim: &str) -> Result<(String, PathBuf)> {
    let name = ns
        .api::<PersistentVolumeClaim>()
        .get(claim)
        .await?
        .spec
        .and_then(|s| s.volume_name)
        .with_context(|| format!("{claim} is bound"))?;
    let pv = Api::<PersistentVolume>::all(ns.client().clone())
        .get(&name)
        .await?;
    let path = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
        .context("a hostPath volume")?;
    Ok((name, path))
}

/// What the stateful pod wrote on its claim: its own name (read from the node's disk).
fn owner_on_disk(dir: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(dir.join("owner"))
        .with_context(|| format!("read {}", dir.display()))?
        .trim()
        .to_owned())
}

async fn volume(ns: &TestNamespace, name: &str) -> Result<Option<PersistentVolume>> {
    Ok(Api::<PersistentVolume>::all(ns.client().clone())
        .get_opt(name)
        .await?)
}

fn policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or_default()
}

/// No label and no annotation of ours left on `pv`.
fn no_marks(pv: &PersistentVolume) -> bool {
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let notes = pv.metadata.annotations.clone().unwrap_or_default();
    retained::LABELS.iter().all(|l| !labels.contains_key(*l))
        && retained::ANNOTATIONS
            .iter()
            .all(|a| !notes.contains_key(*a))
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// `kubectl drain-status` (the release binary) with `args`, as a user runs it.
fn drain_status_plugin(args: &[&str]) -> Result<String> {
    let out = Command::new(release_dir().join("kubectl-drain_status"))
        .args(args)
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl drain-status {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The restore steps `kubectl drain-status --volumes` printed for `volume`: the commands, the
/// claim's create and the scale-up apart (run with a pause between, the worst instant).
fn restore_steps(printed: &str, volume: &str) -> Result<Vec<String>> {
    let steps: Vec<&str> = printed
        .split("To restore volume ")
        .find(|s| s.starts_with(&format!("{volume} ")))
        .context("restore steps for the volume")?
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
        .collect();
    ensure!(steps.len() == 2, "two kubectl steps: {steps:?}");
    let (create, scale) = steps[1]
        .split_once(" && kubectl scale ")
        .context("the create, then the scale-up")?;
    Ok(vec![
        steps[0].to_owned(),
        create.to_owned(),
        format!("kubectl scale {scale}"),
    ])
}

/// Runs one restore step with bash, kubectl on the PATH, as a user pastes it.
fn run_restore_step(step: &str) -> Result<()> {
    let kubectl_path = PathBuf::from(kubectl().get_program());
    let path = format!(
        "{}:{}",
        kubectl_path.parent().context("kubectl dir")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", step])
        .env("PATH", &path)
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    ensure!(
        out.status.success(),
        "{step}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[tokio::test]
async fn a_drained_claims_volume_outlives_it_can_be_restored_and_is_freed_after_the_set_time()
-> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "retain").await?;
    let controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &retaining_set()).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let (pv1, dir1) = volume_of(&ns, "data-web-1").await?;
    let (pv2, dir2) = volume_of(&ns, "data-web-2").await?;
    wait_for(T, "each pod wrote its name on its claim", || async {
        Ok(owner_on_disk(&dir1).is_ok_and(|o| o == "web-1")
            && owner_on_disk(&dir2).is_ok_and(|o| o == "web-2"))
    })
    .await?;

    // 3 → 1: both drains succeed, both claims go, both volumes stay with their data.
    scale(&ns, "web", 1).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    for (pv, dir, pod) in [(&pv1, &dir1, "web-1"), (&pv2, &dir2, "web-2")] {
        let v = volume(&ns, pv)
            .await?
            .context("the volume outlives its claim")?;
        ensure!(policy(&v) == "Retain", "{pv}: policy {}", policy(&v));
        ensure!(
            label(&v, retained::LABEL) == Some("true")
                && label(&v, retained::SET_LABEL) == Some("web")
                && label(&v, retained::POD_LABEL) == Some(pod)
                && label(&v, retained::CLAIM_LABEL) == Some(&format!("data-{pod}")),
            "{pv}: labels {:?}",
            v.metadata.labels
        );
        ensure!(owner_on_disk(dir)? == pod, "{pv}: the data on disk");
    }
    // One per ordinal: Events of the same reason on the set are not folded into one series.
    // Events wait for a quiet spell after the claim deletes, so they may come after the claims go.
    let named_both = |events: &[String]| {
        events.iter().any(|e| e.contains(&pv1)) && events.iter().any(|e| e.contains(&pv2))
    };
    let waited = wait_for(T, "VolumesRetained events naming both volumes", || async {
        Ok(named_both(&events(&ns, "VolumesRetained").await?))
    })
    .await;
    let retained_events = events(&ns, "VolumesRetained").await?;
    ensure!(
        waited.is_ok() && named_both(&retained_events),
        "VolumesRetained events name {pv1} and {pv2}: {retained_events:?}"
    );

    // The plugin lists both, and its steps restore web-2's claim on its old volume.
    let listed = drain_status_plugin(&["--volumes", "-n", &ns.name])?;
    eprintln!("{listed}");
    ensure!(
        listed.contains(&pv1) && listed.contains(&pv2),
        "both volumes listed:\n{listed}"
    );
    let steps = restore_steps(&listed, &pv2)?;
    run_restore_step(&steps[0])?;
    run_restore_step(&steps[1])?;
    let claims = ns.api::<PersistentVolumeClaim>();
    wait_for(T, "the restored claim bound to its old volume", || async {
        Ok(claims
            .get_opt("data-web-2")
            .await?
            .is_some_and(|c| bound(&c) && c.spec.and_then(|s| s.volume_name) == Some(pv2.clone())))
    })
    .await?;
    // A pause before the scale-up (a slow paste, a user reading the output): the restored claim
    // is held, not drained again (the landed controller drained it at once), and its volume
    // keeps the data.
    let restored = claim_uid(&ns, "data-web-2").await?;
    hold(
        Duration::from_secs(8),
        "the restored claim held",
        || async {
            assert_claim_unchanged(&ns, "data-web-2", &restored).await?;
            ensure!(
                drain_pods(&ns).await?.is_empty(),
                "a drain pod was started on it"
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        owner_on_disk(&dir2)? == "web-2",
        "the restored data on disk"
    );
    run_restore_step(&steps[2])?;
    // The steps scaled the set up: web-2 runs on its old volume, its claim never drained again.
    wait_running(&ns, &pod_names("web", 1..3)).await?;
    let (now2, _) = volume_of(&ns, "data-web-2").await?;
    ensure!(now2 == pv2, "web-2 came back on its old volume");
    ensure!(
        claim_uid(&ns, "data-web-2").await? == restored,
        "the restored claim was replaced"
    );
    // Its pod back, the claim is an ordinary one again: the hold is cleared.
    wait_for(T, "the hold cleared from the restored claim", || async {
        Ok(!claims
            .get("data-web-2")
            .await?
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(drain_api::claim_annotations::HOLD))
    })
    .await?;
    // The controller hands it back: its original policy, no marks.
    wait_for(T, "the restored volume handed back", || async {
        let v = volume(&ns, &pv2).await?.context("restored volume")?;
        Ok(policy(&v) == "Delete" && no_marks(&v))
    })
    .await?;

    // web-1's volume, never restored, is freed once the retention ends: the volume object and
    // its directory on the node go (the provisioner's delete).
    wait_for(
        Duration::from_secs(150),
        "the unrestored volume freed",
        || async { Ok(volume(&ns, &pv1).await?.is_none() && !dir1.exists()) },
    )
    .await?;
    ensure!(
        volume(&ns, &pv2).await?.is_some() && owner_on_disk(&dir2)? == "web-2",
        "the restored volume is kept with its data"
    );
    // The sweep's own requests (it alone lists volumes; it released two) are counted.
    let metrics = http_get(&format!("{}/metrics", controller.admin_url()))
        .await?
        .1;
    let counted = |verb: &str| {
        sample(
            &metrics,
            "statefulset_drain_kube_requests_total",
            &format!(r#"verb="{verb}",resource="persistentvolumes",code="200""#),
        )
        .unwrap_or(0.0)
    };
    ensure!(
        counted("list") >= 1.0 && counted("patch") >= 4.0,
        "the sweep's list and the patches of volumes counted (2 retained, 2 released):\n{metrics}"
    );
    let after = drain_status_plugin(&["--volumes", "-n", &ns.name]);
    ensure!(
        after
            .as_ref()
            .is_ok_and(|o| !o.contains(&pv1) && !o.contains(&pv2)),
        "nothing listed any more: {after:?}"
    );
    Ok(())
}

/// A restored claim whose hold a person removes while its ordinal is still out of range is
/// drained again: its volume, already marked by this controller for the earlier claim, is
/// marked for the new one and retained for the full time from the new drain. The landed
/// controller took its own earlier `Retain` for the owner's, left the old marks, and the sweep
/// freed the volume when the first retention ended.
#[tokio::test]
async fn a_restored_claim_drained_again_is_retained_for_the_full_time_again() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "retain-again").await?;
    let _controller = ControllerProcess::start(&ns.name, &[]);
    start_set(&ns, &retaining_set()).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let (pv, dir) = volume_of(&ns, "data-web-2").await?;
    wait_for(T, "web-2 wrote its name on its claim", || async {
        Ok(owner_on_disk(&dir).is_ok_and(|o| o == "web-2"))
    })
    .await?;

    scale(&ns, "web", 2).await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    let first = volume(&ns, &pv).await?.context("retained")?;
    let first_until: jiff::Timestamp = annotation(&first, retained::UNTIL)
        .context("the retention's end")?
        .parse()?;

    // A while later (so the two retentions end apart), restore the claim (the plugin's steps,
    // not the scale-up), then release its hold.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let listed = drain_status_plugin(&["--volumes", "-n", &ns.name])?;
    let steps = restore_steps(&listed, &pv)?;
    run_restore_step(&steps[0])?;
    run_restore_step(&steps[1])?;
    let claims = ns.api::<PersistentVolumeClaim>();
    let restored = claim_uid(&ns, "data-web-2").await;
    let unhold = json!({"metadata": {"annotations": {drain_api::claim_annotations::HOLD: null}}});
    if claims.get_opt("data-web-2").await?.is_some() {
        claims
            .patch(
                "data-web-2",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&unhold),
            )
            .await
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(s) if s.code == 404 => Ok(()),
                e => Err(e),
            })?;
    }
    let restored = restored?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    // Before the first retention's end, or the sweep would have handed the volume back first.
    ensure!(
        jiff::Timestamp::now() < first_until,
        "drained again before {first_until}"
    );

    // Drained again: marked for the restored claim, retained from the new drain.
    let again = volume(&ns, &pv).await?.context("retained again")?;
    ensure!(
        policy(&again) == "Retain"
            && annotation(&again, retained::CLAIM_UID) == Some(restored.as_str())
            && label(&again, retained::LABEL) == Some("true"),
        "marked for the restored claim: {:?} {:?}",
        again.metadata.labels,
        again.metadata.annotations
    );
    let until: jiff::Timestamp = annotation(&again, retained::UNTIL)
        .context("the new retention's end")?
        .parse()?;
    ensure!(
        until >= first_until + jiff::SignedDuration::from_secs(10),
        "{until} at least 10 s after {first_until}"
    );
    // Past the first retention's end (when the sweep wakes), the volume and its data are kept.
    let past_first = first_until + jiff::SignedDuration::from_secs(5);
    let wait = past_first.duration_since(jiff::Timestamp::now());
    hold(
        Duration::try_from(wait).unwrap_or_default(),
        "the volume kept past the first retention",
        || async {
            let v = volume(&ns, &pv).await?.context("the volume was freed")?;
            ensure!(policy(&v) == "Retain", "policy {}", policy(&v));
            Ok(())
        },
    )
    .await?;
    ensure!(owner_on_disk(&dir)? == "web-2", "the data on disk");
    // Freed once the new retention ends.
    wait_for(
        Duration::from_secs(150),
        "the volume freed after the new retention",
        || async { Ok(volume(&ns, &pv).await?.is_none() && !dir.exists()) },
    )
    .await?;
    Ok(())
}

/// The volumes' ClusterRole, bound to the test's controller account while alive.
struct VolumesGrant {
    binding: String,
}

impl VolumesGrant {
    fn apply(ns: &TestNamespace) -> Result<Self> {
        let binding = format!("stsd-volumes-{}", ns.name);
        let text = std::fs::read_to_string(
            e2e::repo_root().join("artifacts/components/retained-volumes/volumes-rbac.yaml"),
        )?
        .replace(
            "name: statefulset-drain-controller-volumes\nroleRef",
            &format!("name: {binding}\nroleRef"),
        )
        .replace(
            "name: statefulset-drain-controller-volumes\nrules",
            &format!("name: {binding}\nrules"),
        )
        .replace(
            "  name: statefulset-drain-controller-volumes\nsubjects",
            &format!("  name: {binding}\nsubjects"),
        )
        .replace(
            "namespace: statefulset-drain-system",
            &format!("namespace: {}", ns.name),
        );
        ensure!(text.matches(&binding).count() == 3, "renamed: {text}");
        let grant = Self { binding };
        kubectl_apply(&text, "the volumes' ClusterRole")?;
        Ok(grant)
    }
}

impl Drop for VolumesGrant {
    fn drop(&mut self) {
        let _ = kubectl()
            .args([
                "delete",
                "--ignore-not-found",
                "clusterrolebinding,clusterrole",
                &self.binding,
            ])
            .output();
    }
}

/// Run as the namespaced install's account without the volumes' ClusterRole: the drain
/// succeeds, but the volume cannot be retained, so the claim is kept, with a Warning that
/// names the denial. Granted the right, the controller retains the volume and deletes the claim.
#[tokio::test]
async fn without_the_right_to_retain_the_volume_the_drained_claim_is_kept() -> Result<()> {
    let client = client().await;
    let ns = TestNamespace::new(&client, "retain-denied").await?;
    let identity = ControllerIdentity::create(&client, &ns, &[]).await?;
    identity
        .wait_can("patch", "persistentvolumes", false)
        .await?;
    let _controller = ControllerProcess::start_with_kubeconfig(&ns.name, &identity.kubeconfig, &[]);
    start_set(&ns, &retaining_set()).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;
    let uid = claim_uid(&ns, "data-web-2").await?;
    let (pv, dir) = volume_of(&ns, "data-web-2").await?;

    scale(&ns, "web", 2).await?;
    let warnings = wait_set_event(&ns, "web", "RetainVolumeFailed").await?;
    ensure!(
        warnings
            .iter()
            .any(|w| w.contains("data-web-2") && w.contains("forbidden")),
        "the Warning names the claim and the denial: {warnings:?}"
    );
    hold(Duration::from_secs(6), "the claim is kept", || async {
        ensure!(claim_uid(&ns, "data-web-2").await? == uid, "claim kept");
        Ok(())
    })
    .await?;

    let _grant = VolumesGrant::apply(&ns)?;
    identity
        .wait_can("patch", "persistentvolumes", true)
        .await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    let v = volume(&ns, &pv)
        .await?
        .context("the volume outlives its claim")?;
    ensure!(policy(&v) == "Retain", "policy {}", policy(&v));
    ensure!(owner_on_disk(&dir)? == "web-2", "the data on disk");
    Ok(())
}
