//! OpenKruise Advanced StatefulSets (`apps.kruise.io/v1beta1`) on the local cluster, which
//! `tests/cluster/kruise` sets up with the real kruise-manager.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::objects::SetBuilder;
use crate::{TestNamespace, repo_root, wait_for};

/// The Advanced StatefulSet API.
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps.kruise.io", "v1beta1", "StatefulSet"),
        "statefulsets",
    )
}

/// Advanced StatefulSets in the test namespace.
pub fn api(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::namespaced_with(ns.client().clone(), &ns.name, &resource())
}

/// The set `set` builds, as an Advanced StatefulSet with `extra` merged into its spec (e.g.
/// `reserveOrdinals`, `scaleStrategy`).
pub fn advanced(set: &SetBuilder, extra: Value) -> Result<DynamicObject> {
    let mut obj = serde_json::to_value(set.build())?;
    obj["apiVersion"] = json!("apps.kruise.io/v1beta1");
    obj["kind"] = json!("StatefulSet");
    if let (Some(spec), Some(extra)) = (obj["spec"].as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    Ok(serde_json::from_value(obj)?)
}

/// Creates the set's headless Service and the set as an Advanced StatefulSet.
pub async fn start(ns: &TestNamespace, set: &SetBuilder, extra: Value) -> Result<()> {
    ns.api::<k8s_openapi::api::core::v1::Service>()
        .create(&PostParams::default(), &set.service())
        .await?;
    api(ns)
        .create(&PostParams::default(), &advanced(set, extra)?)
        .await?;
    Ok(())
}

/// Merges `spec` into the Advanced StatefulSet's spec (what `kubectl patch` does).
pub async fn patch_spec(ns: &TestNamespace, name: &str, spec: Value) -> Result<()> {
    api(ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await?;
    Ok(())
}

/// The CRD files of the pinned Kruise release: `config/crd/bases` of its Go module, which
/// `tests/cluster/kruise` downloaded (and installed the CRDs from).
pub fn crds_dir() -> Result<PathBuf> {
    let out = std::process::Command::new("go")
        .args([
            "list",
            "-m",
            "-f",
            "{{.Dir}}",
            "github.com/openkruise/kruise",
        ])
        .current_dir(repo_root().join("tests/cluster/go/kruise"))
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .context("run go list (Go is needed for the Kruise harness)")?;
    ensure!(out.status.success(), "go list of the Kruise module failed");
    let dir = PathBuf::from(String::from_utf8(out.stdout)?.trim()).join("config/crd/bases");
    ensure!(
        dir.join(CRD_FILE).exists(),
        "{} not found: run tests/cluster/kruise (tests/run does)",
        dir.join(CRD_FILE).display()
    );
    Ok(dir)
}

/// The Advanced StatefulSet CRD's file name in [`crds_dir`].
pub const CRD_FILE: &str = "apps.kruise.io_statefulsets.yaml";
/// The Advanced StatefulSet CRD's name.
pub const CRD: &str = "statefulsets.apps.kruise.io";

/// Whether the API server serves Advanced StatefulSets.
pub async fn served(client: &Client) -> Result<bool> {
    match client
        .list_api_group_resources("apps.kruise.io/v1beta1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "statefulsets")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Fails loudly unless the cluster serves Advanced StatefulSets (tests/run sets Kruise up).
pub async fn require(client: &Client) -> Result<()> {
    ensure!(
        served(client).await?,
        "OpenKruise is not installed in the test cluster: run tests/cluster/kruise (tests/run does)"
    );
    Ok(())
}

/// Applies the Advanced StatefulSet CRD again and waits until it is served; then has the
/// harness check Kruise is healthy (it restarts kruise-manager if it stopped).
pub async fn reinstall_crd(client: &Client) -> Result<()> {
    let file = crds_dir()?.join(CRD_FILE);
    let status = crate::kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "kubectl apply {} failed", file.display());
    wait_for(
        Duration::from_secs(60),
        "Advanced StatefulSets served",
        || async { served(client).await },
    )
    .await?;
    let status = std::process::Command::new(repo_root().join("tests/cluster/kruise"))
        .stdout(std::process::Stdio::null())
        .status()
        .context("run tests/cluster/kruise")?;
    ensure!(status.success(), "tests/cluster/kruise failed");
    Ok(())
}

/// Deletes the Advanced StatefulSet CRD (and with it every Advanced StatefulSet) and waits
/// until the API server no longer serves the kind.
pub async fn remove_crd(client: &Client) -> Result<()> {
    let status = crate::kubectl()
        .args(["delete", "crd", CRD, "--ignore-not-found", "--wait=true"])
        .stdout(std::process::Stdio::null())
        .status()?;
    ensure!(status.success(), "kubectl delete crd {CRD} failed");
    wait_for(
        Duration::from_secs(60),
        "Advanced StatefulSets not served",
        || async { Ok(!served(client).await?) },
    )
    .await
}

/// The drain status annotation of the Advanced StatefulSet, parsed (`None` while there is none).
pub async fn drain_status(ns: &TestNamespace, set: &str) -> Result<Option<Value>> {
    let obj = api(ns).get(set).await?;
    crate::faults::status_in(obj.metadata.annotations.as_ref())
}

/// Waits until the Advanced StatefulSet's status reports `state` for the ordinal.
pub async fn wait_ordinal_state(
    ns: &TestNamespace,
    set: &str,
    ordinal: i32,
    state: &str,
) -> Result<Value> {
    let what = format!("advanced statefulset {set}");
    crate::faults::wait_status_state(&what, ordinal, state, || drain_status(ns, set)).await
}

/// Puts the Advanced StatefulSet CRD back when dropped (a test that removed it may fail half
/// way): applies it again and has the harness check Kruise (blocking).
pub struct CrdGuard;

impl Drop for CrdGuard {
    fn drop(&mut self) {
        let Ok(dir) = crds_dir() else {
            eprintln!("cannot put the Advanced StatefulSet CRD back: its file is not found");
            return;
        };
        let applied = crate::kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(dir.join(CRD_FILE))
            .stdout(std::process::Stdio::null())
            .status();
        let checked = std::process::Command::new(repo_root().join("tests/cluster/kruise"))
            .stdout(std::process::Stdio::null())
            .status();
        if !applied.is_ok_and(|s| s.success()) || !checked.is_ok_and(|s| s.success()) {
            eprintln!("putting the Advanced StatefulSet CRD back failed");
        }
    }
}
