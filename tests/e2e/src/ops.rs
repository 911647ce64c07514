//! Steps the end-to-end tests share: start a set, scale it, wait for pods and claims, read
//! Events and drain pods.

use std::time::Duration;

use anyhow::{Context, Result};
use drain_api::names::pod_name;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use crate::objects::SetBuilder;
use crate::{TestNamespace, wait_for};

/// Default wait for things the cluster does within seconds.
pub const T: Duration = Duration::from_secs(90);

/// The drain pod label key.
pub use drain_api::labels::DRAIN_POD as DRAIN_POD_LABEL;

/// The label the StatefulSet controller (and OpenKruise's) puts on every pod it makes: its
/// revision. A drain pod of the same name is made by the drain controller, without it.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// Whether a pod is the set's own pod, serving: made by the set's controller (a drain pod has
/// its name while it drains, and is Running and Ready too; the drain label does not tell them
/// apart, as a set's pods may carry it), not being deleted, Running and Ready.
pub fn serving(p: &Pod) -> bool {
    let made_by_the_set = p
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(REVISION_LABEL));
    made_by_the_set && p.metadata.deletion_timestamp.is_none() && running_ready(p)
}

/// Whether a pod is Running and Ready.
pub fn running_ready(p: &Pod) -> bool {
    let st = p.status.as_ref();
    st.and_then(|s| s.phase.as_deref()) == Some("Running")
        && st
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod's phase ("" if none yet).
pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Whether a claim is Bound.
pub fn bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Creates the set's headless Service and the set.
pub async fn start_set(ns: &TestNamespace, set: &SetBuilder) -> Result<()> {
    ns.api::<Service>()
        .create(&PostParams::default(), &set.service())
        .await?;
    ns.api::<StatefulSet>()
        .create(&PostParams::default(), &set.build())
        .await?;
    Ok(())
}

/// Waits until every named pod is the set's own pod ([`serving`]).
pub async fn wait_running(ns: &TestNamespace, names: &[String]) -> Result<()> {
    let pods = ns.api::<Pod>();
    for n in names {
        wait_for(
            T,
            &format!("stateful pod {n} Running and Ready"),
            || async { Ok(pods.get_opt(n).await?.is_some_and(|p| serving(&p))) },
        )
        .await?;
    }
    Ok(())
}

/// The pod name ([`pod_name`]) of each ordinal of `set`.
pub fn pod_names(set: &str, ordinals: impl IntoIterator<Item = i32>) -> Vec<String> {
    ordinals.into_iter().map(|o| pod_name(set, o)).collect()
}

/// Replaces the set's drain template annotation (what `kubectl annotate --overwrite` does).
pub async fn set_drain_template(ns: &TestNamespace, set: &str, template: String) -> Result<()> {
    ns.api::<StatefulSet>()
        .patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                drain_api::annotations::DRAINER_POD_TEMPLATE: template
            }}})),
        )
        .await?;
    Ok(())
}

/// Sets `spec.replicas` (what `kubectl scale` does).
pub async fn scale(ns: &TestNamespace, set: &str, replicas: i32) -> Result<()> {
    ns.api::<StatefulSet>()
        .patch(
            set,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await?;
    Ok(())
}

/// Waits until the pod is gone.
pub async fn wait_pod_gone(ns: &TestNamespace, name: &str, timeout: Duration) -> Result<()> {
    let pods = ns.api::<Pod>();
    let waited = wait_for(timeout, &format!("pod {name} gone"), || async {
        Ok(pods.get_opt(name).await?.is_none())
    })
    .await;
    match waited {
        Ok(()) => Ok(()),
        // What it is left in says whose step is missing (no delete asked, a finalizer, a node
        // that did not confirm).
        Err(e) => Err(e.context(match pods.get_opt(name).await {
            Ok(Some(p)) => describe_pod(&p),
            Ok(None) => "gone just after".to_owned(),
            Err(read) => format!("could not read it: {read}"),
        })),
    }
}

/// Waits until the claim is gone.
pub async fn wait_claim_gone(ns: &TestNamespace, name: &str, timeout: Duration) -> Result<()> {
    let claims = ns.api::<PersistentVolumeClaim>();
    let waited = wait_for(timeout, &format!("claim {name} gone"), || async {
        Ok(claims.get_opt(name).await?.is_none())
    })
    .await;
    match waited {
        Ok(()) => Ok(()),
        Err(e) => Err(e.context(match claims.get_opt(name).await {
            Ok(Some(c)) => describe_claim(&c),
            Ok(None) => "gone just after".to_owned(),
            Err(read) => format!("could not read it: {read}"),
        })),
    }
}

/// A claim's state in one line, for a failed wait: name, UID, deletion, finalizers,
/// annotations.
pub fn describe_claim(c: &PersistentVolumeClaim) -> String {
    let m = &c.metadata;
    format!(
        "claim {}: uid {}, deletion requested {:?}, finalizers {:?}, annotations {:?}",
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default(),
        m.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        m.finalizers.clone().unwrap_or_default(),
        m.annotations.clone().unwrap_or_default(),
    )
}

/// A pod's state in one line, for a failed wait: UID, phase, deletion, finalizers, drain label,
/// node, and each container's state.
pub fn describe_pod(p: &Pod) -> String {
    let m = &p.metadata;
    let containers: Vec<String> = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let state = c.state.as_ref();
            let what = if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
                format!(
                    "terminated exit {} ({})",
                    t.exit_code,
                    t.reason.clone().unwrap_or_default()
                )
            } else if state.and_then(|s| s.running.as_ref()).is_some() {
                "running".to_owned()
            } else {
                "waiting".to_owned()
            };
            format!("{}: {what}, {} restarts", c.name, c.restart_count)
        })
        .collect();
    format!(
        "pod {}: uid {}, phase {:?}, deletion requested {:?} (grace {:?}), finalizers {:?}, drain pod {}, node {:?}, containers [{}]",
        m.name.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
        phase(p),
        m.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        m.deletion_grace_period_seconds,
        m.finalizers.clone().unwrap_or_default(),
        m.labels
            .as_ref()
            .is_some_and(|l| l.contains_key(DRAIN_POD_LABEL)),
        p.spec.as_ref().and_then(|s| s.node_name.clone()),
        containers.join("; "),
    )
}

