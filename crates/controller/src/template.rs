//! Drain template annotation text → validated [`DrainTemplate`] → the drain [`Pod`] of an ordinal.
//!
//! Everything here is pure: no client, no I/O, no clock. [`validate`] runs once per observed
//! StatefulSet and reports every problem it finds; [`DrainTemplate::pod`] cannot fail.

use std::collections::BTreeMap;

use drain_api::{annotations, env, labels, pod_annotations};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use serde_json::Value;

use crate::config::{DrainConfig, SuccessProof};

/// Restart policy of drain pods whose template sets none.
pub const DEFAULT_RESTART_POLICY: &str = "OnFailure";

/// A problem with a StatefulSet's drain template, or with the set itself, that stops draining
/// until the set changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The set has no drain template annotation.
    #[error("statefulset has no annotation {annotation}", annotation = annotations::DRAINER_POD_TEMPLATE)]
    MissingAnnotation,
    /// The annotation's value is not JSON.
    #[error("drain template is not JSON: {message}")]
    NotJson {
        /// What the JSON parser said.
        message: String,
    },
    /// The annotation's value is JSON but not an object.
    #[error("drain template is not a JSON object")]
    NotAnObject,
    /// The annotation holds some other kind of object (`kind` other than `Pod`, or `apiVersion`
    /// other than `v1`).
    #[error("not a pod template: {what}")]
    NotAPodTemplate {
        /// The offending field and value, e.g. `kind Deployment`.
        what: String,
    },
    /// The template has no `spec`.
    #[error("drain template has no spec")]
    NoSpec,
    /// The template's spec has no containers.
    #[error("drain template has no containers")]
    NoContainers,
    /// The template does not decode as a pod template (a field of the wrong type, ...).
    #[error("drain template is not a valid pod template: {message}")]
    Decode {
        /// What the decoder said.
        message: String,
    },
    /// The template has a field a pod template does not have (a typo, usually).
    #[error("unknown field {path}")]
    UnknownField {
        /// Path of the field, e.g. `spec.containers[0].imagee`.
        path: String,
    },
    /// The template's metadata sets something other than labels and annotations.
    #[error("drain template sets metadata.{field}; only labels and annotations are allowed")]
    UnsupportedMetadata {
        /// The metadata field, e.g. `name`.
        field: String,
    },
    /// The template sets a label or annotation the controller sets on drain pods itself.
    #[error("drain template sets {key}, which the controller sets itself")]
    ReservedKey {
        /// The label or annotation key.
        key: String,
    },
    /// The template's `restartPolicy` is not a restart policy.
    #[error("unknown restartPolicy {value}")]
    UnknownRestartPolicy {
        /// The value found.
        value: String,
    },
    /// The template's `restartPolicy` is `Always`: a drain pod could never succeed.
    #[error("drain template has restartPolicy Always, so a drain pod could never finish")]
    RestartPolicyAlways,
    /// A claim template's volume is used by no regular container of the template (an init
    /// container or a sidecar does not decide the drain's success).
    #[error(
        "claim template {claim_template} is mounted by no container of the drain template (an \
         init container or sidecar mounting it does not count: the containers that decide the \
         drain's success must)"
    )]
    ClaimNotMounted {
        /// Name of the claim template (and of the volume).
        claim_template: String,
    },
    /// The set's selector matches the drain pods' labels: the StatefulSet controller would adopt
    /// the drain pods (same names as its own pods) and delete them.
    #[error(
        "drain pod labels match the selector of statefulset {set}, whose controller would adopt and delete the drain pods"
    )]
    DrainPodAdoptable {
        /// Name of the StatefulSet.
        set: String,
    },
    /// The set's claim retention policy deletes claims on scale-down, before a drain can run.
    #[error(
        "statefulset {set} deletes its claims on scale-down (persistentVolumeClaimRetentionPolicy.whenScaled is Delete)"
    )]
    ClaimsDeletedOnScaleDown {
        /// Name of the StatefulSet.
        set: String,
    },
    /// The set has no volume claim templates, so there is nothing to drain.
    #[error("statefulset {set} has no volumeClaimTemplates")]
    NoClaimTemplates {
        /// Name of the StatefulSet.
        set: String,
    },
    /// A template volume other than a claim template's names a claim: a drain pod must never
    /// mount a claim it does not drain (a live peer's, another set's).
    #[error(
        "volume {volume} of the drain template names claim {claim}: a drain pod mounts only \
         the claims of its own ordinal, which the controller binds to the volumes named like the \
         set's claim templates"
    )]
    ForeignClaim {
        /// The volume's name.
        volume: String,
        /// The claim it names.
        claim: String,
    },
    /// The template sets `ephemeralContainers`, which no pod may be created with.
    #[error("drain template sets ephemeralContainers, which a pod cannot be created with")]
    EphemeralContainers,
    /// Under the `exit-code` proof, a container has a liveness or startup probe: its kill of a
    /// program that exits 0 on SIGTERM would leave a pod that looks like a finished drain.
    #[error(
        "container {container} of the drain template has a {probe} probe, which the exit-code \
         success proof cannot tell from a finished drain (a probe's kill of a program that exits \
         0 on SIGTERM leaves a Succeeded pod): remove the probe, or have the drain write its \
         completion record and set {annotation}: completion-record",
        annotation = annotations::SUCCESS_PROOF
    )]
    KillingProbe {
        /// The container's name.
        container: String,
        /// `liveness` or `startup`.
        probe: &'static str,
    },
}

impl TemplateError {
    /// A short stable reason, used as Kubernetes Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingAnnotation => "MissingDrainTemplate",
            Self::NotJson { .. }
            | Self::NotAnObject
            | Self::NotAPodTemplate { .. }
            | Self::NoSpec
            | Self::NoContainers
            | Self::Decode { .. }
            | Self::UnknownField { .. }
            | Self::UnsupportedMetadata { .. }
            | Self::ReservedKey { .. }
            | Self::UnknownRestartPolicy { .. } => "InvalidDrainTemplate",
            Self::RestartPolicyAlways => "RestartPolicyAlways",
            Self::ClaimNotMounted { .. } => "ClaimNotMounted",
            Self::DrainPodAdoptable { .. } => "DrainPodAdoptable",
            Self::ClaimsDeletedOnScaleDown { .. } => "ClaimsDeletedOnScaleDown",
            Self::NoClaimTemplates { .. } => "NoClaimTemplates",
            Self::KillingProbe { .. } => "ProbeUnderExitCodeProof",
            Self::ForeignClaim { .. } => "ForeignClaimInDrainTemplate",
            Self::EphemeralContainers => "InvalidDrainTemplate",
        }
    }
}

