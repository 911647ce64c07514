//! The install (`artifacts/`): every kustomize overlay renders and the API server accepts what it
//! renders (a server-side dry run), `artifacts/install.yaml` is the cluster-wide rendering, and
//! the controller, run in the cluster from each overlay (the image `tests/cluster/images` built
//! from this source, exactly the shipped RBAC), drains a scale-down. The single-namespace install
//! acts on its namespace only and holds no cluster-scoped permission; the ha install runs two
//! replicas of which only the Lease holder acts, and another takes over when it goes. The Helm
//! chart (`artifacts/chart/statefulset-drain`, checked against the overlays by
//! `artifacts/chart/check`) installs cluster-wide (and passes `helm test`) and watching one
//! namespace or two (one controller, a Role in each), drains as the overlays do, and an upgrade
//! (from this chart, and from the previous release's chart and controller) or an uninstall in
//! the middle of a drain loses nothing.
//!
//! Each in-cluster install goes into a namespace of its own with its names suffixed (an overlay
//! of the test's on top of the shipped one, as a user would write), so a user's install
//! (`example/up`'s, paused by `tests/run`) is untouched. An installed controller acts on every
//! namespace it may: the installs run one at a time, as short as they can, and each is removed
//! when its test ends, passed or failed, before the next starts.

