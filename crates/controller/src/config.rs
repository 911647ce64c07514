//! A StatefulSet's drain settings, parsed and validated once from its annotations.

use std::collections::BTreeMap;
use std::time::Duration;

use drain_api::annotations;
use k8s_openapi::api::apps::v1::StatefulSet;

/// What a scale-up does to a drain in flight for an ordinal that comes back in range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnScaleUp {
    /// The drain completes; the returning pod gets a fresh claim (annotation value `finish`). The
    /// returning pod waits at most the controller's `--scale-up-wait` without drain progress.
    Finish,
    /// The drain pod is stopped; the returning pod gets its claims back, unless the drain had
    /// already succeeded (annotation value `cancel`, the default).
    #[default]
    Cancel,
}

/// What proves that a drain pod finished, so that its claims may be deleted
/// ([`annotations::SUCCESS_PROOF`]).
///
/// The default is the completion record: a claim kept by mistake costs a retry of its drain,
/// a claim deleted by mistake costs its data, and an exit code of 0 is also what a program
/// stopped by SIGTERM (a liveness probe's kill, an eviction, a scale-up's cancel) often
/// returns. Only a program that finished writes the record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SuccessProof {
    /// A container that exited 0 wrote the completion record naming exactly the pod's claims
    /// (annotation value `completion-record`, the default).
    #[default]
    CompletionRecord,
    /// Every container exited 0, seen by the controller with no stop requested (annotation
    /// value `exit-code`); liveness and startup probes are refused on drain containers.
    ExitCode,
}

impl SuccessProof {
    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CompletionRecord => "completion-record",
            Self::ExitCode => "exit-code",
        }
    }
}

/// The drain settings of one StatefulSet, from its annotations; every value is already valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainConfig {
    /// Most drain pods that run at once; `None` when unset (see [`DrainConfig::concurrency_limit`]).
    pub max_concurrent: Option<u32>,
    /// What a scale-up does to a drain in flight.
    pub on_scale_up: OnScaleUp,
    /// Whether drain pods inherit placement and identity fields from the set's pod template.
    pub inherit_pod_spec: bool,
    /// Most failed attempts per ordinal before retrying stops; `None` is unlimited.
    pub max_attempts: Option<u32>,
    /// Time after an ordinal's first attempt after which retrying stops; `None` is unlimited.
    pub deadline: Option<Duration>,
    /// A running drain pod whose published progress has not changed this long is stalled;
    /// `None` (the default) never takes a drain as stalled.
    pub stall_after: Option<Duration>,
    /// Whether a drained claim is deleted only once a person approved it (`drain-approval:
    /// manual`).
    pub manual_approval: bool,
    /// What proves that a drain pod finished.
    pub proof: SuccessProof,
    /// How long a drained claim's volume is kept (reclaim policy `Retain`) after the claim is
    /// deleted; `None` (the default) keeps nothing.
    pub retain_volume_for: Option<Duration>,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            on_scale_up: OnScaleUp::Cancel,
            inherit_pod_spec: true,
            max_attempts: None,
            deadline: None,
            stall_after: None,
            manual_approval: false,
            proof: SuccessProof::CompletionRecord,
            retain_volume_for: None,
        }
    }
}

/// A drain annotation whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The annotation's value is not one the annotation accepts.
    #[error("invalid value {value:?} for annotation {annotation}: expected {expected}")]
    InvalidValue {
        /// The annotation key.
        annotation: &'static str,
        /// The value found.
        value: String,
        /// What the annotation accepts, in a few words.
        expected: &'static str,
    },
}

impl ConfigError {
    /// A short stable reason, used as Kubernetes Event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidValue { .. } => "InvalidDrainAnnotation",
        }
    }
}

const POSITIVE_INTEGER: &str = "a positive integer";

