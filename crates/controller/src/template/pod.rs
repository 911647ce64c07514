//! A validated drain template → the drain pod of one ordinal (cannot fail).

use std::collections::BTreeMap;

use drain_api::completion::CompletionRecord;
use drain_api::{env, labels, pod_annotations};
use k8s_openapi::api::core::v1::{
    EnvVar, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimVolumeSource, Pod,
    PodSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use crate::claim_use::claims_used;

/// Restart policy of drain pods whose template sets none.
pub const DEFAULT_RESTART_POLICY: &str = "OnFailure";

/// The cluster autoscaler's annotation: a drain pod resumes elsewhere, so it does not hold its
/// node (set to `"true"` unless the template sets it).
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// A StatefulSet's drain template, validated against the set: building a drain pod from it
/// cannot fail.
///
/// It keeps what the pods need from the set (name, namespace, UID, service name, ordinals start,
/// claim template names) and the template's spec with the restart policy defaulted and, unless
/// the set opted out, the set's placement and identity fields inherited.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainTemplate {
    pub(super) set_name: String,
    pub(super) namespace: String,
    pub(super) set_uid: String,
    pub(super) service_name: Option<String>,
    pub(super) ordinals_start: i32,
    pub(super) claim_templates: Vec<String>,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) annotations: BTreeMap<String, String>,
    pub(super) spec: PodSpec,
    pub(super) template_hash: String,
    pub(super) owner_api_version: String,
    /// The [`pod_annotations::SETTINGS`] value of its pods.
    pub(super) settings: String,
}

/// What varies between the drain pods of one set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPodInput {
    /// The ordinal to drain.
    pub ordinal: i32,
    /// `spec.replicas` of the set now (given to the pod as an environment variable).
    pub replicas: i32,
    /// The ordinal's existing claims, by claim template name: `(claim name, claim UID)`. They
    /// are recorded on the pod so that only exactly these claims are deleted once it succeeds;
    /// each claim name should be [`DrainTemplate::claim_name`] of its template.
    pub claims: BTreeMap<String, (String, String)>,
    /// Nodes the pod must not run on (earlier drain pods of the ordinal were lost there): a
    /// `metadata.name NotIn` term added to every required node selector term.
    pub avoid_nodes: Vec<String>,
    /// The set's current ControllerRevision, `(name, UID)`, when it could be read: the pod's
    /// controller reference, so that `kubectl drain` evicts it like any managed pod and the
    /// garbage collector removes it with the set (and keeps it when the set is orphaned).
    pub revision: Option<(String, String)>,
}

/// The labels of a drain pod: the template's, then ours.
pub(super) fn drain_pod_labels(
    template_labels: &BTreeMap<String, String>,
    set_name: &str,
    ordinal: i32,
) -> BTreeMap<String, String> {
    let mut labels = template_labels.clone();
    labels.insert(labels::DRAIN_POD.to_owned(), set_name.to_owned());
    labels.insert(labels::ORDINAL.to_owned(), ordinal.to_string());
    labels
}

impl DrainTemplate {
    /// Name of the StatefulSet.
    pub fn set_name(&self) -> &str {
        &self.set_name
    }

    /// UID of the StatefulSet.
    pub fn set_uid(&self) -> &str {
        &self.set_uid
    }

    /// Namespace of the StatefulSet and of its drain pods.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `spec.ordinals.start` of the set (0 when unset).
    pub fn ordinals_start(&self) -> i32 {
        self.ordinals_start
    }

    /// Names of the set's volume claim templates, in the set's order.
    pub fn claim_templates(&self) -> &[String] {
        &self.claim_templates
    }

    /// Hash of the template's annotation text (see [`template_hash`]).
    pub fn template_hash(&self) -> &str {
        &self.template_hash
    }

    /// The restart policy of drain pods (`OnFailure` or `Never`).
    pub fn restart_policy(&self) -> &str {
        self.spec
            .restart_policy
            .as_deref()
            .unwrap_or(DEFAULT_RESTART_POLICY)
    }

    /// Name of the drain pod (and of the stateful pod) of `ordinal`: `<set>-<ordinal>`.
    pub fn pod_name(&self, ordinal: i32) -> String {
        drain_api::names::pod_name(&self.set_name, ordinal)
    }

    /// Name of the claim that claim template `claim_template` gives `ordinal`:
    /// `<claim template>-<set>-<ordinal>`.
    pub fn claim_name(&self, claim_template: &str, ordinal: i32) -> String {
        drain_api::names::claim_name(claim_template, &self.set_name, ordinal)
    }

    /// The labels of the drain pod of `ordinal`: the template's plus
    /// [`labels::DRAIN_POD`] and [`labels::ORDINAL`].
    pub fn pod_labels(&self, ordinal: i32) -> BTreeMap<String, String> {
        drain_pod_labels(&self.labels, &self.set_name, ordinal)
    }

    /// Makes drain pods for a set of another kind than `apps/v1` StatefulSet: the `apiVersion`
    /// of their owner reference and of [`env::STATEFULSET_API_VERSION`].
    pub fn set_owner_api_version(&mut self, api_version: &str) {
        api_version.clone_into(&mut self.owner_api_version);
    }