mod installed;
mod kustomize;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use e2e::faults::{drain_status, exec, hold, wait_ordinal_state};
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{TestNamespace, kubectl, repo_root, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use installed::{Install, admin_client, chart_dir};
use kustomize::*;

/// The overlays of `artifacts/overlays`.
const OVERLAYS: [&str; 3] = ["cluster-wide", "single-namespace", "ha"];
/// The namespace the overlays install the controller into.
const SYSTEM_NAMESPACE: &str = "statefulset-drain-system";
/// The namespace the single-namespace overlay watches as shipped.
const SHIPPED_WATCHED: &str = "default";

// --- rendering and the dry run ----------------------------------------------------------------

/// The namespace the overlays install into, created for the dry run when it does not exist
/// (a server-side dry run does not create the Namespace it applies, so the objects in it would
/// find none), and deleted again when dropped if it was created here.
struct SystemNamespace {
    created: bool,
}

impl SystemNamespace {
    async fn ensure(client: &Client) -> Result<Self> {
        let api: Api<Namespace> = Api::all(client.clone());
        if api.get_opt(SYSTEM_NAMESPACE).await?.is_some() {
            return Ok(Self { created: false });
        }
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": SYSTEM_NAMESPACE}}))?;
        api.create(&PostParams::default(), &ns).await?;
        Ok(Self { created: true })
    }
}

impl Drop for SystemNamespace {
    fn drop(&mut self) {
        if self.created {
            let _ = kubectl()
                .args(["delete", "namespace", SYSTEM_NAMESPACE, "--wait=false"])
                .output();
        }
    }
}

/// The cluster-scoped objects among those the API server admitted, as "Kind name".
fn cluster_scoped(admitted: &[serde_json::Value]) -> Vec<String> {
    admitted
        .iter()
        .filter(|o| o["metadata"]["namespace"].is_null())
        .map(|o| format!("{} {}", kind(o), name(o)))
        .collect()
}

#[tokio::test]
async fn every_overlay_renders_and_the_api_server_accepts_it() -> Result<()> {
    let client = admin_client().await?;
    let _system = SystemNamespace::ensure(&client).await?;
    let mut rendered = BTreeMap::new();
    let mut admitted = BTreeMap::new();
    for overlay in OVERLAYS {
        let dir = overlay_dir(overlay);
        let objects = render(&dir).with_context(|| overlay.to_owned())?;
        eprintln!("{overlay}: {:?}", kinds(&objects));
        admitted.insert(overlay, validate(&dir).with_context(|| overlay.to_owned())?);
        rendered.insert(overlay, objects);
    }

    // cluster-wide: one replica acting on every namespace, through a ClusterRole.
    let cw = &rendered["cluster-wide"];
    let args = check_deployment(cw)?;
    ensure!(args.len() == 1, "cluster-wide args {args:?}");
    ensure!(
        the(cw, "Deployment", NAME)?["spec"]["replicas"] == 1,
        "one replica"
    );
    let binding = the(cw, "ClusterRoleBinding", NAME)?;
    ensure!(
        binding["subjects"]
            == json!([{"kind": "ServiceAccount", "name": NAME, "namespace": SYSTEM_NAMESPACE}]),
        "binding {}",
        binding["subjects"]
    );

    // single-namespace: --namespace, a Role and RoleBinding there with the same rules, and no
    // cluster-scoped object but the controller's Namespace and the volumes' RBAC.
    let sn = &rendered["single-namespace"];
    let args = check_deployment(sn)?;
    ensure!(
        args[1..] == [format!("--namespace={SHIPPED_WATCHED}")],
        "single-namespace args {args:?}"
    );
    let mut scoped = cluster_scoped(&admitted["single-namespace"]);
    scoped.sort();
    ensure!(
        scoped
            == [
                format!("ClusterRole {NAME}-nodes"),
                format!("ClusterRole {NAME}-volumes"),
                format!("ClusterRoleBinding {NAME}-nodes"),
                format!("ClusterRoleBinding {NAME}-volumes"),
                format!("Namespace {SYSTEM_NAMESPACE}"),
            ],
        "cluster-scoped objects in the single-namespace install: {scoped:?}"
    );
    // The volumes' rules: the same in every install, and never create or delete.
    for overlay in ["single-namespace", "cluster-wide", "ha"] {
        let role = the(
            &rendered[overlay],
            "ClusterRole",
            &format!("{NAME}-volumes"),
        )?;
        ensure!(
            role["rules"]
                == json!([{"apiGroups": [""], "resources": ["persistentvolumes"],
                           "verbs": ["get", "list", "patch"]}]),
            "{overlay}: volumes role {role}"
        );
        let nodes = the(&rendered[overlay], "ClusterRole", &format!("{NAME}-nodes"))?;
        ensure!(
            nodes["rules"]
                == json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
            "{overlay}: nodes role {nodes}"
        );
    }
    for k in ["Role", "RoleBinding"] {
        ensure!(
            the(sn, k, NAME)?["metadata"]["namespace"] == SHIPPED_WATCHED,
            "{k} in the watched namespace"
        );
    }
    ensure!(
        controller_rules(sn, "Role")? == controller_rules(cw, "ClusterRole")?,
        "the single-namespace Role and the cluster-wide ClusterRole grant the same"
    );

    // ha: cluster-wide, two replicas, --leader-elect, the Lease's RBAC, a PDB.
    let ha = &rendered["ha"];
    let args = check_deployment(ha)?;
    ensure!(args[1..] == ["--leader-elect"], "ha args {args:?}");
    let deployment = the(ha, "Deployment", NAME)?;
    ensure!(deployment["spec"]["replicas"] == 2, "two replicas");
    ensure!(
        deployment["spec"]["strategy"]["type"] == "RollingUpdate",
        "a rolling update keeps one replica up"
    );
    ensure!(
        controller_rules(ha, "ClusterRole")? == controller_rules(cw, "ClusterRole")?,
        "ha grants what cluster-wide does"
    );
    let lease_role = the(ha, "Role", "statefulset-drain-controller-leader-election")?;
    ensure!(
        lease_role["metadata"]["namespace"] == SYSTEM_NAMESPACE
            && lease_role["rules"]
                == json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "verbs": ["get", "list", "watch", "create", "patch"]}]),
        "lease role {lease_role}"
    );
    let pdb = the(ha, "PodDisruptionBudget", NAME)?;
    ensure!(pdb["spec"]["minAvailable"] == 1, "pdb {pdb}");

    // The overlays of one's own that docs/install.md shows render and are admitted too: single-namespace watching
    // another namespace, and the same with leader election (still nothing cluster-scoped).
    let scratch = Scratch::new("install-dry-run")?;
    let watched = TestNamespace::new(&client, "install-dry").await?;
    let mine = scratch.0.join("watching");
    watching(&mine, &overlay_dir("single-namespace"), &watched.name)?;
    let objects = render(&mine)?;
    validate(&mine)?;
    let args = check_deployment(&objects)?;
    ensure!(
        args[1..] == [format!("--namespace={}", watched.name)],
        "{args:?}"
    );
    for k in ["Role", "RoleBinding"] {
        ensure!(
            the(&objects, k, NAME)?["metadata"]["namespace"] == watched.name.as_str(),
            "{k} in {}",
            watched.name
        );
    }
    let mine_ha = scratch.0.join("watching-ha");
    with_leader_election(&mine_ha, &mine)?;
    let objects = render(&mine_ha)?;
    let mut scoped = cluster_scoped(&validate(&mine_ha)?);
    scoped.sort();
    let args = check_deployment(&objects)?;
    ensure!(
        args[1..]
            == [
                format!("--namespace={}", watched.name),
                "--leader-elect".into()
            ],
        "{args:?}"
    );
    ensure!(
        scoped
            == [
                format!("ClusterRole {NAME}-nodes"),
                format!("ClusterRole {NAME}-volumes"),
                format!("ClusterRoleBinding {NAME}-nodes"),
                format!("ClusterRoleBinding {NAME}-volumes"),
                format!("Namespace {SYSTEM_NAMESPACE}"),
            ],
        "cluster-scoped objects in the single-namespace install with leader election: {scoped:?}"
    );
    Ok(())
}

