//! The kinds of set the controller serves, each through a small adapter ([`ServedSet`]): the
//! built-in `apps/v1` StatefulSet, and OpenKruise's Advanced StatefulSet
//! (`apps.kruise.io/v1beta1`, kind `StatefulSet`). The rest of the controller sees one shape: a
//! set as a built-in [`StatefulSet`] (the fields both kinds share, with the same names and
//! meaning), plus what differs by kind: which ordinals it runs ([`OrdinalRange`] with reserved
//! ordinals) and the default drain concurrency.
//!
//! Membership of an Advanced StatefulSet: counting up from `spec.ordinals.start`, the first
//! `spec.replicas` ordinals not in `spec.reserveOrdinals` (Kruise's
//! `pkg/controller/statefulset/stateful_set_utils.go`, v1.8.0; see the README's Kruise section).

use std::borrow::Cow;
use std::collections::BTreeSet;

use drain_api::annotations;
use drain_api::names::{BadReservedOrdinal, OrdinalRange, reserved_ordinals};
use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetOrdinals, StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Which kind a set is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// OpenKruise Advanced StatefulSet, `apps.kruise.io/v1beta1`.
    Advanced,
}

impl SetKind {
    /// The API group.
    pub fn group(self) -> &'static str {
        match self {
            Self::StatefulSet => "apps",
            Self::Advanced => ADVANCED_GROUP,
        }
    }

    /// The `apiVersion` of owner references and Events.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::StatefulSet => "apps/v1",
            Self::Advanced => ADVANCED_API_VERSION,
        }
    }

    /// The kind of an owner reference with this `apiVersion`, if served. Any version of the
    /// Kruise group counts (its v1alpha1 and v1beta1 objects are the same sets).
    pub fn of_api_version(api_version: &str) -> Option<Self> {
        match api_version.split_once('/') {
            Some(("apps", "v1")) => Some(Self::StatefulSet),
            Some((ADVANCED_GROUP, _)) => Some(Self::Advanced),
            _ => None,
        }
    }

    /// For logs: `statefulset` or `advanced statefulset`.
    pub fn label(self) -> &'static str {
        match self {
            Self::StatefulSet => "statefulset",
            Self::Advanced => "advanced statefulset",
        }
    }
}

/// OpenKruise's API group.
pub const ADVANCED_GROUP: &str = "apps.kruise.io";
/// The Advanced StatefulSet version served.
pub const ADVANCED_API_VERSION: &str = "apps.kruise.io/v1beta1";

/// What the controller needs of a kind of set.
pub trait ServedSet:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The kind.
    const KIND: SetKind;

    /// The set as a built-in StatefulSet: its metadata, the spec fields both kinds share, and
    /// its update revision.
    fn to_statefulset(&self) -> StatefulSet;

    /// `spec.replicas`, `spec.ordinals.start` and the ordinals skipped.
    fn ordinals(&self) -> Result<OrdinalRange, BadReservedOrdinal>;

    /// The drain concurrency when the set does not say (`None`: the policy's default).
    fn default_max_concurrent(&self) -> Option<u32>;

    /// Ordinals the set may run although they are outside [`ordinals`](Self::ordinals): Kruise
    /// honours `spec.ordinals.start` only with its alpha feature gate `StatefulSetStartOrdinal`
    /// (off by default), which nothing in the API shows. An Advanced StatefulSet with a start
    /// other than 0 may therefore run the ordinals counted from 0; they are never drained.
    fn start_fallback(&self) -> Option<OrdinalRange> {
        None
    }

    /// The names of its claim templates.
    fn claim_templates(&self) -> Vec<String>;

    /// Drops from a cached set what reconciling does not need.
    fn slim(&mut self);
}

fn range_of(spec: Option<&StatefulSetSpec>) -> OrdinalRange {
    OrdinalRange::new(
        spec.and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start),
        spec.and_then(|s| s.replicas),
    )
}

fn templates_of(spec: Option<&StatefulSetSpec>) -> Vec<String> {
    spec.and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| t.metadata.name.clone())
        .collect()
}

/// Whether a set asks for drains.
pub fn opted_in(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::DRAINER_POD_TEMPLATE))
}

