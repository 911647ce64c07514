//! The drained ordinal's peers: the StatefulSet's live members and the addresses of the Ready ones.
//!
//! Discovery reads the StatefulSet *live* (its current `spec.replicas` and `spec.ordinals.start`,
//! not the `DRAIN_REPLICAS` snapshot taken when the drain pod was made) and lists its pods by the
//! set's selector. [`select`] turns those two objects into a [`PeerSet`] without I/O; the
//! [`PeerSource`] trait is the seam the rest of the drainer uses, so tests can hand it a fixed
//! [`StaticPeers`] instead of a cluster.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};

use drain_api::names::{OrdinalRange, parse_pod_name, reserved_ordinals};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use tokio::sync::OnceCell;
use url::Url;

use crate::placement;

/// One Ready peer the drainer can send data to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The peer's ordinal in the StatefulSet.
    pub ordinal: i32,
    /// The peer pod's name (`<set>-<ordinal>`).
    pub name: String,
    /// Base URL of the peer's service, such as `http://10.0.0.7:8080/`.
    pub url: Url,
    /// The peer pod's UID as read from the API, which a handover asks the peer to confirm.
    pub uid: Option<String>,
}

impl Peer {
    /// A peer at `url` (its UID unknown).
    pub fn new(ordinal: i32, name: impl Into<String>, url: Url) -> Self {
        Self {
            ordinal,
            name: name.into(),
            url,
            uid: None,
        }
    }

    /// The same peer, with the UID its pod has in the API.
    pub fn with_uid(mut self, uid: Option<String>) -> Self {
        self.uid = uid;
        self
    }

    /// The base URL without a trailing `/` (`http://10.0.0.7:8080`), for `DRAIN_PEERS`.
    pub fn base_url(&self) -> String {
        self.url.as_str().trim_end_matches('/').to_owned()
    }
}

/// Who may receive the drained ordinal's data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerSet {
    /// Ordinals of the set's live range `[start, start + replicas)` except the drained one,
    /// sorted: the owners that [`placement`] chooses among, whether Ready or not, so data lands
    /// where clients of the shrunken set look for it.
    pub members: Vec<i32>,
    /// The members that are Ready, have an address and are not being deleted, by ordinal.
    pub ready: BTreeMap<i32, Peer>,
    /// Whether the drained ordinal itself is in the live range (the set was scaled back up; for
    /// [`rebalance`](crate::rebalance), whose "drained" ordinal is the pod itself: whether it
    /// is still a member).
    pub drained_in_range: bool,
}

impl PeerSet {
    /// A set whose members are exactly `peers`, all Ready.
    pub fn all_ready(peers: impl IntoIterator<Item = Peer>) -> Self {
        let ready: BTreeMap<i32, Peer> = peers.into_iter().map(|p| (p.ordinal, p)).collect();
        Self {
            members: ready.keys().copied().collect(),
            drained_in_range: false,
            ready,
        }
    }

    /// The member that owns `key` (by [`placement::owner`] over [`members`](Self::members)),
    /// or `None` if there are no members.
    pub fn owner(&self, key: &str) -> Option<i32> {
        placement::try_owner(key, &self.members)
    }

    /// The Ready peer with `ordinal`, if it is one.
    pub fn ready_peer(&self, ordinal: i32) -> Option<&Peer> {
        self.ready.get(&ordinal)
    }

    /// Members that are not Ready.
    pub fn not_ready(&self) -> Vec<i32> {
        self.members
            .iter()
            .copied()
            .filter(|o| !self.ready.contains_key(o))
            .collect()
    }
}

