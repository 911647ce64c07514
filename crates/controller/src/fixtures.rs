//! Chainable builders of Kubernetes objects for tests (compiled only under `cfg(test)`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetOrdinals, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, Pod, PodSpec, PodStatus, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

/// Namespace the builders use unless told otherwise.
pub const NAMESPACE: &str = "default";

/// Builds a [`StatefulSet`]: by default `<name>` in [`NAMESPACE`] with UID `uid-<name>`, one
/// replica, selector and pod labels `app: <name>`, one container `app`, service name `<name>`,
/// no claim templates and no annotations.
#[derive(Clone, Debug)]
pub struct SetBuilder {
    set: StatefulSet,
}

impl SetBuilder {
    /// A set named `name` with the defaults above.
    pub fn new(name: &str) -> Self {
        let app = BTreeMap::from([("app".to_owned(), name.to_owned())]);
        let set = StatefulSet {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(StatefulSetSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(app.clone()),
                    match_expressions: None,
                },
                service_name: Some(name.to_owned()),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(app),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "app".to_owned(),
                            image: Some("example.invalid/app:1".to_owned()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..StatefulSetSpec::default()
            }),
            status: None,
        };
        Self { set }
    }

    fn spec(&mut self) -> &mut StatefulSetSpec {
        self.set.spec.get_or_insert_with(StatefulSetSpec::default)
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.set.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// Sets the UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.set.metadata.uid = Some(uid.to_owned());
        self
    }

    /// Sets `metadata.generation`.
    pub fn generation(mut self, generation: i64) -> Self {
        self.set.metadata.generation = Some(generation);
        self
    }

    /// Adds a label to the set itself.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.set
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation to the set.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.set
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets the drain template annotation to `json`.
    pub fn drain_template(self, json: &str) -> Self {
        self.annotation(drain_api::annotations::DRAINER_POD_TEMPLATE, json)
    }

    /// Sets `spec.replicas`.
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.spec().replicas = Some(replicas);
        self
    }

    /// Adds a volume claim template named `name` (1Gi, ReadWriteOnce).
    pub fn claim_template(mut self, name: &str) -> Self {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                resources: Some(k8s_openapi::api::core::v1::VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".to_owned()),
                    )])),
                    limits: None,
                }),
                ..Default::default()
            }),
            status: None,
        };
        self.spec()
            .volume_claim_templates
            .get_or_insert_with(Vec::new)
            .push(claim);
        self
    }

    /// Adds `key: value` to both the selector's `matchLabels` and the pod template's labels, so
    /// the set stays valid.
    pub fn selector_label(mut self, key: &str, value: &str) -> Self {
        self.spec()
            .selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self.template_label(key, value)
    }

    /// Adds a `matchExpressions` requirement (`In`, `NotIn`, `Exists`, `DoesNotExist`) to the
    /// selector; the pod template's labels are left alone.
    pub fn selector_expression(mut self, key: &str, operator: &str, values: &[&str]) -> Self {
        let values = (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect());
        self.spec()
            .selector
            .match_expressions
            .get_or_insert_with(Vec::new)
            .push(LabelSelectorRequirement {
                key: key.to_owned(),
                operator: operator.to_owned(),
                values,
            });
        self
    }

    /// Replaces the selector.
    pub fn selector(mut self, selector: LabelSelector) -> Self {
        self.spec().selector = selector;
        self
    }

    /// Adds a label to the pod template (not to the selector).
    pub fn template_label(mut self, key: &str, value: &str) -> Self {
        self.spec()
            .template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Replaces the whole pod template.
    pub fn pod_template(mut self, template: PodTemplateSpec) -> Self {
        self.spec().template = template;
        self
    }

    /// Replaces the pod template's spec.
    pub fn pod_spec(mut self, spec: PodSpec) -> Self {
        self.spec().template.spec = Some(spec);
        self
    }

    /// Adds a label to the set's pod template.
    pub fn pod_label(mut self, key: &str, value: &str) -> Self {
        self.spec()
            .template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Changes the pod template's spec in place.
    pub fn with_pod_spec(mut self, change: impl FnOnce(&mut PodSpec)) -> Self {
        change(
            self.spec()
                .template
                .spec
                .get_or_insert_with(PodSpec::default),
        );
        self
    }

    /// Sets `spec.podManagementPolicy` (`OrderedReady` or `Parallel`).
    pub fn pod_management_policy(mut self, policy: &str) -> Self {
        self.spec().pod_management_policy = Some(policy.to_owned());
        self
    }

    /// Sets `spec.ordinals.start`.
    pub fn ordinals_start(mut self, start: i32) -> Self {
        self.spec().ordinals = Some(StatefulSetOrdinals { start: Some(start) });
        self
    }

    /// Sets `spec.persistentVolumeClaimRetentionPolicy` (`Retain` or `Delete` for each).
    pub fn retention_policy(mut self, when_deleted: &str, when_scaled: &str) -> Self {
        self.spec().persistent_volume_claim_retention_policy =
            Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                when_deleted: Some(when_deleted.to_owned()),
                when_scaled: Some(when_scaled.to_owned()),
            });
        self
    }

    /// Sets `spec.serviceName`; an empty string removes it.
    pub fn service_name(mut self, service_name: &str) -> Self {
        self.spec().service_name = (!service_name.is_empty()).then(|| service_name.to_owned());
        self
    }

    /// Sets the status.
    pub fn status(mut self, status: StatefulSetStatus) -> Self {
        self.set.status = Some(status);
        self
    }

    /// The set.
    pub fn build(self) -> StatefulSet {
        self.set
    }
}