/// Parses the drain template annotation's text strictly into a pod template.
///
/// The text is a JSON object with `metadata` and `spec`. It may also carry `kind: Pod` and
/// `apiVersion: v1` (so a pod manifest can be pasted); both are dropped, and any other kind or
/// API version is rejected. Fields a pod template does not have are errors naming the first one
/// found (k8s-openapi would silently ignore them); explicit `null`s are allowed anywhere.
pub fn parse_template(text: &str) -> Result<PodTemplateSpec, TemplateError> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| TemplateError::NotJson {
        message: e.to_string(),
    })?;
    let object = value.as_object_mut().ok_or(TemplateError::NotAnObject)?;
    for (field, accepted) in [("kind", "Pod"), ("apiVersion", "v1")] {
        match object.remove(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(found)) if found == accepted => {}
            Some(Value::String(found)) => {
                return Err(TemplateError::NotAPodTemplate {
                    what: format!("{field} {found}"),
                });
            }
            Some(other) => {
                return Err(TemplateError::NotAPodTemplate {
                    what: format!("{field} {other}"),
                });
            }
        }
    }
    match object.get("spec") {
        None | Some(Value::Null) => return Err(TemplateError::NoSpec),
        Some(Value::Object(spec)) => match spec.get("containers") {
            None | Some(Value::Null) => return Err(TemplateError::NoContainers),
            Some(Value::Array(containers)) if containers.is_empty() => {
                return Err(TemplateError::NoContainers);
            }
            Some(_) => {}
        },
        // Not an object: the decoder says what is wrong with it.
        Some(_) => {}
    }
    let decode = |e: serde_json::Error| TemplateError::Decode {
        message: e.to_string(),
    };
    let template: PodTemplateSpec = serde_json::from_value(value.clone()).map_err(decode)?;
    let round_trip = serde_json::to_value(&template).map_err(decode)?;
    if let Some(path) = first_missing(&value, &round_trip, "") {
        return Err(TemplateError::UnknownField { path });
    }
    Ok(template)
}

/// The path of the first non-null value of `input` that `output` lacks, if any.
fn first_missing(input: &Value, output: &Value, path: &str) -> Option<String> {
    match input {
        Value::Object(fields) => fields.iter().find_map(|(key, value)| {
            let path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            missing_here(value, output.get(key), path)
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(index, value)| {
            missing_here(value, output.get(index), format!("{path}[{index}]"))
        }),
        _ => None,
    }
}

fn missing_here(input: &Value, output: Option<&Value>, path: String) -> Option<String> {
    if input.is_null() {
        return None;
    }
    match output.filter(|o| !o.is_null()) {
        None => Some(path),
        Some(output) => first_missing(input, output, &path),
    }
}

/// Whether `selector` matches `labels`, with Kubernetes label selector semantics: every
/// `matchLabels` pair and every `matchExpressions` requirement (`In`, `NotIn`, `Exists`,
/// `DoesNotExist`) must hold; an empty selector matches everything. A requirement with an
/// unknown operator matches nothing (the API server rejects such selectors).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    pairs_match
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|requirement| requirement_matches(requirement, labels))
}

fn requirement_matches(
    requirement: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let value = labels.get(&requirement.key);
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// A StatefulSet's drain template, validated against the set: building a drain pod from it
/// cannot fail.
///
/// It keeps what the pods need from the set (name, namespace, UID, service name, ordinals start,
/// claim template names) and the template's spec with the restart policy defaulted and, unless
/// the set opted out, the set's placement and identity fields inherited.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainTemplate {
    set_name: String,
    namespace: String,
    set_uid: String,
    service_name: Option<String>,
    ordinals_start: i32,
    claim_templates: Vec<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    spec: PodSpec,
    template_hash: String,
    owner_api_version: String,
    /// The [`pod_annotations::SETTINGS`] value of its pods.
    settings: String,
}

/// A stable hash of the drain template's annotation text (FNV-1a, 64 bits, hex): what tells a
/// changed template from the one a series of attempts started with. Stable across builds and
/// versions, unlike `std`'s hasher.
pub fn template_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
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
}

/// Validates a StatefulSet's drain template against the set and its drain settings.
///
/// Every problem found is reported; template parse errors (see [`parse_template`]) stop the
/// checks that need the template.
pub fn validate(
    set: &StatefulSet,
    config: &DrainConfig,
) -> Result<DrainTemplate, Vec<TemplateError>> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let set_spec = set.spec.clone().unwrap_or_default();
    let mut errors = Vec::new();

    let claim_templates: Vec<String> = set_spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|claim| claim.metadata.name.clone())
        .collect();
    if claim_templates.is_empty() {
        errors.push(TemplateError::NoClaimTemplates {
            set: set_name.clone(),
        });
    }
    let when_scaled = set_spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|policy| policy.when_scaled.as_deref());
    if when_scaled == Some("Delete") {
        errors.push(TemplateError::ClaimsDeletedOnScaleDown {
            set: set_name.clone(),
        });
    }

    let text = set
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::DRAINER_POD_TEMPLATE));
    let parsed = match text {
        None => Err(TemplateError::MissingAnnotation),
        Some(text) => parse_template(text),
    };
    let hash = template_hash(text.map(String::as_str).unwrap_or_default());
    let template = match parsed {
        Ok(template) => template,
        Err(error) => {
            errors.push(error);
            return Err(errors);
        }
    };
    let metadata = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();

    errors.extend(
        unsupported_metadata(&metadata).map(|field| TemplateError::UnsupportedMetadata { field }),
    );
    let template_labels = metadata.labels.unwrap_or_default();
    let template_annotations = metadata.annotations.unwrap_or_default();
    let reserved_labels = [labels::DRAIN_POD, labels::ORDINAL]
        .into_iter()
        .filter(|key| template_labels.contains_key(*key));
    let reserved_annotations = [
        pod_annotations::CLAIMS,
        pod_annotations::TEMPLATE_HASH,
        pod_annotations::SETTINGS,
    ]
    .into_iter()
    .filter(|key| template_annotations.contains_key(*key));
    errors.extend(reserved_labels.chain(reserved_annotations).map(|key| {
        TemplateError::ReservedKey {
            key: key.to_owned(),
        }
    }));

    match spec.restart_policy.as_deref() {
        None => spec.restart_policy = Some(DEFAULT_RESTART_POLICY.to_owned()),
        Some("OnFailure" | "Never") => {}
        Some("Always") => errors.push(TemplateError::RestartPolicyAlways),
        Some(other) => errors.push(TemplateError::UnknownRestartPolicy {
            value: other.to_owned(),
        }),
    }

    errors.extend(
        claim_templates
            .iter()
            .filter(|claim| !uses_volume(&spec, claim))
            .map(|claim| TemplateError::ClaimNotMounted {
                claim_template: claim.clone(),
            }),
    );

    errors.extend(
        spec.volumes
            .iter()
            .flatten()
            .filter(|v| !claim_templates.contains(&v.name))
            .filter_map(|v| {
                Some(TemplateError::ForeignClaim {
                    volume: v.name.clone(),
                    claim: v.persistent_volume_claim.as_ref()?.claim_name.clone(),
                })
            }),
    );
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        errors.push(TemplateError::EphemeralContainers);
    }

    if config.proof == SuccessProof::ExitCode {
        for c in spec.containers.iter() {
            let probes = [
                ("liveness", c.liveness_probe.is_some()),
                ("startup", c.startup_probe.is_some()),
            ];
            errors.extend(
                probes
                    .into_iter()
                    .filter(|(_, set)| *set)
                    .map(|(probe, _)| TemplateError::KillingProbe {
                        container: c.name.clone(),
                        probe,
                    }),
            );
        }
    }

    let ordinals_start = set_spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0);
    if adoptable(
        &set_spec.selector,
        &template_labels,
        &set_name,
        ordinals_start,
    ) {
        errors.push(TemplateError::DrainPodAdoptable {
            set: set_name.clone(),
        });
    }

    if !errors.is_empty() {
        return Err(errors);
    }
    if config.inherit_pod_spec
        && let Some(set_pod_spec) = &set_spec.template.spec
    {
        inherit(&mut spec, set_pod_spec);
    }
    Ok(DrainTemplate {
        set_name,
        namespace: set.metadata.namespace.clone().unwrap_or_default(),
        set_uid: set.metadata.uid.clone().unwrap_or_default(),
        service_name: set_spec.service_name.filter(|name| !name.is_empty()),
        ordinals_start,
        claim_templates,
        labels: template_labels,
        annotations: template_annotations,
        spec,
        template_hash: hash,
        owner_api_version: "apps/v1".to_owned(),
        settings: settings_annotation(config),
    })
}