/// The claim's UID.
pub async fn claim_uid(ns: &TestNamespace, name: &str) -> Result<String> {
    Ok(ns
        .api::<PersistentVolumeClaim>()
        .get(name)
        .await?
        .metadata
        .uid
        .unwrap_or_default())
}

/// The drain pods in the namespace.
pub async fn drain_pods(ns: &TestNamespace) -> Result<Vec<Pod>> {
    Ok(ns
        .api::<Pod>()
        .list(&ListParams::default().labels(DRAIN_POD_LABEL))
        .await?
        .items)
}

/// Events in the namespace with this reason, as "object-name: message".
pub async fn events(ns: &TestNamespace, reason: &str) -> Result<Vec<String>> {
    let list = ns.api::<Event>().list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            format!(
                "{}: {}",
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// Waits for at least one Event with this reason about `object`, and returns its messages.
pub async fn wait_event(ns: &TestNamespace, object: &str, reason: &str) -> Result<Vec<String>> {
    let prefix = format!("{object}: ");
    wait_for(T, &format!("a {reason} event on {object}"), || async {
        Ok(events(ns, reason)
            .await?
            .iter()
            .any(|e| e.starts_with(&prefix)))
    })
    .await?;
    Ok(events(ns, reason)
        .await?
        .into_iter()
        .filter(|e| e.starts_with(&prefix))
        .collect())
}

/// Whether the pod is a drain pod.
pub fn is_drain_pod(p: &Pod) -> bool {
    p.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(DRAIN_POD_LABEL))
}

/// Waits until `name` is a drain pod (in `phase`, if given) and returns it.
pub async fn wait_drain_pod(ns: &TestNamespace, name: &str, phase_is: Option<&str>) -> Result<Pod> {
    let pods = ns.api::<Pod>();
    let what = format!("drain pod {name} {}", phase_is.unwrap_or(""));
    wait_for(T, &what, || async {
        Ok(pods
            .get_opt(name)
            .await?
            .is_some_and(|p| is_drain_pod(&p) && phase_is.is_none_or(|want| phase(&p) == want)))
    })
    .await?;
    Ok(pods.get(name).await?)
}

/// Waits until `name` is the StatefulSet's own pod again ([`serving`]).
pub async fn wait_stateful_pod_back(ns: &TestNamespace, name: &str) -> Result<()> {
    wait_running(ns, &[name.to_owned()]).await
}

/// Fails unless every named claim still exists, is Bound and is not being deleted.
pub async fn assert_claims_kept(ns: &TestNamespace, names: &[&str]) -> Result<()> {
    let claims = ns.api::<PersistentVolumeClaim>();
    for c in names {
        let claim = claims.get_opt(c).await?;
        anyhow::ensure!(
            claim
                .as_ref()
                .is_some_and(|cl| cl.metadata.deletion_timestamp.is_none() && bound(cl)),
            "claim {c} was touched: {:?}",
            claim.map(|cl| (cl.metadata.deletion_timestamp, cl.status))
        );
    }
    Ok(())
}

/// GET `url` (the controller's admin port): its HTTP status and body.
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    let response = reqwest::get(url)
        .await
        .with_context(|| format!("GET {url}"))?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// The value of the sample `name{labels}` in a Prometheus exposition `text` (labels as written
/// by the exposition, `""` for none).
pub fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' ')?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, deleting: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-2", "labels": labels},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a pod");
        if deleting {
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
            );
        }
        p
    }

    /// A drain pod has the name of the set's pod and is Running and Ready too: waiting for the
    /// set's pods to come back must not take it (or one being deleted) for the set's pod; a
    /// set's pod that carries the drain label is still the set's.
    #[test]
    fn a_drain_pod_of_the_name_is_not_the_sets_pod_serving() {
        let stateful = json!({REVISION_LABEL: "web-6d4f", "apps.kubernetes.io/pod-index": "2"});
        assert!(serving(&pod(stateful.clone(), false)));
        assert!(!serving(&pod(stateful, true)));
        assert!(!serving(&pod(json!({DRAIN_POD_LABEL: "web"}), false)));
        let labelled = json!({REVISION_LABEL: "web-6d4f", DRAIN_POD_LABEL: "web"});
        assert!(serving(&pod(labelled, false)));
    }
}