#[test]
fn install_yaml_is_the_rendered_cluster_wide_overlay() {
    let out = Command::new(repo_root().join("artifacts/generate"))
        .arg("--check")
        .env("KUBECTL", kubectl().get_program())
        .output()
        .expect("run artifacts/generate --check");
    assert!(
        out.status.success(),
        "artifacts/install.yaml is not what artifacts/generate renders:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// --- installs in the cluster, draining ---------------------------------------------------------

/// A Parallel set `web` of `replicas` with a short busybox drain, all Ready. Made before an
/// install, to keep the install short.
async fn ready_set(ns: &TestNamespace, replicas: i32) -> Result<()> {
    let set = SetBuilder::new("web")
        .replicas(replicas)
        .parallel()
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("sleep 1", &["data"], json!({"restartPolicy": "Never"})),
        );
    start_set(ns, &set).await?;
    wait_running(ns, &pod_names("web", 0..replicas)).await
}

/// Scales `web` down to `to` and waits until the drain of ordinal `to` has succeeded: its claim
/// deleted, the drain pod removed, the status `done`. Returns the `reportingInstance` of the
/// Event that created the drain pod (the acting controller's pod).
async fn scale_down_and_drain(ns: &TestNamespace, to: i32) -> Result<String> {
    let pod = format!("web-{to}");
    scale(ns, "web", to).await?;
    wait_claim_gone(ns, &format!("data-{pod}"), T).await?;
    wait_ordinal_state(ns, "web", to, "done").await?;
    wait_pod_gone(ns, &pod, T).await?;
    let events = ns.api::<Event>().list(&ListParams::default()).await?.items;
    let created: Vec<String> = events
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("DrainPodCreated")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains(&format!("drain pod {pod} ")))
        })
        .map(|e| e.reporting_instance.clone().unwrap_or_default())
        .collect();
    let by: BTreeSet<&String> = created.iter().collect();
    match by.into_iter().collect::<Vec<_>>().as_slice() {
        [one] if !one.is_empty() => Ok((*one).clone()),
        _ => bail!("DrainPodCreated events for {pod}, by: {created:?}"),
    }
}

/// What the controller may and may not do everywhere, with either cluster-wide install.
const CLUSTER_WIDE_ALLOWED: &[&[&str]] = &[
    &["list", "statefulsets", "--all-namespaces"],
    &["watch", "pods", "--all-namespaces"],
    &["create", "pods", "-n", "default"],
    &["delete", "persistentvolumeclaims", "-n", "default"],
    &["create", "events.events.k8s.io", "-n", "default"],
    &["list", "persistentvolumes"],
    &["patch", "persistentvolumes"],
    &["get", "nodes"],
    &["get", "controllerrevisions.apps", "-n", "default"],
];
const CLUSTER_WIDE_DENIED: &[&[&str]] = &[
    &["get", "secrets", "-n", "default"],
    &["update", "statefulsets", "-n", "default"],
    &["delete", "statefulsets", "-n", "default"],
    &["delete", "persistentvolumes"],
    &["create", "persistentvolumes"],
    &["list", "namespaces"],
    &["list", "nodes"],
    &["patch", "nodes"],
    &["list", "controllerrevisions.apps", "-n", "default"],
];

#[tokio::test]
async fn cluster_wide_install_drains_a_scale_down() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "install-cw").await?;
    ready_set(&ns, 2).await?;

    let install = Install::apply("cluster-wide", None).await?;
    let started = Instant::now();
    install.assert_permissions(CLUSTER_WIDE_ALLOWED, CLUSTER_WIDE_DENIED)?;
    let pods = install.wait_ready(1).await?;
    install.assert_admin_port().await?;
    let by = scale_down_and_drain(&ns, 1).await?;
    ensure!(pods == [by.clone()], "drained by {by}, not {pods:?}");
    install.assert_nothing_forbidden()?;
    eprintln!("cluster-wide install up for {:?}", started.elapsed());
    Ok(())
}