/// The metadata fields set other than labels and annotations.
fn unsupported_metadata(metadata: &ObjectMeta) -> impl Iterator<Item = String> {
    let fields = match serde_json::to_value(metadata) {
        Ok(Value::Object(fields)) => fields.into_iter().map(|(field, _)| field).collect(),
        _ => Vec::new(),
    };
    fields
        .into_iter()
        .filter(|field| field != "labels" && field != "annotations")
}

/// Whether a regular container (not an init container, not a sidecar) mounts (or, for block
/// volumes, attaches) `volume`.
fn uses_volume(spec: &PodSpec, volume: &str) -> bool {
    spec.containers.iter().any(|container| {
        let mounted = container
            .volume_mounts
            .iter()
            .flatten()
            .any(|mount| mount.name == volume);
        let attached = container
            .volume_devices
            .iter()
            .flatten()
            .any(|device| device.name == volume);
        mounted || attached
    })
}

/// The labels of a drain pod: the template's, then ours.
fn drain_pod_labels(
    template_labels: &BTreeMap<String, String>,
    set_name: &str,
    ordinal: i32,
) -> BTreeMap<String, String> {
    let mut labels = template_labels.clone();
    labels.insert(labels::DRAIN_POD.to_owned(), set_name.to_owned());
    labels.insert(labels::ORDINAL.to_owned(), ordinal.to_string());
    labels
}

/// Whether the set's selector matches the labels of a drain pod of any ordinal.
///
/// Only ordinals the selector names under our ordinal label can behave differently from the
/// others, so checking those and one ordinal it does not name covers every ordinal.
fn adoptable(
    selector: &LabelSelector,
    template_labels: &BTreeMap<String, String>,
    set_name: &str,
    ordinals_start: i32,
) -> bool {
    let named_pairs = selector
        .match_labels
        .iter()
        .flatten()
        .filter(|(key, _)| *key == labels::ORDINAL)
        .map(|(_, value)| value);
    let named_in_expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .filter(|requirement| requirement.key == labels::ORDINAL)
        .flat_map(|requirement| requirement.values.iter().flatten());
    let named: Vec<i32> = named_pairs
        .chain(named_in_expressions)
        .filter_map(|value| value.parse::<i32>().ok())
        .filter(|ordinal| *ordinal >= ordinals_start)
        .collect();
    let unnamed = (ordinals_start..=i32::MAX).find(|ordinal| !named.contains(ordinal));
    named.iter().copied().chain(unnamed).any(|ordinal| {
        selector_matches(
            selector,
            &drain_pod_labels(template_labels, set_name, ordinal),
        )
    })
}

/// Copies the set's placement and identity fields the drain template leaves unset.
fn inherit(drain: &mut PodSpec, set: &PodSpec) {
    if drain.tolerations.is_none() {
        drain.tolerations.clone_from(&set.tolerations);
    }
    if drain.node_selector.is_none() {
        drain.node_selector.clone_from(&set.node_selector);
    }
    if drain.affinity.is_none() {
        drain.affinity.clone_from(&set.affinity);
    }
    if drain.image_pull_secrets.is_none() {
        drain.image_pull_secrets.clone_from(&set.image_pull_secrets);
    }
    if drain.service_account_name.is_none() && drain.service_account.is_none() {
        drain
            .service_account_name
            .clone_from(&set.service_account_name);
    }
    if drain.security_context.is_none() {
        drain.security_context.clone_from(&set.security_context);
    }
}

/// The [`pod_annotations::SETTINGS`] value for drain pods made under `config`.
pub fn settings_annotation(config: &DrainConfig) -> String {
    let mut value = serde_json::json!({
        "approval": if config.manual_approval { "manual" } else { "automatic" },
        "successProof": config.proof.as_str(),
    });
    if let Some(retain) = config.retain_volume_for {
        value["retainVolumeForSeconds"] = retain.as_secs().into();
    }
    value.to_string()
}

