use drain_api::env;
use k8s_openapi::api::core::v1::Pod;

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
#[case::reserved_label_on_the_sets_pods(
    valid().pod_label(labels::DRAIN_POD, "web").build(),
    TemplateError::ReservedLabelOnSetPods { set: "web".into(), label: labels::DRAIN_POD.into() }
)]
#[case::reserved_ordinal_label_on_the_sets_pods(
    valid().pod_label(labels::ORDINAL, "2").build(),
    TemplateError::ReservedLabelOnSetPods { set: "web".into(), label: labels::ORDINAL.into() }
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
    let text =
        valid().build().metadata.annotations.unwrap()[annotations::DRAINER_POD_TEMPLATE].clone();
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
        avoid_nodes: Vec::new(),
        revision: None,
    };

    let env = |name: &str, value: &str| json!({"name": name, "value": value});
    let drain_env = |replicas: &str, record: &str| {
        json!([
            env(env::STATEFULSET, "web"),
            env(env::NAMESPACE, "shop"),
            env(env::ORDINAL, "2"),
            env(env::REPLICAS, replicas),
            env(env::ORDINALS_START, "1"),
            env(env::POD_NAME, "web-2"),
            env(env::STATEFULSET_API_VERSION, "apps/v1"),
            env(env::COMPLETION_RECORD, record),
        ])
    };
    // Each container's record names the claims it mounts.
    let mut drainer_env = drain_env(
        "mine",
        r#"{"drainCompleted":{"claims":{"data-web-2":"u1","logs-web-2":"u2"}}}"#,
    );
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
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
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
                "env": drain_env("2", r#"{"drainCompleted":{"claims":{"logs-web-2":"u2"}}}"#),
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
fn the_sets_revision_is_the_controller_so_kubectl_drain_evicts_the_pod() {
    let set = valid().build();
    let pod = validate(&set, &DrainConfig::default())
        .unwrap()
        .pod(&DrainPodInput {
            revision: Some(("web-7f9c".to_owned(), "rev-uid".to_owned())),
            ..DrainPodInput::default()
        });
    let owners = pod.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 2);
    // Still the set's (not as its controller: the set would take the pod for its own).
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].controller),
        ("StatefulSet", None)
    );
    let controller = &owners[1];
    assert_eq!(
        (
            controller.api_version.as_str(),
            controller.kind.as_str(),
            controller.name.as_str(),
            controller.uid.as_str(),
            controller.controller,
            controller.block_owner_deletion,
        ),
        (
            "apps/v1",
            "ControllerRevision",
            "web-7f9c",
            "rev-uid",
            Some(true),
            None
        )
    );
}

