//! Each pod of the example holds only the rights it needs (issue 23, section 4), tried on the
//! real cluster with each account's token (for the datastore pods, a TokenRequest bound to the
//! pod, as the kubelet mounts it): the datastore container has no token at all; the rebalance sidecar's account
//! may read the set and list its pods and nothing else; the drain pods' account may also read
//! and annotate pods, and touch no claim, secret or set. A drain and a rebalance still work
//! with them (`drainer.rs`, `drainer_safety.rs`, `newest_write.rs` run on the same manifest).

use anyhow::{Context, Result, ensure};
use e2e::faults::*;
use e2e::ops::*;
use e2e::{TestNamespace, client, kubeconfig_path};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A client acting with a token of `account`, bound to `pod` as the kubelet gives it to the
/// pod (`None`: a token of the account alone, the same rights).
async fn client_of(admin: &Client, ns: &str, account: &str, pod: Option<&Pod>) -> Result<Client> {
    let mut spec = json!({"audiences": [], "expirationSeconds": 600});
    if let Some(pod) = pod {
        spec["boundObjectRef"] = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "uid": pod.metadata.uid,
        });
    }
    let request: TokenRequest = serde_json::from_value(json!({ "spec": spec }))?;
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(account, &PostParams::default(), &request)
        .await?
        .status
        .context("token request status")?
        .token
        .context("token")?;
    let kc = Kubeconfig::read_from(kubeconfig_path())?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Ok(Client::try_from(config)?)
}

/// Whether a call was refused by RBAC (`403`), allowed, or failed otherwise.
fn denied<T>(result: &Result<T, kube::Error>) -> Result<bool> {
    match result {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(true),
        // Allowed, but the object is not there: not a denial.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => anyhow::bail!("unexpected error: {e}"),
    }
}

/// Every call of `may` is allowed and every call of `may_not` is refused with 403.
async fn check_rights(who: &str, client: &Client, ns: &str) -> Result<Vec<(String, bool)>> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {"e2e/touched": who}}}));
    Ok(vec![
        (
            "get statefulset".into(),
            !denied(&sets.get(DATASTORE).await)?,
        ),
        (
            "list pods".into(),
            !denied(&pods.list(&ListParams::default()).await)?,
        ),
        ("get pod".into(), !denied(&pods.get("datastore-0").await)?),
        (
            "patch pod".into(),
            !denied(
                &pods
                    .patch("datastore-0", &PatchParams::default(), &annotate)
                    .await,
            )?,
        ),
        (
            "patch statefulset".into(),
            !denied(
                &sets
                    .patch(DATASTORE, &PatchParams::default(), &annotate)
                    .await,
            )?,
        ),
        (
            "delete pod".into(),
            !denied(&pods.delete("no-such-pod", &DeleteParams::default()).await)?,
        ),
        (
            "get claim".into(),
            !denied(&claims.get("data-datastore-0").await)?,
        ),
        (
            "delete claim".into(),
            !denied(
                &claims
                    .delete("no-such-claim", &DeleteParams::default())
                    .await,
            )?,
        ),
        (
            "list secrets".into(),
            !denied(&secrets.list(&ListParams::default()).await)?,
        ),
    ])
}

#[tokio::test]
async fn each_pod_of_the_example_holds_only_the_rights_it_needs() -> Result<()> {
    let admin = client().await;
    let ns = TestNamespace::new(&admin, "least-privilege").await?;
    apply_example(&ns, &[])?;
    wait_running(&ns, &pod_names(DATASTORE, 0..3)).await?;
    let pod = ns.api::<Pod>().get("datastore-0").await?;
    let spec = pod.spec.as_ref().context("pod spec")?;

    // The datastore container has no token; the sidecar mounts the only one.
    ensure!(
        spec.automount_service_account_token == Some(false),
        "the datastore pods must not automount a token"
    );
    let mounts_token = |name: &str| {
        spec.containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.volume_mounts.as_ref())
            .is_some_and(|m| m.iter().any(|m| m.mount_path.starts_with(TOKEN_DIR)))
    };
    ensure!(
        !mounts_token("datastore"),
        "the datastore container has a token"
    );
    ensure!(
        mounts_token("rebalance"),
        "the rebalance sidecar has no token"
    );
    let account = spec.service_account_name.clone().unwrap_or_default();
    ensure!(
        account == "datastore-rebalance",
        "datastore pods run as {account}"
    );

    // What each account may do, with a token bound to a pod as the kubelet mounts it.
    let rebalance = client_of(&admin, &ns.name, "datastore-rebalance", Some(&pod)).await?;
    // The drain pods' account (the drain template names it; no drain pod runs here to bind to).
    let drainer = client_of(&admin, &ns.name, "datastore-drainer", None).await?;
    let want_rebalance = [
        ("get statefulset", true),
        ("list pods", true),
        ("get pod", false),
        ("patch pod", false),
    ];
    let want_drainer = [
        ("get statefulset", true),
        ("list pods", true),
        ("get pod", true),
        ("patch pod", true),
    ];
    let nobody = [
        ("patch statefulset", false),
        ("delete pod", false),
        ("get claim", false),
        ("delete claim", false),
        ("list secrets", false),
    ];
    let mut problems = Vec::new();
    for (who, client, want) in [
        ("rebalance sidecar", &rebalance, &want_rebalance),
        ("drain pod", &drainer, &want_drainer),
    ] {
        let got = check_rights(who, client, &ns.name).await?;
        for (call, allowed) in want.iter().chain(&nobody) {
            let actual = got
                .iter()
                .find(|(c, _)| c == call)
                .map(|(_, a)| *a)
                .context("call tried")?;
            if actual != *allowed {
                problems.push(format!(
                    "{who}: {call} is {} (want {})",
                    if actual { "allowed" } else { "refused" },
                    if *allowed {
                        "allowed"
                    } else {
                        "refused with 403"
                    }
                ));
            }
        }
        eprintln!("{who}: {got:?}");
    }
    ensure!(problems.is_empty(), "{problems:#?}");
    Ok(())
}