impl DrainConfig {
    /// Reads the drain annotations of a StatefulSet; absent annotations take their defaults.
    ///
    /// Values are trimmed of surrounding whitespace; words are case-sensitive. The first invalid
    /// annotation (in the order of the fields of [`DrainConfig`]) is reported.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let get = |key: &'static str| annotations.get(key).map(|value| (key, value.as_str()));
        let mut config = Self::default();
        if let Some((key, value)) = get(annotations::MAX_CONCURRENT) {
            config.max_concurrent = Some(positive(key, value)?);
        }
        if let Some((key, value)) = get(annotations::ON_SCALE_UP) {
            config.on_scale_up = match value.trim() {
                "finish" => OnScaleUp::Finish,
                "cancel" => OnScaleUp::Cancel,
                _ => return Err(invalid(key, value, "finish or cancel")),
            };
        }
        if let Some((key, value)) = get(annotations::INHERIT_POD_SPEC) {
            config.inherit_pod_spec = match value.trim() {
                "true" => true,
                "false" => false,
                _ => return Err(invalid(key, value, "true or false")),
            };
        }
        if let Some((key, value)) = get(annotations::MAX_ATTEMPTS) {
            config.max_attempts = Some(positive(key, value)?);
        }
        if let Some((key, value)) = get(annotations::DEADLINE_SECONDS) {
            let seconds = value
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&seconds| seconds > 0)
                .ok_or_else(|| invalid(key, value, POSITIVE_INTEGER))?;
            config.deadline = Some(Duration::from_secs(seconds));
        }
        if let Some((key, value)) = get(annotations::STALL_SECONDS) {
            config.stall_after = Some(Duration::from_secs(u64::from(positive(key, value)?)));
        }
        if let Some((key, value)) = get(annotations::APPROVAL) {
            config.manual_approval = match value.trim() {
                "manual" => true,
                "automatic" => false,
                _ => return Err(invalid(key, value, "manual or automatic")),
            };
        }
        if let Some((key, value)) = get(annotations::SUCCESS_PROOF) {
            config.proof = match value.trim() {
                "completion-record" => SuccessProof::CompletionRecord,
                "exit-code" => SuccessProof::ExitCode,
                _ => return Err(invalid(key, value, "completion-record or exit-code")),
            };
        }
        if let Some((key, value)) = get(annotations::RETAIN_VOLUME_FOR) {
            let duration = humantime::parse_duration(value.trim())
                .ok()
                .filter(|d| *d >= Duration::from_secs(1))
                .ok_or_else(|| invalid(key, value, "a duration of at least 1s, like 72h or 7d"))?;
            config.retain_volume_for = Some(duration);
        }
        Ok(config)
    }

    /// Reads the drain annotations of `set` (see [`DrainConfig::from_annotations`]).
    pub fn from_set(set: &StatefulSet) -> Result<Self, ConfigError> {
        match &set.metadata.annotations {
            Some(annotations) => Self::from_annotations(annotations),
            None => Ok(Self::default()),
        }
    }

    /// Most drain pods of `set` that may run at once; `None` is unlimited.
    ///
    /// The annotation wins; without it, `Parallel` sets are unlimited and `OrderedReady` sets
    /// (the Kubernetes default when the policy is unset) drain one ordinal at a time.
    pub fn concurrency_limit(&self, set: &StatefulSet) -> Option<u32> {
        if self.max_concurrent.is_some() {
            return self.max_concurrent;
        }
        let policy = set
            .spec
            .as_ref()
            .and_then(|spec| spec.pod_management_policy.as_deref());
        match policy {
            Some("Parallel") => None,
            _ => Some(1),
        }
    }
}

fn positive(annotation: &'static str, value: &str) -> Result<u32, ConfigError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(annotation, value, POSITIVE_INTEGER))
}

