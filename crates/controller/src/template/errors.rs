//! What can be wrong with a drain template or its set: one error per problem, each with a stable
//! Event reason.

use drain_api::annotations;

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
    /// The set's own pod template carries a label reserved for drain pods: its pods would be
    /// taken for drain pods.
    #[error(
        "the pod template of statefulset {set} carries label {label}, which marks drain pods: \
         remove it from spec.template.metadata.labels"
    )]
    ReservedLabelOnSetPods {
        /// Name of the StatefulSet.
        set: String,
        /// The label.
        label: String,
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
            Self::ReservedLabelOnSetPods { .. } => "ReservedLabelOnSetPods",
            Self::KillingProbe { .. } => "ProbeUnderExitCodeProof",
            Self::ForeignClaim { .. } => "ForeignClaimInDrainTemplate",
            Self::EphemeralContainers => "InvalidDrainTemplate",
        }
    }
}
