//! Thousands of generated malformed and hostile annotation values: each is a clear error (a
//! known reason, a message) or a valid setting, never a panic, and an invalid set never starts a
//! drain.

use std::collections::BTreeMap;

use drain_api::annotations;
use jiff::Timestamp;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::fixtures::{SetBuilder, drain_template_json};
use crate::plan::{self, Action, Claim, DrainRecord, Snapshot};

/// Every reason a validation problem may carry (`TemplateError::reason` and `ConfigError::reason`).
const REASONS: [&str; 10] = [
    "InvalidDrainTemplate",
    "InvalidDrainAnnotation",
    "RestartPolicyAlways",
    "ClaimNotMounted",
    "DrainPodAdoptable",
    "ClaimsDeletedOnScaleDown",
    "NoClaimTemplates",
    "MissingDrainTemplate",
    "ProbeUnderExitCodeProof",
    "ForeignClaimInDrainTemplate",
];

/// The settings annotations, each given a generated value.
const SETTINGS: [&str; 10] = [
    annotations::MAX_CONCURRENT,
    annotations::ON_SCALE_UP,
    annotations::INHERIT_POD_SPEC,
    annotations::MAX_ATTEMPTS,
    annotations::DEADLINE_SECONDS,
    annotations::STALL_SECONDS,
    annotations::APPROVAL,
    annotations::SUCCESS_PROOF,
    annotations::RETAIN_VOLUME_FOR,
    annotations::STATUS,
];

/// Values people and scripts get wrong, and hostile ones.
fn arb_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        prop::sample::select(vec![
            "",
            " ",
            "0",
            "-1",
            "1",
            " 5 ",
            "+3",
            "0x10",
            "1e3",
            "NaN",
            "inf",
            "3.5",
            "4294967296",
            "18446744073709551616",
            "99999999999999999999999999",
            "true",
            "True",
            "FALSE",
            "yes",
            "finish",
            "Finish",
            "cancel ",
            "manual",
            "automatic",
            "null",
            "{}",
            "[]",
            "\"5\"",
            "\u{0}",
            "\u{202e}5",
            "５",
        ])
        .prop_map(str::to_owned),
        (1usize..20_000).prop_map(|n| "9".repeat(n)),
    ]
}

/// Any JSON value, nested a few levels.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        arb_value().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Where a generated value replaces part of a valid drain template.
const PATHS: [&[&str]; 14] = [
    &["metadata"],
    &["metadata", "labels"],
    &["metadata", "labels", "app"],
    &["metadata", "name"],
    &["metadata", "annotations"],
    &["spec"],
    &["spec", "containers"],
    &["spec", "restartPolicy"],
    &["spec", "volumes"],
    &["spec", "hostname"],
    &["spec", "nodeName"],
    &["spec", "initContainers"],
    &["spec", "terminationGracePeriodSeconds"],
    &["spec", "activeDeadlineSeconds"],
];

fn replace(mut doc: Value, path: &[&str], value: Value) -> Value {
    let mut at = &mut doc;
    for (i, key) in path.iter().enumerate() {
        if !at.is_object() {
            *at = json!({});
        }
        let map = at.as_object_mut().expect("object");
        if i + 1 == path.len() {
            map.insert((*key).to_owned(), value);
            return doc;
        }
        at = map.entry((*key).to_owned()).or_insert_with(|| json!({}));
    }
    doc
}

/// A drain template: a valid one with a part replaced, arbitrary JSON, or arbitrary text.
fn arb_template() -> impl Strategy<Value = String> {
    let valid: Value = serde_json::from_str(&drain_template_json(&["data"])).expect("json");
    prop_oneof![
        4 => (prop::sample::select(PATHS.to_vec()), arb_json())
            .prop_map(move |(path, v)| replace(valid.clone(), path, v).to_string()),
        1 => arb_json().prop_map(|v| v.to_string()),
        1 => arb_value(),
    ]
}

fn orphaned_claim(ordinal: i32) -> Claim {
    Claim {
        name: format!("data-web-{ordinal}"),
        uid: format!("uid-{ordinal}"),
        template: "data".to_owned(),
        ordinal,
        terminating: false,
        record: DrainRecord::default(),
    }
}

/// Validates, builds settings, plans for a set of 1 with the claims of ordinal 1 orphaned and,
/// when valid, builds the drain pod: the checks every generated set must pass.
fn check(set: &StatefulSet) -> Result<(), TestCaseError> {
    let validated = validate(set);
    let settings = match &validated {
        Ok(v) => {
            let pod = v.template.pod(&crate::template::DrainPodInput {
                ordinal: 1,
                replicas: 1,
                claims: BTreeMap::from([(
                    "data".to_owned(),
                    ("data-web-1".to_owned(), "uid-1".to_owned()),
                )]),
                avoid_nodes: Vec::new(),
                revision: None,
            });
            prop_assert_eq!(pod.metadata.name.as_deref(), Some("web-1"));
            settings(set, Ok(v), &Flags::default(), None)
        }
        Err(problems) => {
            prop_assert!(!problems.is_empty());
            for p in problems {
                prop_assert!(REASONS.contains(&p.reason), "unknown reason {}", p.reason);
                prop_assert!(!p.message.trim().is_empty());
            }
            settings(set, Err("invalid"), &Flags::default(), None)
        }
    };
    let snap = Snapshot {
        set_name: "web".to_owned(),
        replicas: 1,
        ordinals_start: 0,
        reserved: Default::default(),
        also_held: None,
        claim_templates: vec!["data".to_owned()],
        claims: vec![orphaned_claim(1)],
        pods: Vec::new(),
        previous: BTreeMap::new(),
        nodes: BTreeMap::new(),
    };
    let plan = plan::plan(&snap, &settings, Timestamp::UNIX_EPOCH);
    let creates = plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::CreateDrainPod { .. }));
    prop_assert_eq!(
        creates,
        validated.is_ok(),
        "a drain starts only for a valid set"
    );
    Ok(())
}

fn base() -> SetBuilder {
    SetBuilder::new("web").replicas(1).claim_template("data")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn hostile_setting_values_are_errors_or_settings_never_panics(
        values in prop::collection::vec((prop::sample::select(SETTINGS.to_vec()), arb_value()), 1..5)
    ) {
        let mut set = base().drain_template(&drain_template_json(&["data"]));
        for (key, value) in &values {
            set = set.annotation(key, value);
        }
        check(&set.build())?;
    }

    #[test]
    fn hostile_drain_templates_are_errors_or_templates_never_panics(template in arb_template()) {
        check(&base().drain_template(&template).build())?;
    }
}