#[tokio::test]
async fn single_namespace_install_drains_its_namespace_only() -> Result<()> {
    let client = admin_client().await?;
    let watched = TestNamespace::new(&client, "install-watched").await?;
    let other = TestNamespace::new(&client, "install-other").await?;
    ready_set(&watched, 2).await?;
    ready_set(&other, 2).await?;

    let install = Install::apply("single-namespace", Some(&watched.name)).await?;
    let started = Instant::now();
    drains_its_namespaces_only(&install, &[&watched], &other).await?;
    eprintln!("single-namespace install up for {:?}", started.elapsed());
    Ok(())
}

/// What a namespaced install (the overlay, or the chart watching one namespace or several) may
/// do, and that it drains a scale-down in each of `watched` (the one controller pod drains them
/// all) and leaves `other` alone.
async fn drains_its_namespaces_only(
    install: &Install,
    watched: &[&TestNamespace],
    other: &TestNamespace,
) -> Result<()> {
    // Its service account may do what the controller needs in each watched namespace and
    // nothing anywhere else: no cluster-scoped permission but reading and patching volumes.
    let o = other.name.as_str();
    let mut allowed: Vec<Vec<&str>> =
        vec![vec!["patch", "persistentvolumes"], vec!["get", "nodes"]];
    for w in watched {
        let w = w.name.as_str();
        allowed.extend([
            vec!["list", "statefulsets", "-n", w],
            vec!["watch", "pods", "-n", w],
            vec!["create", "pods", "-n", w],
            vec!["delete", "persistentvolumeclaims", "-n", w],
            vec!["create", "events.events.k8s.io", "-n", w],
        ]);
    }
    let allowed: Vec<&[&str]> = allowed.iter().map(Vec::as_slice).collect();
    install.assert_permissions(
        &allowed,
        &[
            &["list", "statefulsets", "--all-namespaces"],
            &["watch", "pods", "--all-namespaces"],
            &["list", "persistentvolumeclaims", "--all-namespaces"],
            &["list", "statefulsets", "-n", o],
            &["create", "pods", "-n", o],
            &["delete", "persistentvolumeclaims", "-n", o],
            &["delete", "persistentvolumes"],
            &["list", "namespaces"],
        ],
    )?;
    // A cluster-scoped call, as the controller would make without --namespace, is denied: its
    // watches would never sync, and wait_ready below would fail.
    let denied = kubectl()
        .args(["get", "statefulsets", "--all-namespaces", "--as"])
        .arg(install.service_account())
        .output()?;
    ensure!(
        !denied.status.success() && String::from_utf8_lossy(&denied.stderr).contains("forbidden"),
        "listing statefulsets in all namespaces as the controller: {}",
        String::from_utf8_lossy(&denied.stderr)
    );

    // Ready only once the watches of every watched namespace synced.
    let pods = install.wait_ready(1).await?;
    install.assert_admin_port().await?;
    scale(other, "web", 1).await?;
    for w in watched {
        let by = scale_down_and_drain(w, 1).await?;
        ensure!(
            pods == [by.clone()],
            "{}: drained by {by}, not {pods:?}",
            w.name
        );
    }
    // The other namespace's scale-down, older than the drains just seen, is left alone.
    hold(
        Duration::from_secs(3),
        "the other namespace untouched",
        || async {
            assert_claims_kept(other, &["data-web-1"]).await?;
            ensure!(drain_pods(other).await?.is_empty(), "a drain pod in {o}");
            ensure!(
                drain_status(other, "web").await?.is_none(),
                "a drain status in {o}"
            );
            Ok(())
        },
    )
    .await?;
    install.assert_nothing_forbidden()?;
    Ok(())
}

/// The holder of the Lease, once it names a running controller pod other than `not`.
async fn wait_leader(install: &Install, not: Option<&str>) -> Result<String> {
    let leases: Api<Lease> = Api::namespaced(install.client.clone(), &install.namespace);
    let holder = std::sync::Mutex::new(None);
    let what = format!("the Lease {NAME}* held by a controller pod other than {not:?}");
    wait_for(T, &what, || async {
        // The overlays' Lease is NAME; the chart's is its full name (suffixed in these tests).
        let h = leases
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find(|l| {
                l.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| n.starts_with(NAME))
            })
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        let pods = install.pods().await?;
        let found = h.as_ref().is_some_and(|h| {
            Some(h.as_str()) != not && pods.iter().any(|p| p.metadata.name.as_ref() == Some(h))
        });
        *holder.lock().expect("lock") = h;
        Ok(found)
    })
    .await
    .with_context(|| format!("last holder {:?}", holder.lock().expect("lock")))?;
    Ok(holder.into_inner().expect("lock").unwrap_or_default())
}