    /// Builds the drain pod of `input.ordinal`.
    ///
    /// It has the stateful pod's name, hostname and subdomain; one volume per claim template
    /// bound to the ordinal's claim (replacing any template volume of that name); the drain
    /// labels; the [`pod_annotations::CLAIMS`] annotation listing `input.claims`, and
    /// [`SAFE_TO_EVICT`] unless the template sets it; a non-controller owner reference to the
    /// set, and a controller reference to `input.revision`; and the drain environment variables in every
    /// container and init container (a variable the template already defines is kept, but the
    /// completion record, which names exactly the claims of `input.claims` that container uses).
    pub fn pod(&self, input: &DrainPodInput) -> Pod {
        let ordinal = input.ordinal;
        let name = self.pod_name(ordinal);
        let mut spec = self.spec.clone();

        spec.hostname = Some(name.clone());
        avoid(&mut spec, &input.avoid_nodes);
        if let Some(service_name) = &self.service_name {
            spec.subdomain = Some(service_name.clone());
        }

        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        for claim_template in &self.claim_templates {
            // Every template's volume is its claim: the planner starts no drain while one of
            // the ordinal's claims is missing, so nothing stands in for one in silence.
            let volume = Volume {
                name: claim_template.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: self.claim_name(claim_template, ordinal),
                    read_only: None,
                }),
                ..Volume::default()
            };
            match volumes.iter_mut().find(|v| v.name == *claim_template) {
                Some(existing) => *existing = volume,
                None => volumes.push(volume),
            }
        }

        let drained: BTreeMap<String, String> = input.claims.values().cloned().collect();
        let vars = self.env_vars(input, &name);
        let used: Vec<BTreeMap<String, String>> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| claims_used(&spec, c, &drained))
            .collect();
        let all_containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for (container, used) in all_containers.zip(used) {
            // Each container's record names exactly the claims it uses: only the containers
            // that drain a claim can prove it drained.
            let record = EnvVar {
                name: env::COMPLETION_RECORD.to_owned(),
                value: Some(CompletionRecord::new(used).render()),
                value_from: None,
            };
            let env = container.env.get_or_insert_with(Vec::new);
            for var in vars.iter().chain(std::iter::once(&record)) {
                match env.iter_mut().find(|existing| existing.name == var.name) {
                    // The completion record is always ours.
                    Some(existing) if var.name == env::COMPLETION_RECORD => *existing = var.clone(),
                    Some(_) => {}
                    None => env.push(var.clone()),
                }
            }
        }

        let claims: serde_json::Map<String, Value> = input
            .claims
            .values()
            .map(|(claim, uid)| (claim.clone(), Value::String(uid.clone())))
            .collect();
        let mut annotations = self.annotations.clone();
        annotations.insert(
            pod_annotations::CLAIMS.to_owned(),
            Value::Object(claims).to_string(),
        );
        annotations.insert(
            pod_annotations::TEMPLATE_HASH.to_owned(),
            self.template_hash.clone(),
        );
        annotations.insert(pod_annotations::SETTINGS.to_owned(), self.settings.clone());
        annotations
            .entry(SAFE_TO_EVICT.to_owned())
            .or_insert_with(|| "true".to_owned());
        let set = OwnerReference {
            api_version: self.owner_api_version.clone(),
            kind: "StatefulSet".to_owned(),
            name: self.set_name.clone(),
            uid: self.set_uid.clone(),
            controller: None,
            block_owner_deletion: None,
        };
        let revision = input.revision.iter().map(|(name, uid)| OwnerReference {
            api_version: "apps/v1".to_owned(),
            kind: "ControllerRevision".to_owned(),
            name: name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        });

        Pod {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.pod_labels(ordinal)),
                annotations: Some(annotations),
                owner_references: Some(std::iter::once(set).chain(revision).collect()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn env_vars(&self, input: &DrainPodInput, pod_name: &str) -> Vec<EnvVar> {
        [
            (env::STATEFULSET, self.set_name.clone()),
            (env::NAMESPACE, self.namespace.clone()),
            (env::ORDINAL, input.ordinal.to_string()),
            (env::REPLICAS, input.replicas.to_string()),
            (env::ORDINALS_START, self.ordinals_start.to_string()),
            (env::POD_NAME, pod_name.to_owned()),
            (env::STATEFULSET_API_VERSION, self.owner_api_version.clone()),
        ]
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: name.to_owned(),
            value: Some(value),
            value_from: None,
        })
        .collect()
    }
}

/// Keeps the pod off `nodes`: a `metadata.name NotIn nodes` requirement in each of its
/// required node selector terms (which are ORed: each must exclude them), or in a term of its
/// own when it has none.
fn avoid(spec: &mut PodSpec, nodes: &[String]) {
    if nodes.is_empty() {
        return;
    }
    let off = NodeSelectorRequirement {
        key: "metadata.name".to_owned(),
        operator: "NotIn".to_owned(),
        values: Some(nodes.to_vec()),
    };
    let required = spec
        .affinity
        .get_or_insert_with(Default::default)
        .node_affinity
        .get_or_insert_with(Default::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_fields
            .get_or_insert_with(Vec::new)
            .push(off.clone());
    }
}