/// Errors finding peers.
#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    /// The Kubernetes client could not be configured (not in a cluster, no kubeconfig).
    #[error("failed to configure the kubernetes client")]
    Client(#[source] kube::Error),
    /// Reading the StatefulSet failed.
    #[error("failed to get statefulset {statefulset}")]
    GetStatefulSet {
        /// The set, as `namespace/name`.
        statefulset: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The set read cannot be understood (its spec, or an Advanced StatefulSet's
    /// `reserveOrdinals`).
    #[error("statefulset {statefulset} cannot be read: {reason}")]
    UnreadableSet {
        /// The set, as `namespace/name`.
        statefulset: String,
        /// What is wrong.
        reason: String,
    },
    /// Listing the set's pods failed.
    #[error("failed to list pods of statefulset {statefulset} with selector {selector:?}")]
    ListPods {
        /// The set, as `namespace/name`.
        statefulset: String,
        /// The label selector used.
        selector: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The set's selector cannot be written as a label selector string.
    #[error("statefulset {name} has an unusable selector: {reason}")]
    InvalidSelector {
        /// Name of the set.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A peer's address does not make a valid URL.
    #[error("peer {pod} has an unusable address {address:?}")]
    InvalidAddress {
        /// The peer pod.
        pod: String,
        /// The address text.
        address: String,
        /// The cause.
        #[source]
        source: url::ParseError,
    },
    /// Discovery is not possible here.
    #[error("peer discovery unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl PeersError {
    /// Whether trying again later may succeed (API server unreachable or overloaded), as
    /// opposed to a problem that needs a change (RBAC, a deleted set, no cluster at all).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::GetStatefulSet { source, .. } | Self::ListPods { source, .. } => {
                kube_error_is_transient(source)
            }
            Self::Client(_)
            | Self::UnreadableSet { .. }
            | Self::InvalidSelector { .. }
            | Self::InvalidAddress { .. }
            | Self::Unavailable { .. } => false,
        }
    }

    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Client(_) => "KubeClient",
            Self::GetStatefulSet { .. } => "GetStatefulSet",
            Self::ListPods { .. } => "ListPods",
            Self::UnreadableSet { .. } => "UnreadableSet",
            Self::InvalidSelector { .. } => "InvalidSelector",
            Self::InvalidAddress { .. } => "InvalidAddress",
            Self::Unavailable { .. } => "Unavailable",
        }
    }
}

fn kube_error_is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        _ => true,
    }
}

/// Where peers come from: the seam between the drainer and the cluster.
pub trait PeerSource {
    /// The current peers. Called at the start and again whenever peers may have changed.
    fn discover(&self) -> impl Future<Output = Result<PeerSet, PeersError>> + Send;
}

/// A fixed peer set (tests, or callers that know their peers).
#[derive(Clone, Debug, Default)]
pub struct StaticPeers(pub PeerSet);

impl PeerSource for StaticPeers {
    async fn discover(&self) -> Result<PeerSet, PeersError> {
        Ok(self.0.clone())
    }
}

/// No discovery possible (`--no-peers`, or no Kubernetes API): every call fails with `reason`.
#[derive(Clone, Debug)]
pub struct Unavailable {
    /// Why there are no peers.
    pub reason: String,
}

impl PeerSource for Unavailable {
    async fn discover(&self) -> Result<PeerSet, PeersError> {
        Err(PeersError::Unavailable {
            reason: self.reason.clone(),
        })
    }
}

/// How a peer's base URL is formed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// `http://<podIP>:<port>`.
    PodIp {
        /// The peers' service port.
        port: u16,
    },
    /// `http://<pod name>.<suffix>:<port>`, such as `http://datastore-0.datastore.ns.svc:8080`.
    Dns {
        /// Domain under which pods have names (usually `<headless service>.<namespace>.svc`).
        suffix: String,
        /// The peers' service port.
        port: u16,
    },
}

/// Which StatefulSet, which ordinal is drained, and how to address peers.
#[derive(Clone, Debug)]
pub struct Target {
    /// Namespace of the set.
    pub namespace: String,
    /// Name of the set.
    pub statefulset: String,
    /// The drained ordinal, never a peer.
    pub drained_ordinal: i32,
    /// The set's `apiVersion` (`apps/v1`, or OpenKruise's `apps.kruise.io/v1beta1`).
    pub api_version: String,
    /// How peers are addressed.
    pub addressing: Addressing,
}

/// Peers from the Kubernetes API, with kube's standard configuration (in-cluster service
/// account, or kubeconfig). The client is made on first use, so a drain that needs no peers
/// never needs an API server.
pub struct KubePeers {
    target: Target,
    client: OnceCell<kube::Client>,
}

impl std::fmt::Debug for KubePeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePeers")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl KubePeers {
    /// Discovery for `target`.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            client: OnceCell::new(),
        }
    }

    /// Discovery for `target` with a ready-made client.
    pub fn with_client(target: Target, client: kube::Client) -> Self {
        Self {
            target,
            client: OnceCell::new_with(Some(client)),
        }
    }

    async fn client(&self) -> Result<kube::Client, PeersError> {
        self.client
            .get_or_try_init(|| async { kube::Client::try_default().await })
            .await
            .cloned()
            .map_err(PeersError::Client)
    }
}