impl DrainTemplate {
    /// Name of the StatefulSet.
    pub fn set_name(&self) -> &str {
        &self.set_name
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
    /// labels; the [`pod_annotations::CLAIMS`] annotation listing `input.claims`; a
    /// non-controller owner reference to the set; and the drain environment variables in every
    /// container and init container (a variable the template already defines is kept).
    pub fn pod(&self, input: &DrainPodInput) -> Pod {
        let ordinal = input.ordinal;
        let name = self.pod_name(ordinal);
        let mut spec = self.spec.clone();

        spec.hostname = Some(name.clone());
        if let Some(service_name) = &self.service_name {
            spec.subdomain = Some(service_name.clone());
        }

        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        for claim_template in &self.claim_templates {
            // A template whose claim is gone (deleted by hand) gets an empty directory, so the
            // drain containers' mounts still resolve and the other claims are drained.
            let volume = if input.claims.is_empty() || input.claims.contains_key(claim_template) {
                Volume {
                    name: claim_template.clone(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: self.claim_name(claim_template, ordinal),
                        read_only: None,
                    }),
                    ..Volume::default()
                }
            } else {
                Volume {
                    name: claim_template.clone(),
                    empty_dir: Some(Default::default()),
                    ..Volume::default()
                }
            };
            match volumes.iter_mut().find(|v| v.name == *claim_template) {
                Some(existing) => *existing = volume,
                None => volumes.push(volume),
            }
        }

        let vars = self.env_vars(input, &name);
        let all_containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for container in all_containers {
            let env = container.env.get_or_insert_with(Vec::new);
            for var in &vars {
                match env.iter_mut().find(|existing| existing.name == var.name) {
                    // The completion record is always ours: it names the claims the pod drains.
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

        Pod {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.pod_labels(ordinal)),
                annotations: Some(annotations),
                owner_references: Some(vec![OwnerReference {
                    api_version: self.owner_api_version.clone(),
                    kind: "StatefulSet".to_owned(),
                    name: self.set_name.clone(),
                    uid: self.set_uid.clone(),
                    controller: None,
                    block_owner_deletion: None,
                }]),
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
            (
                env::COMPLETION_RECORD,
                drain_api::completion::CompletionRecord::new(
                    input.claims.values().cloned().collect(),
                )
                .render(),
            ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{SetBuilder, drain_template_json};
    use drain_api::annotations::INHERIT_POD_SPEC;
    use k8s_openapi::api::core::v1::Toleration;
    use proptest::prelude::*;
    use rstest::rstest;
    use serde_json::json;

    /// A set that validates: `web`, 3 replicas, claim template `data`, a template mounting it.
    fn valid() -> SetBuilder {
        SetBuilder::new("web")
            .replicas(3)
            .claim_template("data")
            .drain_template(&drain_template_json(&["data"]))
    }

    /// A drain template JSON with `spec` merged into the spec of [`drain_template_json`].
    fn template_with(metadata: Value, spec: Value) -> String {
        let mut template: Value = serde_json::from_str(&drain_template_json(&["data"])).unwrap();
        merge(&mut template["metadata"], metadata);
        merge(&mut template["spec"], spec);
        template.to_string()
    }

    fn merge(into: &mut Value, from: Value) {
        if let (Value::Object(into), Value::Object(from)) = (into, from) {
            into.extend(from);
        }
    }

    fn selector(value: Value) -> LabelSelector {
        serde_json::from_value(value).unwrap()
    }

    fn errors(set: &StatefulSet) -> Vec<TemplateError> {
        validate(set, &DrainConfig::default()).expect_err("validation should fail")
    }

    #[rstest]
    #[case::not_an_array("[]", TemplateError::NotAnObject)]
    #[case::not_a_string(r#""spec""#, TemplateError::NotAnObject)]
    #[case::no_spec(r#"{"metadata":{}}"#, TemplateError::NoSpec)]
    #[case::null_spec(r#"{"spec":null}"#, TemplateError::NoSpec)]
    #[case::no_containers(r#"{"spec":{}}"#, TemplateError::NoContainers)]
    #[case::empty_containers(r#"{"spec":{"containers":[]}}"#, TemplateError::NoContainers)]
    #[case::deployment(
        r#"{"apiVersion":"apps/v1","kind":"Deployment","spec":{"containers":[{"name":"d"}]}}"#,
        TemplateError::NotAPodTemplate { what: "kind Deployment".into() }
    )]
    #[case::pod_template_kind(
        r#"{"kind":"PodTemplate","spec":{"containers":[{"name":"d"}]}}"#,
        TemplateError::NotAPodTemplate { what: "kind PodTemplate".into() }
    )]
    #[case::kind_not_a_string(
        r#"{"kind":5,"spec":{"containers":[{"name":"d"}]}}"#,
        TemplateError::NotAPodTemplate { what: "kind 5".into() }
    )]
    #[case::pod_of_other_api_version(
        r#"{"apiVersion":"apps/v1","kind":"Pod","spec":{"containers":[{"name":"d"}]}}"#,
        TemplateError::NotAPodTemplate { what: "apiVersion apps/v1".into() }
    )]
    #[case::unknown_container_field(
        r#"{"spec":{"containers":[{"name":"d","imagee":"x"}]}}"#,
        TemplateError::UnknownField { path: "spec.containers[0].imagee".into() }
    )]
    #[case::unknown_field_deep(
        r#"{"spec":{"containers":[{"name":"a"},{"name":"b","securityContext":{"runAsUsr":1}}]}}"#,
        TemplateError::UnknownField { path: "spec.containers[1].securityContext.runAsUsr".into() }
    )]
    #[case::unknown_volume_source_field(
        r#"{"spec":{"containers":[{"name":"d"}],"volumes":[{"name":"v","emptyDir":{"medum":"Memory"}}]}}"#,
        TemplateError::UnknownField { path: "spec.volumes[0].emptyDir.medum".into() }
    )]
    #[case::misspelt_labels(
        r#"{"metadata":{"lables":{"a":"b"}},"spec":{"containers":[{"name":"d"}]}}"#,
        TemplateError::UnknownField { path: "metadata.lables".into() }
    )]
    #[case::unknown_top_level_field(
        r#"{"kind":"Pod","spec":{"containers":[{"name":"d"}]},"status":{}}"#,
        TemplateError::UnknownField { path: "status".into() }
    )]
    fn parse_rejects(#[case] text: &str, #[case] expected: TemplateError) {
        assert_eq!(parse_template(text), Err(expected));
    }

    #[rstest]
    #[case::not_json("{", "InvalidDrainTemplate", "drain template is not JSON: ")]
    #[case::wrong_type(
        r#"{"spec":{"containers":[{"name":5}]}}"#,
        "InvalidDrainTemplate",
        "drain template is not a valid pod template: "
    )]
    fn parse_rejects_with_decoder_message(
        #[case] text: &str,
        #[case] reason: &str,
        #[case] prefix: &str,
    ) {
        let error = parse_template(text).unwrap_err();
        assert_eq!(error.reason(), reason);
        assert!(error.to_string().starts_with(prefix), "{error}");
    }

    #[rstest]
    #[case::minimal(r#"{"spec":{"containers":[{"name":"d"}]}}"#)]
    #[case::pod_v1(r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"d"}]}}"#)]
    #[case::explicit_nulls(
        r#"{"kind":null,"metadata":{"creationTimestamp":null},"spec":{"nodeName":null,"containers":[{"name":"d","image":null}]}}"#
    )]
    #[case::quantities_ports_and_empty_objects(
        r#"{"spec":{"containers":[{"name":"d","resources":{"limits":{"memory":"64Mi","cpu":"100m"}},
            "readinessProbe":{"httpGet":{"port":8080,"path":"/ready"}},"securityContext":{}}],
            "volumes":[{"name":"tmp","emptyDir":{}}],"tolerations":[]}}"#
    )]
    fn parse_accepts(#[case] text: &str) {
        let template = parse_template(text).expect("template should parse");
        assert_eq!(template.spec.unwrap().containers[0].name, "d");
    }

    #[rstest]
    #[case::missing_annotation(
        SetBuilder::new("web").claim_template("data").build(),
        TemplateError::MissingAnnotation
    )]
    #[case::unparseable(
        valid().drain_template(r#"{"spec":{"containers":[{"name":"d","imagee":"x"}]}}"#).build(),
        TemplateError::UnknownField { path: "spec.containers[0].imagee".into() }
    )]
    #[case::not_a_pod(
        valid().drain_template(r#"{"kind":"Deployment","spec":{"containers":[{"name":"d"}]}}"#).build(),
        TemplateError::NotAPodTemplate { what: "kind Deployment".into() }
    )]
    #[case::restart_policy_always(
        valid().drain_template(&template_with(json!({}), json!({"restartPolicy": "Always"}))).build(),
        TemplateError::RestartPolicyAlways
    )]
    #[case::restart_policy_unknown(
        valid().drain_template(&template_with(json!({}), json!({"restartPolicy": "Sometimes"}))).build(),
        TemplateError::UnknownRestartPolicy { value: "Sometimes".into() }
    )]
    #[case::claim_not_mounted(
        valid().claim_template("logs").build(),
        TemplateError::ClaimNotMounted { claim_template: "logs".into() }
    )]
    #[case::claim_only_declared_as_volume(
        valid().claim_template("logs").drain_template(&template_with(
            json!({}),
            json!({"volumes": [{"name": "logs", "emptyDir": {}}]}),
        )).build(),
        TemplateError::ClaimNotMounted { claim_template: "logs".into() }
    )]
    #[case::adoptable_by_match_labels(
        valid().drain_template(&template_with(json!({"labels": {"app": "web"}}), json!({}))).build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::adoptable_by_in_expression(
        valid()
            .selector(selector(json!({"matchExpressions": [
                {"key": "role", "operator": "In", "values": ["server", "drainer"]}]})))
            .build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::adoptable_by_exists_on_drain_label(
        valid()
            .selector(LabelSelector::default())
            .selector_expression(labels::DRAIN_POD, "Exists", &[])
            .build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::adoptable_by_one_ordinal(
        valid()
            .selector(selector(json!({"matchLabels": {(labels::ORDINAL): "7"}})))
            .build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::adoptable_by_not_in_other_ordinals(
        valid()
            .selector(LabelSelector::default())
            .selector_expression(labels::ORDINAL, "NotIn", &["0", "1"])
            .build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::adoptable_by_empty_selector(
        valid().selector(LabelSelector::default()).build(),
        TemplateError::DrainPodAdoptable { set: "web".into() }
    )]
    #[case::claims_deleted_on_scale_down(
        valid().retention_policy("Retain", "Delete").build(),
        TemplateError::ClaimsDeletedOnScaleDown { set: "web".into() }
    )]
    #[case::no_claim_templates(
        SetBuilder::new("web").drain_template(&drain_template_json(&[])).build(),
        TemplateError::NoClaimTemplates { set: "web".into() }
    )]
    #[case::metadata_name(
        valid().drain_template(&template_with(json!({"name": "drainer"}), json!({}))).build(),
        TemplateError::UnsupportedMetadata { field: "name".into() }
    )]
    #[case::reserved_label(
        valid().drain_template(&template_with(json!({"labels": {(labels::ORDINAL): "1"}}), json!({}))).build(),
        TemplateError::ReservedKey { key: labels::ORDINAL.into() }
    )]
    #[case::reserved_annotation(
        valid().drain_template(&template_with(json!({"annotations": {(pod_annotations::CLAIMS): "{}"}}), json!({}))).build(),
        TemplateError::ReservedKey { key: pod_annotations::CLAIMS.into() }
    )]
    #[case::reserved_settings_annotation(
        valid().drain_template(&template_with(json!({"annotations": {(pod_annotations::SETTINGS): "{}"}}), json!({}))).build(),
        TemplateError::ReservedKey { key: pod_annotations::SETTINGS.into() }
    )]
    #[case::mounted_by_init_container_only(
        valid().drain_template(
            r#"{"spec":{"initContainers":[{"name":"i","volumeMounts":[{"name":"data","mountPath":"/d"}]}],"containers":[{"name":"d"}]}}"#
        ).build(),
        TemplateError::ClaimNotMounted { claim_template: "data".into() }
    )]
    #[case::mounted_by_a_native_sidecar_only(
        valid().drain_template(
            r#"{"spec":{"initContainers":[{"name":"s","restartPolicy":"Always","volumeMounts":[{"name":"data","mountPath":"/d"}]}],"containers":[{"name":"d"}]}}"#
        ).build(),
        TemplateError::ClaimNotMounted { claim_template: "data".into() }
    )]
    #[case::names_a_peers_claim(
        valid().drain_template(&template_with(json!({}), json!({
            "containers": [{"name": "d", "volumeMounts": [
                {"name": "data", "mountPath": "/data"}, {"name": "peer", "mountPath": "/peer"}]}],
            "volumes": [{"name": "peer", "persistentVolumeClaim": {"claimName": "data-web-0"}}],
        }))).build(),
        TemplateError::ForeignClaim { volume: "peer".into(), claim: "data-web-0".into() }
    )]
    #[case::ephemeral_containers(
        valid().drain_template(&template_with(json!({}), json!({
            "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
        }))).build(),
        TemplateError::EphemeralContainers
    )]
    fn validate_rejects(#[case] set: StatefulSet, #[case] expected: TemplateError) {
        assert_eq!(errors(&set), vec![expected]);
    }

    #[rstest]
    #[case::restart_policy_always(TemplateError::RestartPolicyAlways, "RestartPolicyAlways")]
    #[case::claim_not_mounted(
        TemplateError::ClaimNotMounted { claim_template: "data".into() },
        "ClaimNotMounted"
    )]
    #[case::adoptable(TemplateError::DrainPodAdoptable { set: "web".into() }, "DrainPodAdoptable")]
    #[case::claims_deleted(
        TemplateError::ClaimsDeletedOnScaleDown { set: "web".into() },
        "ClaimsDeletedOnScaleDown"
    )]
    #[case::no_claim_templates(TemplateError::NoClaimTemplates { set: "web".into() }, "NoClaimTemplates")]
    #[case::missing(TemplateError::MissingAnnotation, "MissingDrainTemplate")]
    #[case::unknown_field(TemplateError::UnknownField { path: "x".into() }, "InvalidDrainTemplate")]
    fn reasons(#[case] error: TemplateError, #[case] reason: &str) {
        assert_eq!(error.reason(), reason);
        let message = error.to_string();
        assert!(!message.ends_with('.'), "{message}");
        assert!(
            message.starts_with(|c: char| !c.is_uppercase()),
            "{message}"
        );
    }

    #[test]
    fn validate_reports_every_problem() {
        let set = SetBuilder::new("web")
            .claim_template("data")
            .claim_template("logs")
            .retention_policy("Retain", "Delete")
            .drain_template(&template_with(
                json!({"labels": {"app": "web"}}),
                json!({"restartPolicy": "Always"}),
            ))
            .build();
        let reasons: Vec<_> = errors(&set).iter().map(TemplateError::reason).collect();
        assert_eq!(
            reasons,
            [
                "ClaimsDeletedOnScaleDown",
                "RestartPolicyAlways",
                "ClaimNotMounted",
                "DrainPodAdoptable"
            ]
        );
    }

    #[test]
    fn validate_without_template_still_reports_set_problems() {
        let set = SetBuilder::new("web").build();
        assert_eq!(
            errors(&set),
            [
                TemplateError::NoClaimTemplates { set: "web".into() },
                TemplateError::MissingAnnotation
            ]
        );
    }

    #[rstest]
    #[case::default(valid())]
    #[case::pod_manifest(valid().drain_template(
        r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"d","volumeMounts":[{"name":"data","mountPath":"/d"}]}]}}"#
    ))]
    #[case::restart_policy_never(valid().drain_template(&template_with(json!({}), json!({"restartPolicy": "Never"}))))]
    #[case::a_claim_template_volume_in_the_template_is_replaced(valid().drain_template(&template_with(json!({}), json!({
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "anything"}}],
    }))))]
    #[case::block_device(valid().drain_template(
        r#"{"spec":{"containers":[{"name":"d","volumeDevices":[{"name":"data","devicePath":"/dev/xvda"}]}]}}"#
    ))]
    #[case::shares_app_label_but_selector_excludes_drain_pods(
        valid()
            .selector_expression(labels::DRAIN_POD, "DoesNotExist", &[])
            .drain_template(&template_with(json!({"labels": {"app": "web"}}), json!({})))
    )]
    #[case::selector_names_ordinal_below_start(
        valid()
            .ordinals_start(5)
            .selector(LabelSelector::default())
            .selector_expression(labels::ORDINAL, "In", &["1", "4"])
    )]
    #[case::selector_names_non_canonical_ordinal(
        valid()
            .selector(LabelSelector::default())
            .selector_expression(labels::ORDINAL, "In", &["05", "x"])
    )]
    #[case::retention_retain(valid().retention_policy("Delete", "Retain"))]
    #[case::no_service_name(valid().service_name(""))]
    fn validate_accepts(#[case] set: SetBuilder) {
        let set = set.build();
        if let Err(errors) = validate(&set, &DrainConfig::default()) {
            panic!("unexpected errors: {errors:?}");
        }
    }

    #[rstest]
    #[case::default_on_failure(json!({}), "OnFailure")]
    #[case::on_failure(json!({"restartPolicy": "OnFailure"}), "OnFailure")]
    #[case::never(json!({"restartPolicy": "Never"}), "Never")]
    fn restart_policy(#[case] spec: Value, #[case] expected: &str) {
        let set = valid()
            .drain_template(&template_with(json!({}), spec))
            .build();
        let template = validate(&set, &DrainConfig::default()).unwrap();
        assert_eq!(template.restart_policy(), expected);
        let pod = template.pod(&DrainPodInput::default());
        assert_eq!(pod.spec.unwrap().restart_policy.as_deref(), Some(expected));
    }

    #[rstest]
    #[case::match_labels(json!({"matchLabels": {"a": "1"}}), true)]
    #[case::match_labels_other_value(json!({"matchLabels": {"a": "2"}}), false)]
    #[case::match_labels_absent_key(json!({"matchLabels": {"z": "1"}}), false)]
    #[case::empty(json!({}), true)]
    #[case::in_(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["0", "1"]}]}), true)]
    #[case::in_other(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["2"]}]}), false)]
    #[case::in_absent_key(json!({"matchExpressions": [{"key": "z", "operator": "In", "values": ["1"]}]}), false)]
    #[case::not_in(json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}), false)]
    #[case::not_in_other(json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["2"]}]}), true)]
    #[case::not_in_absent_key(json!({"matchExpressions": [{"key": "z", "operator": "NotIn", "values": ["1"]}]}), true)]
    #[case::exists(json!({"matchExpressions": [{"key": "b", "operator": "Exists"}]}), true)]
    #[case::exists_absent(json!({"matchExpressions": [{"key": "z", "operator": "Exists"}]}), false)]
    #[case::does_not_exist(json!({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}), false)]
    #[case::does_not_exist_absent(json!({"matchExpressions": [{"key": "z", "operator": "DoesNotExist"}]}), true)]
    #[case::unknown_operator(json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["0"]}]}), false)]
    #[case::labels_and_expressions_all_hold(
        json!({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}),
        true
    )]
    #[case::labels_hold_expression_fails(
        json!({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}),
        false
    )]
    fn selector_semantics(#[case] value: Value, #[case] expected: bool) {
        let labels = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), String::new()),
        ]);
        assert_eq!(selector_matches(&selector(value), &labels), expected);
    }

    #[test]
    fn template_hash_is_stable_and_tells_texts_apart() {
        // Pinned: a change of the hash function would start every drain series over.
        assert_eq!(template_hash(""), "cbf29ce484222325");
        assert_eq!(template_hash("a"), "af63dc4c8601ec8c");
        assert_ne!(template_hash("{\"spec\":1}"), template_hash("{\"spec\":2}"));
        let drain = validate(&valid().build(), &DrainConfig::default()).unwrap();
        let text = valid().build().metadata.annotations.unwrap()[annotations::DRAINER_POD_TEMPLATE]
            .clone();
        assert_eq!(drain.template_hash(), template_hash(&text));
    }

    #[test]
    fn builds_the_exact_pod() {
        let template = json!({
            "metadata": {"labels": {"role": "drainer"}, "annotations": {"note": "x"}},
            "spec": {
                "serviceAccountName": "drainer",
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "scratch", "emptyDir": {}},
                ],
                "initContainers": [{
                    "name": "prepare",
                    "image": "busybox",
                    "volumeMounts": [{"name": "logs", "mountPath": "/logs"}],
                }],
                "containers": [{
                    "name": "drainer",
                    "image": "drainer:1",
                    "env": [{"name": (env::REPLICAS), "value": "mine"}],
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "logs", "mountPath": "/logs"},
                    ],
                }],
            },
        });
        let set = SetBuilder::new("web")
            .namespace("shop")
            .uid("u-web")
            .service_name("web-svc")
            .replicas(2)
            .ordinals_start(1)
            .claim_template("data")
            .claim_template("logs")
            .with_pod_spec(|spec| {
                spec.service_account_name = Some("web".into());
                spec.tolerations = Some(vec![Toleration {
                    key: Some("dedicated".into()),
                    operator: Some("Exists".into()),
                    ..Toleration::default()
                }]);
            })
            .drain_template(&template.to_string())
            .build();
        let drain = validate(&set, &DrainConfig::default()).unwrap();
        let input = DrainPodInput {
            ordinal: 2,
            replicas: 2,
            claims: BTreeMap::from([
                ("data".into(), ("data-web-2".into(), "u1".into())),
                ("logs".into(), ("logs-web-2".into(), "u2".into())),
            ]),
        };

        let env = |name: &str, value: &str| json!({"name": name, "value": value});
        let drain_env = |replicas: &str| {
            json!([
                env(env::STATEFULSET, "web"),
                env(env::NAMESPACE, "shop"),
                env(env::ORDINAL, "2"),
                env(env::REPLICAS, replicas),
                env(env::ORDINALS_START, "1"),
                env(env::POD_NAME, "web-2"),
                env(env::STATEFULSET_API_VERSION, "apps/v1"),
                env(
                    env::COMPLETION_RECORD,
                    r#"{"drainCompleted":{"claims":{"data-web-2":"u1","logs-web-2":"u2"}}}"#,
                ),
            ])
        };
        let mut drainer_env = drain_env("mine");
        let drainer_env_list = drainer_env.as_array_mut().unwrap();
        let replicas_var = drainer_env_list.remove(3);
        drainer_env_list.insert(0, replicas_var);
        let expected: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "web-2",
                "namespace": "shop",
                "labels": {"role": "drainer", (labels::DRAIN_POD): "web", (labels::ORDINAL): "2"},
                "annotations": {
                    "note": "x",
                    (pod_annotations::CLAIMS): json!({"data-web-2": "u1", "logs-web-2": "u2"}).to_string(),
                    (pod_annotations::TEMPLATE_HASH): template_hash(&template.to_string()),
                    (pod_annotations::SETTINGS): r#"{"approval":"automatic","successProof":"completion-record"}"#,
                },
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u-web"}
                ],
            },
            "spec": {
                "hostname": "web-2",
                "subdomain": "web-svc",
                "restartPolicy": "OnFailure",
                "serviceAccountName": "drainer",
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "logs", "persistentVolumeClaim": {"claimName": "logs-web-2"}},
                ],
                "initContainers": [{
                    "name": "prepare",
                    "image": "busybox",
                    "volumeMounts": [{"name": "logs", "mountPath": "/logs"}],
                    "env": drain_env("2"),
                }],
                "containers": [{
                    "name": "drainer",
                    "image": "drainer:1",
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "logs", "mountPath": "/logs"},
                    ],
                    "env": drainer_env,
                }],
            },
        }))
        .unwrap();

        assert_eq!(drain.pod(&input), expected);
        assert_eq!(drain.pod_name(2), "web-2");
        assert_eq!(drain.claim_name("data", 2), "data-web-2");
        assert_eq!(drain.claim_templates(), ["data", "logs"]);
        assert_eq!(
            (drain.set_name(), drain.namespace(), drain.ordinals_start()),
            ("web", "shop", 1)
        );
    }

    #[test]
    fn pod_has_no_subdomain_without_service_name() {
        let set = valid().service_name("").build();
        let pod = validate(&set, &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput::default());
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-0"));
        assert_eq!(spec.subdomain, None);
    }

    #[test]
    fn owner_reference_is_not_a_controller_reference() {
        let set = valid().build();
        let pod = validate(&set, &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput::default());
        let owners = pod.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].controller, None);
        assert_eq!(owners[0].block_owner_deletion, None);
    }

    #[test]
    fn a_drain_pod_of_an_advanced_statefulset_names_its_kind() {
        let set = valid().build();
        let mut template = validate(&set, &DrainConfig::default()).unwrap();
        let hash = template.template_hash().to_owned();
        template.set_owner_api_version("apps.kruise.io/v1beta1");
        let pod = template.pod(&DrainPodInput::default());
        let owners = pod.metadata.owner_references.unwrap();
        assert_eq!(owners[0].api_version, "apps.kruise.io/v1beta1");
        assert_eq!(owners[0].kind, "StatefulSet");
        assert_eq!(owners[0].controller, None);
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        assert!(env.iter().any(|v| v.name == env::STATEFULSET_API_VERSION
            && v.value.as_deref() == Some("apps.kruise.io/v1beta1")));
        // The kind is not part of the template: the hash that tells a changed template stays.
        assert_eq!(template.template_hash(), hash);
    }

    /// The pod-level fields a drain pod may inherit, as the set's pod template sets them.
    fn set_pod_fields() -> Value {
        json!({
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "nodeSelector": {"disk": "ssd"},
            "affinity": {"podAntiAffinity": {}},
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "web",
            "securityContext": {"runAsUser": 1000},
        })
    }

    fn set_with_pod_fields(inherit: Option<&str>, drain_spec: Value) -> StatefulSet {
        let mut set_pod_spec = set_pod_fields();
        merge(&mut set_pod_spec, json!({"containers": [{"name": "app"}]}));
        let mut builder = valid()
            .pod_spec(serde_json::from_value(set_pod_spec).unwrap())
            .drain_template(&template_with(json!({}), drain_spec));
        if let Some(value) = inherit {
            builder = builder.annotation(INHERIT_POD_SPEC, value);
        }
        builder.build()
    }

    /// The inheritable fields of the drain pod of ordinal 0, as JSON.
    fn inherited_fields(set: &StatefulSet) -> Value {
        let config = DrainConfig::from_set(set).unwrap();
        let pod = validate(set, &config)
            .unwrap()
            .pod(&DrainPodInput::default());
        let spec = serde_json::to_value(pod.spec.unwrap()).unwrap();
        let fields = set_pod_fields();
        let keys = fields.as_object().unwrap().keys();
        let inherited = keys.filter_map(|key| Some((key.clone(), spec.get(key)?.clone())));
        Value::Object(inherited.collect())
    }

    #[rstest]
    #[case::by_default(None)]
    #[case::when_annotation_true(Some("true"))]
    fn inherits_pod_spec_fields(#[case] inherit: Option<&str>) {
        let set = set_with_pod_fields(inherit, json!({}));
        assert_eq!(inherited_fields(&set), set_pod_fields());
    }

    #[test]
    fn does_not_inherit_when_annotation_false() {
        let set = set_with_pod_fields(Some("false"), json!({}));
        assert_eq!(inherited_fields(&set), json!({}));
    }

    #[test]
    fn template_fields_win_over_inherited_ones() {
        let own = json!({
            "tolerations": [],
            "nodeSelector": {"disk": "hdd"},
            "affinity": {"nodeAffinity": {}},
            "imagePullSecrets": [{"name": "other"}],
            "serviceAccountName": "drainer",
            "securityContext": {"runAsUser": 2000},
        });
        let set = set_with_pod_fields(None, own.clone());
        assert_eq!(inherited_fields(&set), own);
    }

    #[test]
    fn deprecated_service_account_counts_as_set() {
        let set = set_with_pod_fields(None, json!({"serviceAccount": "drainer"}));
        assert_eq!(inherited_fields(&set).get("serviceAccountName"), None);
    }

    #[test]
    fn env_is_added_to_every_container_and_kept_when_defined() {
        let set = valid()
            .drain_template(&template_with(
                json!({}),
                json!({
                    "initContainers": [{"name": "init", "env": [{"name": (env::ORDINAL), "value": "mine"}]}],
                    "containers": [
                        {"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/d"}]},
                        {"name": "b"},
                    ],
                }),
            ))
            .build();
        let pod = validate(&set, &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput {
                ordinal: 4,
                replicas: 1,
                claims: BTreeMap::new(),
            });
        let spec = pod.spec.unwrap();
        let all = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        for container in all {
            let vars: BTreeMap<_, _> = container
                .env
                .iter()
                .flatten()
                .map(|var| (var.name.as_str(), var.value.as_deref().unwrap()))
                .collect();
            let names = [
                env::STATEFULSET,
                env::NAMESPACE,
                env::ORDINAL,
                env::REPLICAS,
                env::ORDINALS_START,
                env::POD_NAME,
                env::STATEFULSET_API_VERSION,
                env::COMPLETION_RECORD,
            ];
            assert!(names.iter().all(|name| vars.contains_key(name)), "{vars:?}");
            assert_eq!(container.env.as_ref().unwrap().len(), names.len());
            let ordinal = if container.name == "init" {
                "mine"
            } else {
                "4"
            };
            assert_eq!(vars[env::ORDINAL], ordinal);
            assert_eq!(vars[env::POD_NAME], "web-4");
        }
    }

    #[test]
    fn probes_that_kill_are_refused_only_under_the_exit_code_proof() {
        let set = valid()
            .drain_template(&template_with(
                json!({}),
                json!({
                    "containers": [{
                        "name": "drain",
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "livenessProbe": {"exec": {"command": ["true"]}},
                        "startupProbe": {"exec": {"command": ["true"]}},
                        "readinessProbe": {"exec": {"command": ["true"]}},
                    }],
                }),
            ))
            .build();
        assert!(validate(&set, &DrainConfig::default()).is_ok());
        let exit_code = DrainConfig {
            proof: SuccessProof::ExitCode,
            ..DrainConfig::default()
        };
        let errors = validate(&set, &exit_code).unwrap_err();
        assert_eq!(
            errors,
            vec![
                TemplateError::KillingProbe {
                    container: "drain".into(),
                    probe: "liveness"
                },
                TemplateError::KillingProbe {
                    container: "drain".into(),
                    probe: "startup"
                },
            ]
        );
        assert_eq!(errors[0].reason(), "ProbeUnderExitCodeProof");
        assert!(errors[0].to_string().contains("completion-record"));
    }

    #[test]
    fn the_completion_record_names_exactly_the_pods_claims() {
        let pod = validate(&valid().build(), &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput {
                ordinal: 2,
                replicas: 2,
                claims: BTreeMap::from([("data".into(), ("data-web-2".into(), "u1".into()))]),
            });
        let vars = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let record = vars
            .iter()
            .find(|v| v.name == env::COMPLETION_RECORD)
            .and_then(|v| v.value.as_deref())
            .and_then(drain_api::completion::CompletionRecord::parse)
            .unwrap();
        assert_eq!(
            record.claims,
            BTreeMap::from([("data-web-2".to_owned(), "u1".to_owned())])
        );
    }

    #[test]
    fn the_completion_record_variable_is_always_the_controllers() {
        let set = valid()
            .drain_template(&template_with(
                json!({}),
                json!({"containers": [{
                    "name": "d",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "env": [{"name": (env::COMPLETION_RECORD), "value": "{}"}],
                }]}),
            ))
            .build();
        let pod = validate(&set, &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput {
                ordinal: 2,
                replicas: 2,
                claims: BTreeMap::from([("data".into(), ("data-web-2".into(), "u1".into()))]),
            });
        let vars = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let records: Vec<_> = vars
            .iter()
            .filter(|v| v.name == env::COMPLETION_RECORD)
            .collect();
        assert_eq!(records.len(), 1);
        assert!(records[0].value.as_deref().unwrap().contains("data-web-2"));
    }

    #[test]
    fn claims_annotation_is_empty_object_without_claims() {
        let pod = validate(&valid().build(), &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput::default());
        let annotations = pod.metadata.annotations.unwrap();
        assert_eq!(annotations[pod_annotations::CLAIMS], "{}");
    }

    fn claim_maps() -> impl Strategy<Value = (Vec<String>, BTreeMap<String, (String, String)>)> {
        proptest::collection::btree_set("[a-z][a-z0-9-]{0,6}", 1..4).prop_flat_map(|templates| {
            let templates: Vec<String> = templates.into_iter().collect();
            let present = proptest::collection::vec(any::<bool>(), templates.len());
            let uids = proptest::collection::vec("[a-f0-9]{8}", templates.len());
            (Just(templates), present, uids).prop_map(|(templates, present, uids)| {
                let claims = templates
                    .iter()
                    .zip(present)
                    .zip(uids)
                    .filter(|((_, present), _)| *present)
                    .map(|((template, _), uid)| (template.clone(), (template.clone(), uid)))
                    .collect();
                (templates, claims)
            })
        })
    }

    proptest! {
        #[test]
        fn pod_names_and_volumes_follow_the_ordinal(
            set_name in "[a-z][a-z0-9]{0,10}",
            ordinal in 0..100_000i32,
            replicas in 0..1000i32,
            (templates, claims) in claim_maps(),
        ) {
            let template_names: Vec<&str> = templates.iter().map(String::as_str).collect();
            let mut builder = SetBuilder::new(&set_name)
                .replicas(replicas)
                .drain_template(&drain_template_json(&template_names));
            for template in &templates {
                builder = builder.claim_template(template);
            }
            let drain = validate(&builder.build(), &DrainConfig::default()).unwrap();
            // Claim names as the observer would give them.
            let claims: BTreeMap<String, (String, String)> = claims
                .into_iter()
                .map(|(template, (_, uid))| {
                    let name = drain.claim_name(&template, ordinal);
                    (template, (name, uid))
                })
                .collect();
            let pod = drain.pod(&DrainPodInput { ordinal, replicas, claims: claims.clone() });

            let pod_name = format!("{set_name}-{ordinal}");
            prop_assert_eq!(pod.metadata.name.as_deref(), Some(pod_name.as_str()));
            let spec = pod.spec.unwrap();
            prop_assert_eq!(spec.hostname, pod.metadata.name.clone());
            let volumes: BTreeMap<String, String> = spec
                .volumes
                .unwrap()
                .into_iter()
                .filter_map(|v| Some((v.name, v.persistent_volume_claim?.claim_name)))
                .collect();
            // Templates with a claim (or all, when no claims are given) point at it.
            let expected: BTreeMap<String, String> = templates
                .iter()
                .filter(|t| claims.is_empty() || claims.contains_key(*t))
                .map(|t| (t.clone(), format!("{t}-{set_name}-{ordinal}")))
                .collect();
            prop_assert_eq!(volumes, expected);
            let recorded: BTreeMap<String, String> = serde_json::from_str(
                &pod.metadata.annotations.unwrap()[pod_annotations::CLAIMS],
            )
            .unwrap();
            let given: BTreeMap<String, String> = claims.into_values().collect();
            prop_assert_eq!(recorded, given);
            let labels = pod.metadata.labels.unwrap();
            prop_assert_eq!(&labels[labels::ORDINAL], &ordinal.to_string());
            prop_assert_eq!(&labels[labels::DRAIN_POD], &set_name);
        }
    }

    #[test]
    fn a_missing_claim_is_replaced_by_an_empty_dir() {
        let set = SetBuilder::new("web")
            .claim_template("data")
            .claim_template("logs")
            .drain_template(&drain_template_json(&["data", "logs"]))
            .build();
        let drain = validate(&set, &DrainConfig::default()).expect("valid");
        let input = DrainPodInput {
            ordinal: 3,
            replicas: 1,
            claims: BTreeMap::from([(
                "data".to_owned(),
                ("data-web-3".to_owned(), "u".to_owned()),
            )]),
        };
        let volumes = drain.pod(&input).spec.unwrap().volumes.unwrap();
        let data = volumes.iter().find(|v| v.name == "data").unwrap();
        let logs = volumes.iter().find(|v| v.name == "logs").unwrap();
        assert_eq!(
            data.persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-web-3"
        );
        assert!(logs.persistent_volume_claim.is_none() && logs.empty_dir.is_some());
    }
}
