//! The other kind of set: the live check for a set of the other kind with the same name, telling
//! OpenKruise that a drain pod left a name free, and discovering Advanced StatefulSets.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use drain_api::{annotations, labels, names};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::api::gone_or_replaced;

use crate::identity::FIELD_MANAGER;
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::Metrics;
use crate::set_kind::ServedSet;
use crate::set_kind::{ADVANCED_API_VERSION, AdvancedStatefulSet, SetKind};

/// The API of the sets of the other kind than the one reconciled.
pub(super) enum Twin {
    /// Built-in StatefulSets.
    StatefulSets(Api<StatefulSet>),
    /// Advanced StatefulSets.
    Advanced(Api<AdvancedStatefulSet>),
}

impl Twin {
    /// Whether a set named `name` exists, read live.
    pub(super) async fn exists(&self, name: &str, metrics: &Metrics) -> Result<bool, kube::Error> {
        let found = match self {
            Self::StatefulSets(api) => api.get_metadata_opt(name).await.map(|m| m.is_some()),
            Self::Advanced(api) => api.get_metadata_opt(name).await.map(|m| m.is_some()),
        };
        metrics.request("get", "statefulsets", &found);
        found
    }
}

/// A drain pod of an Advanced StatefulSet that is gone (its watch saw it deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Released {
    pub(super) namespace: String,
    pub(super) set: String,
    pub(super) set_uid: String,
    pub(super) pod: String,
    pub(super) ordinal: i32,
}

impl Released {
    pub(super) fn of(pod: &Pod) -> Option<Self> {
        let set = pod.labels().get(labels::DRAIN_POD)?;
        let owner = pod.metadata.owner_references.iter().flatten().find(|o| {
            o.kind == "StatefulSet"
                && o.name == *set
                && SetKind::of_api_version(&o.api_version) == Some(SetKind::Advanced)
        })?;
        let name = pod.metadata.name.clone()?;
        Some(Self {
            namespace: pod.namespace()?,
            ordinal: names::parse_pod_name(&name, set)?,
            set: set.clone(),
            set_uid: owner.uid.clone(),
            pod: name,
        })
    }
}

/// When a drain pod of an Advanced StatefulSet is gone and the set wants its ordinal again (a
/// cancelled drain, an un-reserved ordinal), touches the set ([`annotations::RELEASED`]) so
/// Kruise creates its pod at once: Kruise reacts to changes of the pods it controls only, and
/// retries a create that found our pod in the way with a backoff of up to 1,000 s.
pub(super) async fn tell_kruise(
    (client, leadership, dry_run, metrics): (Client, Leadership, bool, Arc<Metrics>),
    advanced: Arc<OnceLock<Store<AdvancedStatefulSet>>>,
    mut released: mpsc::UnboundedReceiver<Released>,
) {
    while let Some(r) = released.recv().await {
        if leadership.fence().is_none() || dry_run {
            continue;
        }
        let Some(set) = advanced
            .get()
            .and_then(|s| s.get(&ObjectRef::new(&r.set).within(&r.namespace)))
        else {
            continue;
        };
        if set.metadata.uid.as_deref() != Some(r.set_uid.as_str())
            || !wants(set.as_ref(), r.ordinal)
        {
            continue;
        }
        let api: Api<AdvancedStatefulSet> = Api::namespaced(client.clone(), &r.namespace);
        let value = format!("{} {}", r.pod, Timestamp::now());
        let patch =
            json!({"metadata": {"uid": r.set_uid, "annotations": {annotations::RELEASED: value}}});
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let result = api.patch(&r.set, &pp, &Patch::Merge(patch)).await;
        metrics.request("patch", "statefulsets", &result);
        match result {
            Ok(_) => {
                info!(statefulset = %r.set, namespace = %r.namespace, pod = %r.pod, "drain pod gone; told Kruise the name is free")
            }
            Err(e) if gone_or_replaced(&e) => {}
            Err(e) => {
                warn!(statefulset = %r.set, namespace = %r.namespace, pod = %r.pod, error = %e, "failed to tell Kruise a drain pod is gone; it creates its pod at its next retry")
            }
        }
    }
}

/// Whether the API server serves Advanced StatefulSets (OpenKruise's CRD is installed).
pub(super) async fn advanced_served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(ADVANCED_API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "statefulsets")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until Advanced StatefulSets are served, asking the API server's discovery every
/// `every`; says once (at info) that they are not served yet.
pub(super) async fn wait_for_advanced(client: &Client, every: Duration) {
    let mut said = false;
    loop {
        match advanced_served(client).await {
            Ok(true) => {
                info!(
                    api_version = ADVANCED_API_VERSION,
                    "serving OpenKruise Advanced StatefulSets"
                );
                return;
            }
            Ok(false) if !said => {
                info!(
                    api_version = ADVANCED_API_VERSION,
                    every = %humantime::format_duration(every),
                    "OpenKruise Advanced StatefulSets are not served: the API is not installed; built-in StatefulSets are, and the API server is asked again periodically"
                );
                said = true;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "failed to ask the API server whether Advanced StatefulSets are served; asking again")
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Whether `set` may run a pod for `ordinal`: it is in the set's range, or in the range Kruise
/// runs if it ignores `spec.ordinals.start` ([`ServedSet::start_fallback`]), or the set's
/// membership cannot be read.
pub(super) fn wants<K: ServedSet>(set: &K, ordinal: i32) -> bool {
    let Ok(range) = set.ordinals() else {
        return true;
    };
    range.contains(ordinal) || set.start_fallback().is_some_and(|r| r.contains(ordinal))
}