/// Whether a set is this controller's business: it opted in, it has drains in flight, or it
/// still carries a status this controller wrote (one more reconcile clears it). Any other set
/// is never reconciled: not on its own changes, not when a replica becomes the leader (which
/// reconciles every cached set), so it costs no metric series and no periodic requeue.
pub fn concerns_us(meta: &ObjectMeta, drains_in_flight: bool) -> bool {
    opted_in(meta)
        || drains_in_flight
        || meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::STATUS))
}

/// Keeps only what reconciling needs of a set's metadata (everything of an opted-in set but its
/// managed fields and last-applied copy; of the others, identity and our status) and says
/// whether it opted in.
fn slim_meta(meta: &mut ObjectMeta) -> bool {
    meta.managed_fields = None;
    if opted_in(meta) {
        if let Some(a) = meta.annotations.as_mut() {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
        return true;
    }
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k == annotations::STATUS);
    }
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    false
}

/// A built-in StatefulSet as the controller caches it: slimmed as it is decoded
/// ([`slim_meta`]), an opted-in set's spec kept whole, any other set's as its [`Outline`]. Every
/// set of the cluster is cached, and a `StatefulSet` value is about 3 KiB before its strings
/// (mostly the pod template's empty fields): 5,000 sets kept whole cost ~20 MiB.
#[derive(Clone, Debug)]
pub struct CachedStatefulSet {
    /// Standard metadata, slimmed.
    pub metadata: ObjectMeta,
    spec: Kept,
    /// `status.updateRevision`: the ControllerRevision that controls its drain pods.
    revision: Option<String>,
}

#[derive(Clone, Debug)]
enum Kept {
    Whole(Box<StatefulSetSpec>),
    Outline(Outline),
}

/// What finishing a drain in flight needs of a set that did not opt in.
#[derive(Clone, Debug)]
struct Outline {
    replicas: Option<i32>,
    ordinals: Option<StatefulSetOrdinals>,
    claim_templates: Vec<String>,
}

impl Outline {
    fn of(spec: &StatefulSetSpec) -> Self {
        Self {
            replicas: spec.replicas,
            ordinals: spec.ordinals.clone(),
            claim_templates: templates_of(Some(spec)),
        }
    }

    /// The outline as a spec: the fields it holds, the claim templates by name only.
    fn spec(&self) -> StatefulSetSpec {
        let templates = (self.claim_templates.iter())
            .map(|name| PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                ..PersistentVolumeClaim::default()
            })
            .collect();
        StatefulSetSpec {
            replicas: self.replicas,
            ordinals: self.ordinals.clone(),
            volume_claim_templates: Some(templates),
            ..StatefulSetSpec::default()
        }
    }
}

impl From<StatefulSet> for CachedStatefulSet {
    fn from(set: StatefulSet) -> Self {
        let StatefulSet {
            mut metadata,
            spec,
            status,
        } = set;
        let revision = status.and_then(|s| s.update_revision);
        let spec = spec.unwrap_or_default();
        let spec = if slim_meta(&mut metadata) {
            Kept::Whole(Box::new(spec))
        } else {
            Kept::Outline(Outline::of(&spec))
        };
        Self {
            metadata,
            spec,
            revision,
        }
    }
}

impl<'de> Deserialize<'de> for CachedStatefulSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StatefulSet::deserialize(d).map(Self::from)
    }
}

impl Resource for CachedStatefulSet {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <StatefulSet as k8s_openapi::Resource>::KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        <StatefulSet as k8s_openapi::Resource>::GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        <StatefulSet as k8s_openapi::Resource>::VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <StatefulSet as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ServedSet for CachedStatefulSet {
    const KIND: SetKind = SetKind::StatefulSet;

    fn to_statefulset(&self) -> StatefulSet {
        let spec = match &self.spec {
            Kept::Whole(spec) => StatefulSetSpec::clone(spec),
            Kept::Outline(o) => o.spec(),
        };
        StatefulSet {
            metadata: self.metadata.clone(),
            spec: Some(spec),
            status: revision_status(self.revision.as_ref()),
        }
    }