/// A minimal valid drain template (JSON) whose one container `drainer` mounts each of `claims`
/// at `/data/<claim>`.
pub fn drain_template_json(claims: &[&str]) -> String {
    let mounts: Vec<_> = claims
        .iter()
        .map(|claim| serde_json::json!({"name": claim, "mountPath": format!("/data/{claim}")}))
        .collect();
    serde_json::json!({
        "metadata": {"labels": {"role": "drainer"}},
        "spec": {
            "containers": [{
                "name": "drainer",
                "image": "example.invalid/drainer:1",
                "volumeMounts": mounts,
            }],
        },
    })
    .to_string()
}

/// Builds a [`PersistentVolumeClaim`]: by default `<name>` in [`NAMESPACE`] with UID
/// `uid-<name>` and no spec.
#[derive(Clone, Debug)]
pub struct ClaimBuilder {
    claim: PersistentVolumeClaim,
}

impl ClaimBuilder {
    /// A claim named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            claim: PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(NAMESPACE.to_owned()),
                    uid: Some(format!("uid-{name}")),
                    ..ObjectMeta::default()
                },
                spec: None,
                status: None,
            },
        }
    }

    /// The claim a set's claim template `template` gives ordinal `ordinal`:
    /// `<template>-<set>-<ordinal>`.
    pub fn for_ordinal(template: &str, set: &str, ordinal: i32) -> Self {
        Self::new(&format!("{template}-{set}-{ordinal}"))
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.claim.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// Sets the UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.claim.metadata.uid = Some(uid.to_owned());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.claim
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// The claim.
    pub fn build(self) -> PersistentVolumeClaim {
        self.claim
    }
}

/// Builds a [`Pod`]: by default `<name>` in [`NAMESPACE`] with UID `uid-<name>`, no spec, no
/// status.
#[derive(Clone, Debug)]
pub struct PodBuilder {
    pod: Pod,
}

impl PodBuilder {
    /// A pod named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            pod: Pod {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(NAMESPACE.to_owned()),
                    uid: Some(format!("uid-{name}")),
                    ..ObjectMeta::default()
                },
                spec: None,
                status: None,
            },
        }
    }

    /// Starts from an existing pod (e.g. one built by a drain template).
    pub fn from_pod(pod: Pod) -> Self {
        Self { pod }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.pod.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// Sets the UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.pod.metadata.uid = Some(uid.to_owned());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pod
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Sets `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub fn phase(mut self, phase: &str) -> Self {
        self.pod.status.get_or_insert_with(PodStatus::default).phase = Some(phase.to_owned());
        self
    }

    /// The pod.
    pub fn build(self) -> Pod {
        self.pod
    }
}