#[rstest]
#[case::by_default(json!({}), Some("true"))]
#[case::unless_the_template_says_otherwise(json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}), Some("false"))]
fn the_autoscaler_may_evict_a_drain_pod(
    #[case] annotations: serde_json::Value,
    #[case] expected: Option<&str>,
) {
    let set = valid()
        .drain_template(&template_with(
            json!({"annotations": annotations}),
            json!({}),
        ))
        .build();
    let pod = validate(&set, &DrainConfig::default())
        .unwrap()
        .pod(&DrainPodInput::default());
    let annotations = pod.metadata.annotations.unwrap();
    assert_eq!(annotations.get(SAFE_TO_EVICT).map(String::as_str), expected);
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
            avoid_nodes: Vec::new(),
            revision: None,
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
            avoid_nodes: Vec::new(),
            revision: None,
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
            avoid_nodes: Vec::new(),
            revision: None,
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
        let pod = drain.pod(&DrainPodInput { ordinal, replicas, claims: claims.clone(),
    avoid_nodes: Vec::new(),
    revision: None,
});

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
        // Every template's volume is its claim: nothing stands in for one.
        let expected: BTreeMap<String, String> = templates
            .iter()
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
fn a_missing_claim_is_not_replaced_by_an_empty_dir() {
    let set = SetBuilder::new("web")
        .claim_template("data")
        .claim_template("logs")
        .drain_template(&drain_template_json(&["data", "logs"]))
        .build();
    let drain = validate(&set, &DrainConfig::default()).expect("valid");
    let input = DrainPodInput {
        ordinal: 3,
        replicas: 1,
        claims: BTreeMap::from([("data".to_owned(), ("data-web-3".to_owned(), "u".to_owned()))]),
        avoid_nodes: Vec::new(),
        revision: None,
    };
    let volumes = drain.pod(&input).spec.unwrap().volumes.unwrap();
    for (template, claim) in [("data", "data-web-3"), ("logs", "logs-web-3")] {
        let volume = volumes.iter().find(|v| v.name == template).unwrap();
        assert_eq!(
            volume.persistent_volume_claim.as_ref().unwrap().claim_name,
            claim
        );
        assert!(volume.empty_dir.is_none());
    }
}

#[test]
fn each_containers_record_names_exactly_the_claims_it_mounts() {
    let set = SetBuilder::new("web")
        .claim_template("data")
        .claim_template("index")
        .drain_template(&template_with(
            json!({}),
            json!({
                "initContainers": [{"name": "init", "image": "x",
                    "volumeMounts": [{"name": "index", "mountPath": "/i"}]}],
                "containers": [
                    {"name": "data", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"}]},
                    {"name": "index", "image": "x", "volumeDevices": [{"name": "index", "devicePath": "/dev/i"}],
                     "env": [{"name": (env::COMPLETION_RECORD), "value": "{}"}]},
                    {"name": "both", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/d"},
                                                      {"name": "index", "mountPath": "/i"}]},
                    {"name": "proxy", "image": "x"},
                ],
            }),
        ))
        .build();
    let pod = validate(&set, &DrainConfig::default())
        .unwrap()
        .pod(&DrainPodInput {
            ordinal: 2,
            replicas: 2,
            claims: BTreeMap::from([
                ("data".into(), ("data-web-2".into(), "u1".into())),
                ("index".into(), ("index-web-2".into(), "u2".into())),
            ]),
            avoid_nodes: Vec::new(),
            revision: None,
        });
    let spec = pod.spec.unwrap();
    let record = |c: &k8s_openapi::api::core::v1::Container| {
        let records: Vec<_> = c
            .env
            .iter()
            .flatten()
            .filter(|v| v.name == env::COMPLETION_RECORD)
            .collect();
        assert_eq!(records.len(), 1, "{}", c.name);
        let parsed =
            drain_api::completion::CompletionRecord::parse(records[0].value.as_deref().unwrap())
                .unwrap();
        (c.name.clone(), parsed.claims)
    };
    let data = ("data-web-2".to_owned(), "u1".to_owned());
    let index = ("index-web-2".to_owned(), "u2".to_owned());
    let records: BTreeMap<_, _> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(record)
        .collect();
    assert_eq!(
        records,
        BTreeMap::from([
            ("data".to_owned(), BTreeMap::from([data.clone()])),
            ("index".to_owned(), BTreeMap::from([index.clone()])),
            ("both".to_owned(), BTreeMap::from([data, index.clone()])),
            ("proxy".to_owned(), BTreeMap::new()),
            ("init".to_owned(), BTreeMap::from([index])),
        ])
    );
}

#[test]
fn a_drain_pod_is_kept_off_the_nodes_to_avoid_in_every_required_term() {
    let pod_with = |affinity: Value, avoid: &[&str]| -> Value {
        let set = valid()
            .drain_template(&template_with(
                json!({}),
                json!({"affinity": affinity, "containers": [{"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]}),
            ))
            .build();
        let pod = validate(&set, &DrainConfig::default())
            .unwrap()
            .pod(&DrainPodInput {
                ordinal: 2,
                replicas: 2,
                claims: BTreeMap::new(),
                avoid_nodes: avoid.iter().map(|n| (*n).to_owned()).collect(),
                revision: None,
            });
        serde_json::to_value(pod.spec.unwrap().affinity).unwrap()
    };
    let off = json!({"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]});
    // No affinity of its own: one term that excludes them.
    assert_eq!(
        pod_with(json!(null), &["n1", "n2"]),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchFields": [off]}]}}})
    );
    // Terms of its own (ORed): each excludes them; preferences and pod affinity kept.
    let own = json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n3"]}]},
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]}},
            ],
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}},
        ]},
    });
    let got = pod_with(own.clone(), &["n1", "n2"]);
    let terms =
        &got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(terms[0]["matchFields"], json!([off]));
    assert_eq!(
        terms[0]["matchExpressions"],
        own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"]
    );
    assert_eq!(terms[1]["matchFields"][1], off);
    assert_eq!(
        got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    );
    assert_eq!(got["podAntiAffinity"], own["podAntiAffinity"]);
    // Nothing to avoid: the template's affinity as it is.
    assert_eq!(pod_with(own.clone(), &[]), own);
}