    fn ordinals(&self) -> Result<OrdinalRange, BadReservedOrdinal> {
        Ok(match &self.spec {
            Kept::Whole(spec) => range_of(Some(spec)),
            Kept::Outline(o) => {
                OrdinalRange::new(o.ordinals.as_ref().and_then(|o| o.start), o.replicas)
            }
        })
    }

    fn default_max_concurrent(&self) -> Option<u32> {
        None
    }

    fn claim_templates(&self) -> Vec<String> {
        match &self.spec {
            Kept::Whole(spec) => templates_of(Some(spec)),
            Kept::Outline(o) => o.claim_templates.clone(),
        }
    }

    fn slim(&mut self) {
        // Slimmed as it is decoded.
    }
}

/// An OpenKruise Advanced StatefulSet (`apps.kruise.io/v1beta1`), as far as draining goes: the
/// fields it shares with a built-in StatefulSet, and the ones that change which ordinals it runs
/// and how many may go at once. Unknown fields are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct AdvancedStatefulSet {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The spec.
    #[serde(default)]
    pub spec: Option<AdvancedSpec>,
    /// The status, of which only the update revision is kept.
    #[serde(default)]
    pub status: Option<AdvancedStatus>,
}

/// The status of an [`AdvancedStatefulSet`]: what the controller reads of it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedStatus {
    /// The ControllerRevision of the set's newest pod template.
    #[serde(default)]
    pub update_revision: Option<String>,
}

/// A set's status as [`ServedSet::to_statefulset`] gives it: the update revision alone.
fn revision_status(revision: Option<&String>) -> Option<StatefulSetStatus> {
    revision.map(|r| StatefulSetStatus {
        update_revision: Some(r.clone()),
        ..StatefulSetStatus::default()
    })
}

/// The spec of an [`AdvancedStatefulSet`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedSpec {
    /// The fields shared with the built-in StatefulSet (replicas, selector, template, claim
    /// templates, service name, pod management policy, ordinals, claim retention policy).
    #[serde(flatten)]
    pub base: StatefulSetSpec,
    /// Ordinals the set skips: integers, or strings holding a range `"a-b"`.
    #[serde(default)]
    pub reserve_ordinals: Option<Vec<serde_json::Value>>,
    /// How it scales.
    #[serde(default)]
    pub scale_strategy: Option<ScaleStrategy>,
}

/// `spec.scaleStrategy` of an [`AdvancedStatefulSet`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleStrategy {
    /// Most pods unavailable at once while scaling: a number or a percentage of replicas.
    #[serde(default)]
    pub max_unavailable: Option<IntOrString>,
}

impl Resource for AdvancedStatefulSet {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "StatefulSet".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        ADVANCED_GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "statefulsets".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `maxUnavailable` as a count of `replicas` (a percentage rounds down, as Kruise scales it),
/// at least 1.
fn scaled(value: &IntOrString, replicas: i32) -> Option<u32> {
    let n = match value {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(s) => {
            let pct: i64 = s.trim().strip_suffix('%')?.trim().parse().ok()?;
            pct * i64::from(replicas.max(0)) / 100
        }
    };
    Some(u32::try_from(n.max(1)).unwrap_or(u32::MAX))
}

impl ServedSet for AdvancedStatefulSet {
    const KIND: SetKind = SetKind::Advanced;

    fn to_statefulset(&self) -> StatefulSet {
        StatefulSet {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(|s| s.base.clone()),
            status: revision_status(
                (self.status.as_ref()).and_then(|s| s.update_revision.as_ref()),
            ),
        }
    }

    fn ordinals(&self) -> Result<OrdinalRange, BadReservedOrdinal> {
        let spec = self.spec.as_ref();
        let reserved = match spec.and_then(|s| s.reserve_ordinals.as_deref()) {
            Some(entries) => reserved_ordinals(entries)?,
            None => BTreeSet::new(),
        };
        Ok(range_of(spec.map(|s| &s.base)).with_reserved(reserved))
    }

    fn start_fallback(&self) -> Option<OrdinalRange> {
        let range = self.ordinals().ok()?;
        (range.start != 0)
            .then(|| OrdinalRange::new(Some(0), Some(range.replicas)).with_reserved(range.reserved))
    }