#[tokio::test]
async fn ha_install_runs_two_replicas_one_acting() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "install-ha").await?;
    ready_set(&ns, 3).await?;
    let install = Install::apply("ha", None).await?;
    runs_two_replicas_one_acting(&client, &ns, &install).await
}

/// The ha install (overlay or chart) in the cluster: least privilege with the Lease, two Ready
/// replicas behind a PodDisruptionBudget that lets one go; the Lease holder is the one that
/// drains, and when it is deleted another replica takes the Lease and drains the next
/// scale-down. `ns` runs a Ready set of 3.
async fn runs_two_replicas_one_acting(
    client: &Client,
    ns: &TestNamespace,
    install: &Install,
) -> Result<()> {
    let started = Instant::now();
    install.assert_permissions(CLUSTER_WIDE_ALLOWED, CLUSTER_WIDE_DENIED)?;
    let own = install.namespace.as_str();
    install.assert_permissions(
        &[
            &["get", "leases.coordination.k8s.io", "-n", own],
            &["watch", "leases.coordination.k8s.io", "-n", own],
            &["patch", "leases.coordination.k8s.io", "-n", own],
        ],
        &[
            // The Lease is written by patches only: no replace.
            &["update", "leases.coordination.k8s.io", "-n", own],
            &["get", "leases.coordination.k8s.io", "-n", "default"],
            &["list", "leases.coordination.k8s.io", "--all-namespaces"],
        ],
    )?;
    let pods = install.wait_ready(2).await?;
    install.assert_admin_port().await?;

    // The PodDisruptionBudget lets one replica go at a time.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &install.namespace);
    let pdb = format!("{NAME}{}", install.suffix);
    wait_for(
        T,
        "the PodDisruptionBudget allowing one disruption",
        || async {
            let st = pdbs.get(&pdb).await?.status.unwrap_or_default();
            Ok(st.current_healthy == Some(2) && st.disruptions_allowed == Some(1))
        },
    )
    .await?;

    // One replica holds the Lease and is the one acting.
    let leader = wait_leader(install, None).await?;
    eprintln!("replicas {pods:?}, leader {leader}");
    let by = scale_down_and_drain(ns, 2).await?;
    ensure!(by == leader, "drained by {by}, the leader is {leader}");

    // The leader goes: another replica (the standby, or the pod replacing the leader, whichever
    // gets there first: the leader releases the Lease as it stops) takes the Lease and drains
    // the next scale-down.
    install.save_logs(&format!("deleting the leader {leader}"));
    install
        .pods_api()
        .delete(&leader, &DeleteParams::default())
        .await?;
    let deleted = Instant::now();
    let new_leader = wait_leader(install, Some(&leader)).await?;
    eprintln!(
        "{new_leader} took over {:?} after the leader was deleted",
        deleted.elapsed()
    );
    let by = scale_down_and_drain(ns, 1).await?;
    ensure!(
        by == new_leader,
        "drained by {by}, the leader is {new_leader}"
    );
    install.wait_ready(2).await?;
    install.assert_nothing_forbidden()?;
    eprintln!("ha install up for {:?}", started.elapsed());
    Ok(())
}

// --- the Helm chart in the cluster -------------------------------------------------------------

#[tokio::test]
async fn helm_ha_install_runs_two_replicas_one_acting() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "helm-ha").await?;
    ready_set(&ns, 3).await?;
    let install = Install::helm("ha", &[]).await?;
    runs_two_replicas_one_acting(&client, &ns, &install).await
}

#[tokio::test]
async fn helm_cluster_wide_install_drains_a_scale_down_and_passes_its_test() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "helm-cw").await?;
    ready_set(&ns, 2).await?;

    let install = Install::helm("cluster-wide", &[]).await?;
    install.assert_permissions(CLUSTER_WIDE_ALLOWED, CLUSTER_WIDE_DENIED)?;
    let pods = install.wait_ready(1).await?;
    install.assert_admin_port().await?;
    // `helm test`: its pod asks the controller's Service for /readyz.
    let release = install.release().context("a Helm install")?;
    install.helm_ok(&[
        "test",
        release,
        "--namespace",
        &install.namespace,
        "--timeout",
        "2m",
    ])?;
    let by = scale_down_and_drain(&ns, 1).await?;
    ensure!(pods == [by.clone()], "drained by {by}, not {pods:?}");
    install.assert_nothing_forbidden()?;
    Ok(())
}