fn invalid(annotation: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::InvalidValue {
        annotation,
        value: value.to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::SetBuilder;
    use rstest::rstest;

    fn parse(pairs: &[(&str, &str)]) -> Result<DrainConfig, ConfigError> {
        let map = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        DrainConfig::from_annotations(&map)
    }

    #[test]
    fn defaults_without_annotations() {
        assert_eq!(parse(&[]), Ok(DrainConfig::default()));
        let config = DrainConfig::default();
        assert_eq!(config.on_scale_up, OnScaleUp::Cancel);
        assert!(config.inherit_pod_spec);
        assert_eq!(config.max_concurrent, None);
        assert_eq!(config.max_attempts, None);
        assert_eq!(config.deadline, None);
        assert_eq!(config.proof, SuccessProof::CompletionRecord);
    }

    #[test]
    fn reads_every_annotation() {
        let config = parse(&[
            (annotations::MAX_CONCURRENT, "3"),
            (annotations::ON_SCALE_UP, "finish"),
            (annotations::INHERIT_POD_SPEC, "false"),
            (annotations::MAX_ATTEMPTS, " 5 "),
            (annotations::DEADLINE_SECONDS, "600"),
            (annotations::STALL_SECONDS, "120"),
            (annotations::APPROVAL, "manual"),
            (annotations::SUCCESS_PROOF, "exit-code"),
            (annotations::RETAIN_VOLUME_FOR, "7d"),
            ("unrelated.example.com/key", "anything"),
        ]);
        assert_eq!(
            config,
            Ok(DrainConfig {
                max_concurrent: Some(3),
                on_scale_up: OnScaleUp::Finish,
                inherit_pod_spec: false,
                max_attempts: Some(5),
                deadline: Some(Duration::from_secs(600)),
                stall_after: Some(Duration::from_secs(120)),
                manual_approval: true,
                proof: SuccessProof::ExitCode,
                retain_volume_for: Some(Duration::from_secs(7 * 86_400)),
            })
        );
    }

    #[rstest]
    #[case::on_scale_up_finish(annotations::ON_SCALE_UP, "finish")]
    #[case::on_scale_up_cancel(annotations::ON_SCALE_UP, "cancel")]
    #[case::inherit_true(annotations::INHERIT_POD_SPEC, "true")]
    #[case::max_concurrent_one(annotations::MAX_CONCURRENT, "1")]
    #[case::stall_seconds(annotations::STALL_SECONDS, "300")]
    #[case::proof_record(annotations::SUCCESS_PROOF, "completion-record")]
    #[case::proof_exit_code(annotations::SUCCESS_PROOF, " exit-code ")]
    #[case::retain_hours(annotations::RETAIN_VOLUME_FOR, "72h")]
    #[case::retain_compound(annotations::RETAIN_VOLUME_FOR, " 1h 30m ")]
    #[case::retain_ages(annotations::RETAIN_VOLUME_FOR, "100000years")]
    fn accepts(#[case] annotation: &str, #[case] value: &str) {
        assert!(parse(&[(annotation, value)]).is_ok());
    }

    #[rstest]
    #[case::max_concurrent_zero(annotations::MAX_CONCURRENT, "0")]
    #[case::retain_bare_number(annotations::RETAIN_VOLUME_FOR, "3600")]
    #[case::retain_zero(annotations::RETAIN_VOLUME_FOR, "0s")]
    #[case::retain_under_a_second(annotations::RETAIN_VOLUME_FOR, "500ms")]
    #[case::retain_negative(annotations::RETAIN_VOLUME_FOR, "-1h")]
    #[case::retain_empty(annotations::RETAIN_VOLUME_FOR, "")]
    #[case::max_concurrent_negative(annotations::MAX_CONCURRENT, "-1")]
    #[case::max_concurrent_word(annotations::MAX_CONCURRENT, "many")]
    #[case::max_concurrent_empty(annotations::MAX_CONCURRENT, "")]
    #[case::on_scale_up_unknown(annotations::ON_SCALE_UP, "abort")]
    #[case::on_scale_up_capitalised(annotations::ON_SCALE_UP, "Cancel")]
    #[case::inherit_yes(annotations::INHERIT_POD_SPEC, "yes")]
    #[case::max_attempts_zero(annotations::MAX_ATTEMPTS, "0")]
    #[case::max_attempts_fraction(annotations::MAX_ATTEMPTS, "1.5")]
    #[case::deadline_zero(annotations::DEADLINE_SECONDS, "0")]
    #[case::deadline_with_unit(annotations::DEADLINE_SECONDS, "10m")]
    #[case::stall_zero(annotations::STALL_SECONDS, "0")]
    #[case::stall_with_unit(annotations::STALL_SECONDS, "5m")]
    #[case::proof_unknown(annotations::SUCCESS_PROOF, "exit-0")]
    #[case::proof_capitalised(annotations::SUCCESS_PROOF, "Exit-Code")]
    fn rejects(#[case] annotation: &str, #[case] value: &str) {
        let error = parse(&[(annotation, value)]).unwrap_err();
        assert_eq!(error.reason(), "InvalidDrainAnnotation");
        let message = error.to_string();
        assert!(message.contains(annotation), "{message}");
        assert!(message.contains(&format!("{value:?}")), "{message}");
    }

    #[rstest]
    #[case::ordered_ready_default(None, None, Some(1))]
    #[case::ordered_ready(Some("OrderedReady"), None, Some(1))]
    #[case::parallel(Some("Parallel"), None, None)]
    #[case::annotation_wins(Some("Parallel"), Some("4"), Some(4))]
    fn concurrency_limit(
        #[case] policy: Option<&str>,
        #[case] annotation: Option<&str>,
        #[case] expected: Option<u32>,
    ) {
        let mut builder = SetBuilder::new("web");
        if let Some(policy) = policy {
            builder = builder.pod_management_policy(policy);
        }
        if let Some(value) = annotation {
            builder = builder.annotation(annotations::MAX_CONCURRENT, value);
        }
        let set = builder.build();
        let config = DrainConfig::from_set(&set).unwrap();
        assert_eq!(config.concurrency_limit(&set), expected);
    }
}