    fn default_max_concurrent(&self) -> Option<u32> {
        let spec = self.spec.as_ref()?;
        let max = spec.scale_strategy.as_ref()?.max_unavailable.as_ref()?;
        scaled(max, spec.base.replicas.unwrap_or(1))
    }

    fn claim_templates(&self) -> Vec<String> {
        templates_of(self.spec.as_ref().map(|s| &s.base))
    }

    fn slim(&mut self) {
        if !slim_meta(&mut self.metadata)
            && let Some(spec) = self.spec.as_mut()
        {
            spec.base = Outline::of(&spec.base).spec();
            spec.scale_strategy = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case::plain(&[], false, false)]
    #[case::opted_in(&[annotations::DRAINER_POD_TEMPLATE], false, true)]
    #[case::opted_out_with_a_drain_in_flight(&[], true, true)]
    #[case::opted_out_with_a_status_left(&[annotations::STATUS], false, true)]
    #[case::other_annotations_only(&["example.com/owner"], false, false)]
    fn only_sets_that_opted_in_or_hold_something_of_ours_concern_us(
        #[case] keys: &[&str],
        #[case] in_flight: bool,
        #[case] want: bool,
    ) {
        let meta = ObjectMeta {
            annotations: Some(keys.iter().map(|k| (k.to_string(), "x".into())).collect()),
            ..ObjectMeta::default()
        };
        assert_eq!(concerns_us(&meta, in_flight), want);
    }

    fn advanced(spec: serde_json::Value) -> AdvancedStatefulSet {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u",
                         "annotations": {annotations::DRAINER_POD_TEMPLATE: "{}"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn base_spec() -> serde_json::Value {
        json!({
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "serviceName": "web",
            "podManagementPolicy": "Parallel",
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "i"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}}],
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"partition": 0, "podUpdatePolicy": "InPlaceIfPossible",
                                                 "maxUnavailable": "50%"}},
            "lifecycle": {"preDelete": {"labelsHandler": {"x": "y"}}},
        })
    }

    #[test]
    fn an_advanced_set_reads_as_a_statefulset_with_its_reserved_ordinals() {
        let mut spec = base_spec();
        spec["reserveOrdinals"] = json!([1, "4-5"]);
        spec["ordinals"] = json!({"start": 0});
        let set = advanced(spec);
        let sts = set.to_statefulset();
        let s = sts.spec.as_ref().unwrap();
        assert_eq!(s.replicas, Some(2));
        assert_eq!(s.service_name.as_deref(), Some("web"));
        assert_eq!(s.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(set.claim_templates(), ["data"]);
        assert_eq!(sts.metadata.name.as_deref(), Some("web"));
        let range = set.ordinals().unwrap();
        assert_eq!(range.iter().collect::<Vec<_>>(), [0, 2]);
        assert!(!range.contains(1));
    }

    #[test]
    fn a_start_other_than_0_also_holds_the_ordinals_kruise_runs_without_its_gate() {
        let mut spec = base_spec();
        spec["ordinals"] = json!({"start": 3});
        spec["reserveOrdinals"] = json!([1]);
        let set = advanced(spec);
        assert_eq!(set.ordinals().unwrap().iter().collect::<Vec<_>>(), [3, 4]);
        let fallback = set.start_fallback().unwrap();
        assert_eq!(fallback.iter().collect::<Vec<_>>(), [0, 2]);
        let mut spec = base_spec();
        spec["ordinals"] = json!({"start": 0});
        assert!(advanced(spec).start_fallback().is_none());
        assert!(
            CachedStatefulSet::from(StatefulSet::default())
                .start_fallback()
                .is_none()
        );
    }

    #[test]
    fn an_unreadable_reserve_ordinals_entry_is_an_error_not_an_empty_set() {
        let mut spec = base_spec();
        spec["reserveOrdinals"] = json!(["one"]);
        assert!(advanced(spec).ordinals().is_err());
    }

    #[rstest]
    #[case(None, 4, None)]
    #[case(Some(json!(2)), 4, Some(2))]
    #[case(Some(json!(0)), 4, Some(1))]
    #[case(Some(json!("50%")), 5, Some(2))]
    #[case(Some(json!("10%")), 3, Some(1))]
    #[case(Some(json!("lots")), 3, None)]
    fn max_unavailable_is_the_default_concurrency(
        #[case] max: Option<serde_json::Value>,
        #[case] replicas: i32,
        #[case] want: Option<u32>,
    ) {
        let mut spec = base_spec();
        spec["replicas"] = json!(replicas);
        if let Some(m) = max {
            spec["scaleStrategy"] = json!({"maxUnavailable": m});
        }
        assert_eq!(advanced(spec).default_max_concurrent(), want);
    }

    #[test]
    fn slimming_a_set_that_did_not_opt_in_keeps_what_finishing_a_drain_needs() {
        let mut spec = base_spec();
        spec["reserveOrdinals"] = json!([1]);
        let mut set = advanced(spec);
        set.metadata.annotations = Some(
            [(annotations::STATUS.to_owned(), "s".to_owned())]
                .into_iter()
                .collect(),
        );
        set.slim();
        assert_eq!(set.ordinals().unwrap().iter().collect::<Vec<_>>(), [0, 2]);
        assert_eq!(set.claim_templates(), ["data"]);
        assert!(set.spec.as_ref().unwrap().base.template.spec.is_none());
    }

    fn builtin(annotations: serde_json::Value) -> CachedStatefulSet {
        let mut spec = base_spec();
        spec["ordinals"] = json!({"start": 2});
        serde_json::from_value(json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u", "generation": 3,
                         "labels": {"app": "web"}, "annotations": annotations,
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": spec,
            "status": {"replicas": 2},
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_set_that_did_not_opt_in_keeps_its_outline_and_our_status_only() {
        let set = builtin(json!({annotations::STATUS: "s", "example.com/owner": "x"}));
        assert_eq!(set.ordinals().unwrap().iter().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(set.claim_templates(), ["data"]);
        let sts = set.to_statefulset();
        let spec = sts.spec.unwrap();
        assert_eq!((spec.replicas, spec.template.spec), (Some(2), None));
        assert_eq!(spec.service_name, None);
        let meta = &sts.metadata;
        assert_eq!((meta.uid.as_deref(), meta.generation), (Some("u"), Some(3)));
        assert_eq!(meta.labels, None);
        assert_eq!(meta.managed_fields, None);
        let kept: Vec<&String> = meta.annotations.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(kept, [annotations::STATUS]);
    }

    #[test]
    fn a_cached_set_that_opted_in_keeps_its_whole_spec() {
        let set = builtin(json!({annotations::DRAINER_POD_TEMPLATE: "{}"}));
        let sts = set.to_statefulset();
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.service_name.as_deref(), Some("web"));
        assert_eq!(spec.template.spec.as_ref().unwrap().containers[0].name, "c");
        assert_eq!(sts.metadata.labels.unwrap()["app"], "web");
        assert_eq!(sts.metadata.managed_fields, None);
        assert_eq!(set.ordinals().unwrap().iter().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(set.claim_templates(), ["data"]);
    }

    #[test]
    fn a_cached_set_reads_the_same_whether_it_opted_in_or_not() {
        let opted_in = builtin(json!({annotations::DRAINER_POD_TEMPLATE: "{}"}));
        let outline = builtin(json!({}));
        assert_eq!(opted_in.ordinals().unwrap(), outline.ordinals().unwrap());
        assert_eq!(opted_in.claim_templates(), outline.claim_templates());
        let (a, b) = (opted_in.to_statefulset(), outline.to_statefulset());
        let (a, b) = (a.spec.unwrap(), b.spec.unwrap());
        assert_eq!((a.replicas, a.ordinals), (b.replicas, b.ordinals));
    }

    #[rstest]
    #[case("apps/v1", Some(SetKind::StatefulSet))]
    #[case("apps.kruise.io/v1beta1", Some(SetKind::Advanced))]
    #[case("apps.kruise.io/v1alpha1", Some(SetKind::Advanced))]
    #[case("apps/v1beta1", None)]
    #[case("v1", None)]
    fn owner_api_versions(#[case] api_version: &str, #[case] want: Option<SetKind>) {
        assert_eq!(SetKind::of_api_version(api_version), want);
    }
}