impl PeerSource for KubePeers {
    async fn discover(&self) -> Result<PeerSet, PeersError> {
        let client = self.client().await?;
        let Target {
            namespace,
            statefulset: name,
            ..
        } = &self.target;
        let (set, range) = get_set(&client, namespace, name, &self.target.api_version).await?;
        let selector = selector_string(name, set_selector(&set))?;
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let pods = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| PeersError::ListPods {
                statefulset: format!("{namespace}/{name}"),
                selector: selector.clone(),
                source,
            })?;
        select(&range, &pods.items, &self.target)
    }
}

/// The `apiVersion` of a built-in StatefulSet.
pub const STATEFULSET_API_VERSION: &str = "apps/v1";

/// Reads the set `name` live, of the kind `api_version` names (a built-in StatefulSet, or an
/// OpenKruise Advanced StatefulSet): as a built-in StatefulSet (the spec fields both kinds
/// share, with the same names) and the ordinals it runs (skipping an Advanced StatefulSet's
/// `spec.reserveOrdinals`).
pub async fn get_set(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    api_version: &str,
) -> Result<(StatefulSet, OrdinalRange), PeersError> {
    let statefulset = format!("{namespace}/{name}");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, "StatefulSet");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "statefulsets");
    let obj = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .get(name)
        .await
        .map_err(|source| PeersError::GetStatefulSet {
            statefulset: statefulset.clone(),
            source,
        })?;
    live_set(obj).map_err(|reason| PeersError::UnreadableSet {
        statefulset,
        reason,
    })
}

/// A set read as a [`DynamicObject`] → the built-in view and its ordinals.
pub fn live_set(obj: DynamicObject) -> Result<(StatefulSet, OrdinalRange), String> {
    let spec = obj.data.get("spec").cloned();
    let reserved = match spec.as_ref().and_then(|s| s.get("reserveOrdinals")) {
        None | Some(serde_json::Value::Null) => Default::default(),
        Some(serde_json::Value::Array(entries)) => {
            reserved_ordinals(entries).map_err(|e| e.to_string())?
        }
        Some(other) => return Err(format!("reserveOrdinals is not a list: {other}")),
    };
    let set: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": obj.metadata,
        "spec": spec,
    }))
    .map_err(|e| e.to_string())?;
    let spec = set.spec.as_ref();
    let range = OrdinalRange::new(
        spec.and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start),
        spec.and_then(|s| s.replicas),
    )
    .with_reserved(reserved);
    Ok((set, range))
}

fn set_selector(set: &StatefulSet) -> Option<&LabelSelector> {
    set.spec.as_ref().map(|spec| &spec.selector)
}

/// The label selector string (`a=b,c in (d,e),!f`) of `selector`, the selector of set `name`.
pub fn selector_string(name: &str, selector: Option<&LabelSelector>) -> Result<String, PeersError> {
    let invalid = |reason: String| PeersError::InvalidSelector {
        name: name.to_owned(),
        reason,
    };
    let mut parts = Vec::new();
    if let Some(selector) = selector {
        for (key, value) in selector.match_labels.iter().flatten() {
            parts.push(format!("{key}={value}"));
        }
        for req in selector.match_expressions.iter().flatten() {
            let values = req.values.as_deref().unwrap_or_default();
            let list = || format!("({})", values.join(","));
            parts.push(match req.operator.as_str() {
                "In" if !values.is_empty() => format!("{} in {}", req.key, list()),
                "NotIn" if !values.is_empty() => format!("{} notin {}", req.key, list()),
                "Exists" => req.key.clone(),
                "DoesNotExist" => format!("!{}", req.key),
                op => return Err(invalid(format!("operator {op:?} on {:?}", req.key))),
            });
        }
    }
    if parts.is_empty() {
        return Err(invalid("empty selector".to_owned()));
    }
    Ok(parts.join(","))
}

