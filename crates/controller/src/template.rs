//! Drain template annotation text → validated [`DrainTemplate`] → the drain [`Pod`] of an ordinal.
//!
//! Everything here is pure: no client, no I/O, no clock. [`validate`] runs once per observed
//! StatefulSet and reports every problem it finds; [`DrainTemplate::pod`] cannot fail.

use std::collections::BTreeMap;

use drain_api::{annotations, labels, pod_annotations};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use serde_json::Value;

use crate::config::{DrainConfig, SuccessProof};

mod errors;
mod parse;
mod pod;

pub use errors::*;
pub use parse::*;
use pod::drain_pod_labels;
pub use pod::{DEFAULT_RESTART_POLICY, DrainPodInput, DrainTemplate, SAFE_TO_EVICT};

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

    let claim_templates = claim_templates(&set_spec);
    errors.extend(set_errors(&set_name, &set_spec, &claim_templates));

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

    let template_labels = metadata.labels.clone().unwrap_or_default();
    let template_annotations = metadata.annotations.clone().unwrap_or_default();
    errors.extend(metadata_errors(&metadata));
    errors.extend(spec_errors(&mut spec, &claim_templates, config));

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

/// The names of the set's claim templates.
fn claim_templates(set_spec: &StatefulSetSpec) -> Vec<String> {
    set_spec
        .volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|claim| claim.metadata.name.clone())
        .collect()
}

/// What is wrong with the set itself for draining: no claims, or claims it deletes itself.
fn set_errors(
    set_name: &str,
    set_spec: &StatefulSetSpec,
    claim_templates: &[String],
) -> Vec<TemplateError> {
    let mut errors = Vec::new();
    if claim_templates.is_empty() {
        errors.push(TemplateError::NoClaimTemplates {
            set: set_name.to_owned(),
        });
    }
    let when_scaled = set_spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|policy| policy.when_scaled.as_deref());
    if when_scaled == Some("Delete") {
        errors.push(TemplateError::ClaimsDeletedOnScaleDown {
            set: set_name.to_owned(),
        });
    }
    let pod_labels = set_spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref());
    for label in [labels::DRAIN_POD, labels::ORDINAL] {
        if pod_labels.is_some_and(|l| l.contains_key(label)) {
            errors.push(TemplateError::ReservedLabelOnSetPods {
                set: set_name.to_owned(),
                label: label.to_owned(),
            });
        }
    }
    errors
}

/// What is wrong with the template's metadata: fields it may not set, keys the controller
/// writes itself.
fn metadata_errors(metadata: &ObjectMeta) -> Vec<TemplateError> {
    let mut errors: Vec<TemplateError> = unsupported_metadata(metadata)
        .map(|field| TemplateError::UnsupportedMetadata { field })
        .collect();
    let no_map = BTreeMap::new();
    let template_labels = metadata.labels.as_ref().unwrap_or(&no_map);
    let template_annotations = metadata.annotations.as_ref().unwrap_or(&no_map);
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
    errors
}

/// What is wrong with the template's pod spec (its restart policy defaulted here): a restart
/// policy of `Always`, claims it does not mount or that are not the set's, ephemeral
/// containers, and probes that kill a drain judged by its exit code.
fn spec_errors(
    spec: &mut PodSpec,
    claim_templates: &[String],
    config: &DrainConfig,
) -> Vec<TemplateError> {
    let mut errors = Vec::new();
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
            .filter(|claim| !uses_volume(spec, claim))
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
    errors
}

#[cfg(test)]
mod tests;