#[tokio::test]
async fn helm_namespaced_install_drains_its_namespace_only() -> Result<()> {
    let client = admin_client().await?;
    let watched = TestNamespace::new(&client, "helm-watched").await?;
    let other = TestNamespace::new(&client, "helm-other").await?;
    ready_set(&watched, 2).await?;
    ready_set(&other, 2).await?;

    let only = format!(r#"watchNamespaces=["{}"]"#, watched.name);
    let install = Install::helm("namespaced", &["--set-json", &only]).await?;
    // Its only cluster-scoped objects: the volumes' and the nodes' ClusterRoles and bindings.
    let manifest = install.helm_of_release(&["get", "manifest"], &[])?;
    let kinds: BTreeSet<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .collect();
    let cluster_scoped: Vec<&&str> = kinds.iter().filter(|k| k.starts_with("Cluster")).collect();
    ensure!(
        cluster_scoped == [&"ClusterRole", &"ClusterRoleBinding"],
        "cluster-scoped kinds {cluster_scoped:?} in {kinds:?}"
    );
    let cluster_roles = manifest
        .lines()
        .filter(|l| *l == "kind: ClusterRole")
        .count();
    ensure!(
        cluster_roles == 2,
        "{cluster_roles} ClusterRoles:\n{manifest}"
    );
    drains_its_namespaces_only(&install, &[&watched], &other).await
}

/// The chart watching two namespaces (`watchNamespaces: [a, b]`): a Role and RoleBinding in
/// each and nothing cluster-scoped for the sets, `--namespace=a,b`, and the one controller pod
/// drains a scale-down in each and leaves a third namespace alone.
#[tokio::test]
async fn helm_install_watching_two_namespaces_drains_them_only() -> Result<()> {
    let client = admin_client().await?;
    let a = TestNamespace::new(&client, "helm-two-a").await?;
    let b = TestNamespace::new(&client, "helm-two-b").await?;
    let other = TestNamespace::new(&client, "helm-two-other").await?;
    for ns in [&a, &b, &other] {
        ready_set(ns, 2).await?;
    }

    let both = format!(r#"watchNamespaces=["{}","{}"]"#, a.name, b.name);
    let install = Install::helm("two-namespaces", &["--set-json", &both]).await?;
    let manifest = install.helm_of_release(&["get", "manifest"], &[])?;
    let objects: Vec<serde_json::Value> = manifest_objects(&manifest)?;
    // A Role and a RoleBinding in each watched namespace; the only cluster-scoped objects are
    // the volumes' ClusterRole and its binding.
    let placed = |kind: &str| -> BTreeSet<String> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .map(|o| o["metadata"]["namespace"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    let watched: BTreeSet<String> = [a.name.clone(), b.name.clone()].into();
    for kind in ["Role", "RoleBinding"] {
        ensure!(placed(kind) == watched, "{kind}s in {:?}", placed(kind));
    }
    let mut cluster_scoped = cluster_scoped(&objects);
    cluster_scoped.sort();
    let volumes = format!("{NAME}{}-volumes", install.suffix);
    let nodes = format!("{NAME}{}-nodes", install.suffix);
    ensure!(
        cluster_scoped
            == [
                format!("ClusterRole {nodes}"),
                format!("ClusterRole {volumes}"),
                format!("ClusterRoleBinding {nodes}"),
                format!("ClusterRoleBinding {volumes}")
            ],
        "cluster-scoped objects {cluster_scoped:?}"
    );
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .context("the Deployment")?;
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    let namespace_args: Vec<&str> = args
        .as_array()
        .context("args")?
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| a.starts_with("--namespace"))
        .collect();
    ensure!(
        namespace_args == [format!("--namespace={},{}", a.name, b.name)],
        "{namespace_args:?}"
    );
    drains_its_namespaces_only(&install, &[&a, &b], &other).await
}

/// The objects of a multi-document YAML text (`helm get manifest`), as JSON values.
fn manifest_objects(text: &str) -> Result<Vec<serde_json::Value>> {
    let out = kubectl_ok(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(text),
    )?;
    serde_json::Deserializer::from_str(&out)
        .into_iter::<serde_json::Value>()
        .collect::<Result<_, _>>()
        .context("kubectl create -o json")
}

/// The drain of `web-<ordinal>` as [`ready_set`]'s, but held until `/data/release` exists (the
/// test creates it with `kubectl exec`).
const HELD_DRAIN: &str = "until [ -e /data/release ]; do sleep 0.2; done";

/// Waits until the drain pod of `web-<ordinal>` runs; its UID.
async fn held_drain_pod(ns: &TestNamespace, ordinal: i32) -> Result<String> {
    let pod = wait_drain_pod(ns, &format!("web-{ordinal}"), Some("Running")).await?;
    Ok(pod.metadata.uid.unwrap_or_default())
}

/// An upgrade of the release while a drain is in flight (the controller's pod replaced): the
/// same drain pod finishes, its claim goes only then, and no second drain pod is made; then an
/// uninstall while another drain is in flight deletes nothing of the set's: the claim, the
/// drain pod and the drain status stay, and a controller installed again finishes the drain.
#[tokio::test]
async fn helm_upgrade_keeps_a_drain_in_flight_and_uninstall_keeps_the_data() -> Result<()> {
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "helm-upgrade").await?;
    let set = SetBuilder::new("web").replicas(3).parallel().annotation(
        DRAINER_POD_TEMPLATE,
        drain_template(HELD_DRAIN, &["data"], json!({"restartPolicy": "Never"})),
    );
    start_set(&ns, &set).await?;
    wait_running(&ns, &pod_names("web", 0..3)).await?;

    let install = Install::helm("cluster-wide", &[]).await?;
    let before = install.wait_ready(1).await?;
    let release = install.release().context("a Helm install")?.to_owned();

    // A drain in flight across an upgrade that replaces the controller's pod.
    scale(&ns, "web", 2).await?;
    let uid = held_drain_pod(&ns, 2).await?;
    install.helm_ok(&[
        "upgrade",
        &release,
        &chart_dir().display().to_string(),
        "--namespace",
        &install.namespace,
        "--reuse-values",
        "--set",
        "log.level=debug",
        "--wait",
        "--timeout",
        "3m",
    ])?;
    let after = install.wait_ready(1).await?;
    ensure!(
        before != after,
        "the upgrade did not replace the controller's pod ({before:?})"
    );
    assert_claims_kept(&ns, &["data-web-2"]).await?;
    exec(&ns, "web-2", "drain", "touch /data/release").await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    assert_one_drain_pod(&ns, "web-2", &uid).await?;

    // A drain in flight across an uninstall: nothing of the set's is deleted.
    scale(&ns, "web", 1).await?;
    let uid = held_drain_pod(&ns, 1).await?;
    install.helm_ok(&[
        "uninstall",
        &release,
        "--namespace",
        &install.namespace,
        "--wait",
    ])?;
    wait_for(T, "the controller's pods gone", || async {
        Ok(install.pods().await?.is_empty())
    })
    .await?;
    exec(&ns, "web-1", "drain", "touch /data/release").await?;
    hold(
        Duration::from_secs(5),
        "the claim and the drain pod kept without a controller",
        || async {
            assert_claims_kept(&ns, &["data-web-1"]).await?;
            let pods = drain_pods(&ns).await?;
            ensure!(
                pods.iter()
                    .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str())),
                "the drain pod of web-1 is gone"
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        drain_status(&ns, "web").await?.is_some(),
        "the drain status is gone"
    );
    drop(install);

    // Installed again, the controller finds the finished drain and deletes the claim.
    let again = Install::helm("cluster-wide", &[]).await?;
    again.wait_ready(1).await?;
    wait_claim_gone(&ns, "data-web-1", T).await?;
    again.assert_nothing_forbidden()?;
    Ok(())
}

/// `helm upgrade` from the chart's previous release, running the controller built from that
/// release's commit, to this chart and image, while a drain is in flight and a set that did
/// not opt in has been scaled down: the drain pod the previous controller made is the one that
/// finishes (no second one, no retry), its claim goes only after it finished, and every other
/// claim (the set's live pods', the other set's orphaned one) stays.
#[tokio::test]
async fn helm_upgrade_from_the_previous_release_keeps_a_drain_in_flight_and_deletes_nothing_else()
-> Result<()> {
    let previous = installed::PreviousRelease::get()?;
    let client = admin_client().await?;
    let ns = TestNamespace::new(&client, "helm-previous").await?;
    let set = SetBuilder::new("web").replicas(3).parallel().annotation(
        DRAINER_POD_TEMPLATE,
        drain_template(HELD_DRAIN, &["data"], json!({"restartPolicy": "Never"})),
    );
    start_set(&ns, &set).await?;
    start_set(&ns, &SetBuilder::new("plain").replicas(2).parallel()).await?;
    let mut live = pod_names("web", 0..3);
    live.extend(pod_names("plain", 0..2));
    wait_running(&ns, &live).await?;

    let tag = format!("image.tag={}", previous.tag());
    let install =
        Install::helm_chart(&previous.chart, "cluster-wide", &["--set", tag.as_str()]).await?;
    let before = install.wait_ready(1).await?;
    ensure!(
        install.images().await? == BTreeSet::from([previous.image.clone()]),
        "the previous release runs {:?}, not {}",
        install.images().await?,
        previous.image
    );

    // A drain in flight under the previous release, and a set that did not opt in scaled down.
    scale(&ns, "web", 2).await?;
    scale(&ns, "plain", 1).await?;
    let uid = held_drain_pod(&ns, 2).await?;
    wait_pod_gone(&ns, "plain-1", T).await?;
    install.helm_upgrade(&chart_dir(), "cluster-wide", &[])?;
    let after = install.wait_ready(1).await?;
    ensure!(
        before != after,
        "the upgrade did not replace the controller's pod ({before:?})"
    );
    let current = current_image()?;
    ensure!(
        install.images().await? == BTreeSet::from([current.clone()]),
        "after the upgrade the controller runs {:?}, not {current}",
        install.images().await?
    );
    let history = install.helm_of_release(&["history"], &["-o", "json"])?;
    let charts: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&history)?
        .iter()
        .filter_map(|r| r["chart"].as_str().map(str::to_owned))
        .collect();
    let this = format!("statefulset-drain-{}", chart_version()?);
    ensure!(
        charts
            == [
                format!("statefulset-drain-{}", previous.version),
                this.clone()
            ],
        "helm history: {charts:?}, expected the previous release then {this}"
    );

    // The new controller takes the drain over: the same pod, nothing deleted meanwhile.
    let everything = [
        "data-web-0",
        "data-web-1",
        "data-web-2",
        "data-plain-0",
        "data-plain-1",
    ];
    hold(
        Duration::from_secs(5),
        "every claim and the drain pod kept across the upgrade",
        || async {
            assert_claims_kept(&ns, &everything).await?;
            let pods = drain_pods(&ns).await?;
            ensure!(
                pods.iter()
                    .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str())),
                "the drain pod of web-2 ({uid}) is gone: {:?}",
                pods.iter().map(|p| &p.metadata.uid).collect::<Vec<_>>()
            );
            Ok(())
        },
    )
    .await?;
    exec(&ns, "web-2", "drain", "touch /data/release").await?;
    wait_claim_gone(&ns, "data-web-2", T).await?;
    wait_ordinal_state(&ns, "web", 2, "done").await?;
    assert_claims_kept(&ns, &everything[..2]).await?;
    assert_claims_kept(&ns, &everything[3..]).await?;
    assert_one_drain_pod(&ns, "web-2", &uid).await?;
    install.assert_nothing_forbidden()?;
    Ok(())
}