/// The peer set of `target` given the live set, the ordinals it runs and the pods matching its
/// selector.
pub fn select(range: &OrdinalRange, pods: &[Pod], target: &Target) -> Result<PeerSet, PeersError> {
    let members: Vec<i32> = range
        .iter()
        .filter(|&o| o != target.drained_ordinal)
        .collect();

    let mut ready = BTreeMap::new();
    for pod in pods {
        let Some(name) = pod.metadata.name.as_deref() else {
            continue;
        };
        let Some(ordinal) = parse_pod_name(name, &target.statefulset) else {
            continue;
        };
        if ordinal == target.drained_ordinal
            || !range.contains(ordinal)
            || pod.metadata.deletion_timestamp.is_some()
            || !is_ready(pod)
        {
            continue;
        }
        let address = match &target.addressing {
            Addressing::PodIp { port } => {
                let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
                    continue;
                };
                match ip.parse::<IpAddr>() {
                    Ok(ip) => format!("http://{}/", SocketAddr::new(ip, *port)),
                    Err(_) => format!("http://{ip}:{port}/"),
                }
            }
            Addressing::Dns { suffix, port } => {
                format!("http://{name}.{}:{port}/", suffix.trim_matches('.'))
            }
        };
        let url = Url::parse(&address).map_err(|source| PeersError::InvalidAddress {
            pod: name.to_owned(),
            address: address.clone(),
            source,
        })?;
        ready.insert(
            ordinal,
            Peer::new(ordinal, name, url).with_uid(pod.metadata.uid.clone()),
        );
    }
    Ok(PeerSet {
        members,
        ready,
        drained_in_range: range.contains(target.drained_ordinal),
    })
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time};

    fn range(replicas: Option<i32>, start: Option<i32>) -> OrdinalRange {
        OrdinalRange::new(start, replicas)
    }

    /// A fixture pod, Ready with an IP unless changed.
    struct PodBuilder(Pod);

    impl PodBuilder {
        fn new(name: &str, ip: &str) -> Self {
            let mut pod = Pod::default();
            pod.metadata.name = Some(name.to_owned());
            pod.status = Some(PodStatus {
                pod_ip: Some(ip.to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: "True".to_owned(),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            Self(pod)
        }
        fn not_ready(mut self) -> Self {
            let status = self.0.status.as_mut().unwrap();
            status.conditions.as_mut().unwrap()[0].status = "False".to_owned();
            self
        }
        fn no_ip(mut self) -> Self {
            self.0.status.as_mut().unwrap().pod_ip = None;
            self
        }
        fn deleting(mut self) -> Self {
            self.0.metadata.deletion_timestamp = Some(Time(Default::default()));
            self
        }
        fn build(self) -> Pod {
            self.0
        }
    }

    fn target(drained: i32) -> Target {
        Target {
            namespace: "ns".to_owned(),
            statefulset: "web".to_owned(),
            drained_ordinal: drained,
            api_version: STATEFULSET_API_VERSION.to_owned(),
            addressing: Addressing::PodIp { port: 8080 },
        }
    }

    #[test]
    fn reserved_ordinals_of_an_advanced_statefulset_are_not_members() {
        // Ordinal 1 reserved out of 0..2 (replicas 2): 0 and 2 run; 1 is drained.
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "replicas": 2,
                "reserveOrdinals": [1],
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}},
                "scaleStrategy": {"maxUnavailable": 1},
            },
        }))
        .unwrap();
        let (set, range) = live_set(obj).unwrap();
        assert_eq!(
            selector_string("web", set_selector(&set)).unwrap(),
            "app=web"
        );
        let pods = [
            PodBuilder::new("web-0", "10.0.0.1").build(),
            PodBuilder::new("web-1", "10.0.0.2").build(),
            PodBuilder::new("web-2", "10.0.0.3").build(),
        ];
        let peers = select(&range, &pods, &target(1)).unwrap();
        assert_eq!(peers.members, [0, 2]);
        assert_eq!(ready_ordinals(&peers), [0, 2]);
        assert!(!peers.drained_in_range);
        // Another drained pod's view: ordinal 1 is never a peer while reserved.
        let peers = select(&range, &pods, &target(3)).unwrap();
        assert_eq!(peers.members, [0, 2]);
    }

    #[test]
    fn an_unreadable_reserve_ordinals_is_an_error() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "StatefulSet",
            "metadata": {"name": "web"},
            "spec": {"replicas": 2, "reserveOrdinals": ["x"],
                     "selector": {}, "template": {}},
        }))
        .unwrap();
        assert!(live_set(obj).is_err());
    }

    fn ready_ordinals(peers: &PeerSet) -> Vec<i32> {
        peers.ready.keys().copied().collect()
    }

    #[test]
    fn keeps_ready_in_range_members_with_addresses() {
        let pods = [
            PodBuilder::new("web-0", "10.0.0.1").build(),
            PodBuilder::new("web-1", "10.0.0.2").not_ready().build(),
            PodBuilder::new("web-2", "10.0.0.3").no_ip().build(),
            PodBuilder::new("web-3", "10.0.0.4").deleting().build(),
            PodBuilder::new("web-4", "10.0.0.5").build(),
            // Out of range (replicas 5 → 0..5) and foreign names.
            PodBuilder::new("web-5", "10.0.0.6").build(),
            PodBuilder::new("web-01", "10.0.0.7").build(),
            PodBuilder::new("webby-0", "10.0.0.8").build(),
            PodBuilder::new("web-x", "10.0.0.9").build(),
        ];
        let peers = select(&range(Some(6), None), &pods, &target(5)).unwrap();
        assert_eq!(peers.members, [0, 1, 2, 3, 4]);
        assert_eq!(ready_ordinals(&peers), [0, 4]);
        assert_eq!(peers.not_ready(), [1, 2, 3]);
        let peer = peers.ready_peer(0).unwrap();
        assert_eq!(peer.name, "web-0");
        assert_eq!(peer.url.as_str(), "http://10.0.0.1:8080/");
        assert_eq!(peer.base_url(), "http://10.0.0.1:8080");
    }

    #[test]
    fn never_the_drained_ordinal_and_uses_live_replicas() {
        // The drain pod has the drained pod's name; it must not be a peer even if Ready.
        let pods = [
            PodBuilder::new("web-0", "10.0.0.1").build(),
            PodBuilder::new("web-1", "10.0.0.2").build(),
            PodBuilder::new("web-2", "10.0.0.3").build(),
        ];
        let peers = select(&range(Some(2), None), &pods, &target(1)).unwrap();
        assert_eq!(peers.members, [0]);
        assert_eq!(ready_ordinals(&peers), [0]);
    }

    #[test]
    fn honours_ordinals_start() {
        let pods = [
            PodBuilder::new("web-0", "10.0.0.1").build(),
            PodBuilder::new("web-3", "10.0.0.3").build(),
            PodBuilder::new("web-4", "10.0.0.4").build(),
        ];
        let peers = select(&range(Some(2), Some(3)), &pods, &target(5)).unwrap();
        assert_eq!(peers.members, [3, 4]);
        assert_eq!(ready_ordinals(&peers), [3, 4]);
    }

    #[test]
    fn scaled_to_zero_has_no_members() {
        let pods = [PodBuilder::new("web-0", "10.0.0.1").build()];
        let peers = select(&range(Some(0), None), &pods, &target(0)).unwrap();
        assert!(peers.members.is_empty());
        assert!(peers.ready.is_empty());
        assert_eq!(peers.owner("k"), None);
    }

    #[test]
    fn dns_addressing_and_ipv6() {
        let pods = [
            PodBuilder::new("web-0", "fd00::1").build(),
            PodBuilder::new("web-1", "10.0.0.2").no_ip().build(),
        ];
        let mut t = target(2);
        let peers = select(&range(Some(2), None), &pods, &t).unwrap();
        assert_eq!(peers.ready[&0].base_url(), "http://[fd00::1]:8080");
        t.addressing = Addressing::Dns {
            suffix: "web.ns.svc".to_owned(),
            port: 9000,
        };
        let peers = select(&range(Some(2), None), &pods, &t).unwrap();
        assert_eq!(peers.ready[&0].base_url(), "http://web-0.web.ns.svc:9000");
        assert_eq!(peers.ready[&1].base_url(), "http://web-1.web.ns.svc:9000");
    }

    #[test]
    fn selector_strings() {
        let selector = LabelSelector {
            match_labels: Some(
                [
                    ("app".to_owned(), "web".to_owned()),
                    ("tier".to_owned(), "db".to_owned()),
                ]
                .into(),
            ),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "zone".to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec!["a".to_owned(), "b".to_owned()]),
                },
                LabelSelectorRequirement {
                    key: "canary".to_owned(),
                    operator: "DoesNotExist".to_owned(),
                    values: None,
                },
                LabelSelectorRequirement {
                    key: "env".to_owned(),
                    operator: "NotIn".to_owned(),
                    values: Some(vec!["dev".to_owned()]),
                },
                LabelSelectorRequirement {
                    key: "owner".to_owned(),
                    operator: "Exists".to_owned(),
                    values: None,
                },
            ]),
        };
        assert_eq!(
            selector_string("web", Some(&selector)).unwrap(),
            "app=web,tier=db,zone in (a,b),!canary,env notin (dev),owner"
        );
        assert!(matches!(
            selector_string("web", Some(&LabelSelector::default())),
            Err(PeersError::InvalidSelector { .. })
        ));
        assert!(selector_string("web", None).is_err());
    }

    #[test]
    fn all_ready_sets_members_and_owner() {
        let url = Url::parse("http://127.0.0.1:1/").unwrap();
        let peers = PeerSet::all_ready([
            Peer::new(2, "web-2", url.clone()),
            Peer::new(0, "web-0", url),
        ]);
        assert_eq!(peers.members, [0, 2]);
        assert_eq!(
            peers.owner("key-0"),
            Some(placement::owner("key-0", &[0, 2]))
        );
    }
}
