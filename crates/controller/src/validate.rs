//! Validate once: a StatefulSet → its drain settings and template, or the list of problems. Later
//! steps work on the validated value and cannot fail on bad input.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::config::{DrainConfig, SuccessProof};
use crate::plan::{NewDrains, Settings};
use crate::template::{self, DrainTemplate};

/// A problem that stops new drains of a set until it changes: an Event reason and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Stable reason (Event reason, metric label).
    pub reason: &'static str,
    /// What is wrong, for people.
    pub message: String,
}

/// The controller's flags that shape every set's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flags {
    /// First retry delay; doubles per failed attempt.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// A drain pod not started (or blocked) this long after creation is stuck.
    pub stuck_after: Duration,
    /// A running drain pod that shows nothing this long is quiet (zero: never).
    pub quiet_after: Duration,
    /// A drain pod whose containers restarted this often is stuck.
    pub max_restarts: u32,
    /// A drain pod's node not ready this long is lost.
    pub node_lost_after: Duration,
    /// Under `finish`, the longest a returning ordinal waits for its drain.
    pub scale_up_wait: Duration,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
            stuck_after: Duration::from_secs(300),
            quiet_after: Duration::from_secs(1800),
            max_restarts: 3,
            node_lost_after: Duration::from_secs(60),
            scale_up_wait: Duration::from_secs(300),
        }
    }
}

/// A StatefulSet's drain settings and template, both valid.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedSet {
    /// The drain annotations.
    pub config: DrainConfig,
    /// The drain template, ready to build pods.
    pub template: DrainTemplate,
}

/// Validates the drain annotations and template of `set`; every problem found is reported.
pub fn validate(set: &StatefulSet) -> Result<ValidatedSet, Vec<Problem>> {
    let config = DrainConfig::from_set(set).map_err(|e| {
        vec![Problem {
            reason: e.reason(),
            message: e.to_string(),
        }]
    })?;
    let template = template::validate(set, &config).map_err(|errors| {
        errors
            .iter()
            .map(|e| Problem {
                reason: e.reason(),
                message: e.to_string(),
            })
            .collect::<Vec<_>>()
    })?;
    Ok(ValidatedSet { config, template })
}

/// The planner's settings for a set: from its validated drain settings, or, when there are
/// none (opted out, or invalid: `stopped` says why), settings that only complete and clean up
/// the drains in flight.
///
/// `default_max_concurrent` is the kind's default drain concurrency (an Advanced StatefulSet's
/// `scaleStrategy.maxUnavailable`): the annotation wins over it, and it over the pod management
/// policy's default.
pub fn settings(
    set: &StatefulSet,
    validated: Result<&ValidatedSet, &str>,
    flags: &Flags,
    default_max_concurrent: Option<u32>,
) -> Settings {
    let (config, new_drains) = match validated {
        Ok(v) => (
            v.config.clone(),
            NewDrains::Allowed {
                template_hash: v.template.template_hash().to_owned(),
            },
        ),
        Err(why) => (
            DrainConfig::default(),
            NewDrains::Stopped {
                why: why.to_owned(),
            },
        ),
    };
    // An approval annotation that does not parse still holds deletes: only `automatic` (or no
    // annotation) lets a drained claim go without a person's approval.
    let manual_approval = config.manual_approval
        || set
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(drain_api::annotations::APPROVAL))
            .is_some_and(|v| v.trim() != "automatic");
    // Likewise only `exit-code`, spelt exactly, lowers the proof a succeeded drain needs.
    let proof = match set
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(drain_api::annotations::SUCCESS_PROOF))
    {
        Some(v) if v.trim() == SuccessProof::ExitCode.as_str() => SuccessProof::ExitCode,
        _ => SuccessProof::CompletionRecord,
    };
    // A retention that does not parse still retains (for the fallback time).
    let retain_volume_for = config.retain_volume_for.or_else(|| {
        set.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(drain_api::annotations::RETAIN_VOLUME_FOR))
            .map(|_| crate::plan::RETAIN_FALLBACK)
    });
    Settings {
        new_drains,
        manual_approval,
        proof,
        retain_volume_for,
        max_concurrent: config
            .max_concurrent
            .or(default_max_concurrent)
            .or_else(|| config.concurrency_limit(set)),
        on_scale_up: config.on_scale_up,
        max_attempts: config.max_attempts,
        deadline: config.deadline,
        stall_after: config.stall_after,
        retry_base: flags.retry_base,
        retry_max: flags.retry_max,
        stuck_after: flags.stuck_after,
        quiet_after: Some(flags.quiet_after).filter(|d| !d.is_zero()),
        max_restarts: flags.max_restarts,
        node_lost_after: flags.node_lost_after,
        scale_up_wait: flags.scale_up_wait,
    }
}