/// `web`'s Events say one drain pod was made for `pod` (`uid`) and no attempt was retried:
/// no second drain pod. (Each is reported on the set and on the drain pod: the set's.)
async fn assert_one_drain_pod(ns: &TestNamespace, pod: &str, uid: &str) -> Result<()> {
    let on_set = |v: Vec<String>| -> Vec<String> {
        v.into_iter().filter(|m| m.starts_with("web: ")).collect()
    };
    let created = on_set(events(ns, "DrainPodCreated").await?);
    let retried = on_set(events(ns, "DrainRetrying").await?);
    ensure!(
        created.iter().filter(|m| m.contains(pod)).count() == 1 && retried.is_empty(),
        "one drain pod for {pod} expected (pod {uid}): created {created:?}, retried {retried:?}"
    );
    Ok(())
}

/// The `version:` of this chart's Chart.yaml.
fn chart_version() -> Result<String> {
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("version:"))
        .map(|v| v.trim().to_owned())
        .context("Chart.yaml has no version")
}

/// The controller image this chart's values name, `repository:tag` of `image:` in values.yaml
/// (`tests/cluster/images` builds it).
fn current_image() -> Result<String> {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml"))?;
    let image: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "image:")
        .skip(1)
        .take_while(|l| l.starts_with(' ') || l.is_empty())
        .collect();
    let value = |key: &str| {
        image
            .iter()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("no image.{key} in values.yaml"))
    };
    Ok(format!("{}:{}", value("repository:")?, value("tag:")?))
}