#[cfg(test)]
mod hostile;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OnScaleUp;
    use crate::fixtures::{SetBuilder, drain_template_json};
    use drain_api::annotations;

    fn valid() -> SetBuilder {
        SetBuilder::new("web")
            .replicas(2)
            .claim_template("data")
            .drain_template(&drain_template_json(&["data"]))
    }

    #[test]
    fn a_valid_set_gives_settings_that_allow_new_drains() {
        let set = valid()
            .annotation(annotations::MAX_ATTEMPTS, "3")
            .annotation(annotations::ON_SCALE_UP, "finish")
            .build();
        let v = validate(&set).unwrap();
        let s = settings(&set, Ok(&v), &Flags::default(), None);
        assert_eq!(
            s.new_drains,
            NewDrains::Allowed {
                template_hash: v.template.template_hash().to_owned()
            }
        );
        assert_eq!(s.max_attempts, Some(3));
        assert_eq!(s.on_scale_up, OnScaleUp::Finish);
        assert_eq!(s.max_concurrent, Some(1));
    }

    #[test]
    fn an_approval_annotation_that_does_not_parse_still_holds_deletes() {
        for (value, manual) in [
            ("manual", true),
            ("automatic", false),
            (" automatic ", false),
            ("Manual", true),
            ("yes", true),
            ("", true),
        ] {
            let set = valid().annotation(annotations::APPROVAL, value).build();
            let validated = validate(&set);
            let s = match &validated {
                Ok(v) => settings(&set, Ok(v), &Flags::default(), None),
                Err(_) => settings(&set, Err("invalid"), &Flags::default(), None),
            };
            assert_eq!(s.manual_approval, manual, "{value:?}");
        }
        let set = valid().build();
        let v = validate(&set).unwrap();
        assert!(!settings(&set, Ok(&v), &Flags::default(), None).manual_approval);
    }

    #[test]
    fn only_exit_code_spelt_exactly_lowers_the_proof() {
        for (value, proof) in [
            ("exit-code", SuccessProof::ExitCode),
            (" exit-code ", SuccessProof::ExitCode),
            ("completion-record", SuccessProof::CompletionRecord),
            ("Exit-Code", SuccessProof::CompletionRecord),
            ("exit 0", SuccessProof::CompletionRecord),
            ("", SuccessProof::CompletionRecord),
        ] {
            let set = valid()
                .annotation(annotations::SUCCESS_PROOF, value)
                .build();
            let validated = validate(&set);
            let s = match &validated {
                Ok(v) => settings(&set, Ok(v), &Flags::default(), None),
                Err(_) => settings(&set, Err("invalid"), &Flags::default(), None),
            };
            assert_eq!(s.proof, proof, "{value:?}");
        }
        let set = valid().build();
        let v = validate(&set).unwrap();
        assert_eq!(
            settings(&set, Ok(&v), &Flags::default(), None).proof,
            SuccessProof::CompletionRecord
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_reason() {
        let set = valid()
            .annotation(annotations::DRAINER_POD_TEMPLATE, "{not json")
            .build();
        let problems = validate(&set).unwrap_err();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].reason, "InvalidDrainTemplate");
        let set = valid().annotation(annotations::MAX_ATTEMPTS, "0").build();
        assert_eq!(
            validate(&set).unwrap_err()[0].reason,
            "InvalidDrainAnnotation"
        );
    }

    #[test]
    fn without_a_valid_template_no_new_drain_starts() {
        let set = valid().build();
        let s = settings(&set, Err("the set opted out"), &Flags::default(), None);
        assert_eq!(
            s.new_drains,
            NewDrains::Stopped {
                why: "the set opted out".to_owned()
            }
        );
        assert_eq!(s.on_scale_up, OnScaleUp::Cancel);
    }
}
