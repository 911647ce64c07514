//! The controller's Prometheus metrics, prefixed `statefulset_drain_`, served on the admin port
//! ([`crate::runtime::admin`]). Labels are bounded: `namespace` and `statefulset` only for sets
//! that opted in; a set's series go when the set is deleted ([`Metrics::retain_sets`]). Each
//! family is described in docs/operations.md (a test checks the two name the same families).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::plan::{Action, FailureKind, OrdinalState, Plan, PodKind, Snapshot};

/// A set's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct SetLabels {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub statefulset: String,
}

impl SetLabels {
    /// Labels of set `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            statefulset: name.to_owned(),
        }
    }
}

/// A set's labels and a failure kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub statefulset: String,
    /// `failed`, `stuck`, `stalled`, `deadline_exceeded`, `vanished` or `unproven`.
    pub kind: String,
}

/// A reconcile's result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// A reconcile error's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The error's reason.
    pub reason: String,
}

/// An API request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `get`, `list`, `create`, `patch`, `delete`.
    pub verb: String,
    /// `pods`, `persistentvolumeclaims`, `persistentvolumes`, `nodes`, `statefulsets` (Events are not
    /// counted).
    pub resource: String,
    /// HTTP status, `0` when no answer came.
    pub code: String,
}

/// Every metric, and the registry that serves them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Drain pods created.
    pub drains_started: Family<SetLabels, Counter>,
    /// Attempts after the first.
    pub drains_retried: Family<SetLabels, Counter>,
    /// Drains proven successful.
    pub drains_succeeded: Family<SetLabels, Counter>,
    /// Failed attempts by kind.
    pub drains_failed: Family<FailureLabels, Counter>,
    /// Interrupted attempts.
    pub drains_interrupted: Family<SetLabels, Counter>,
    /// Ordinals given up.
    pub drains_gave_up: Family<SetLabels, Counter>,
    /// Ordinals with a drain pod.
    pub drains_in_progress: Family<SetLabels, Gauge>,
    /// Drains quiet for `--quiet-after`.
    pub quiet_drains: Family<SetLabels, Gauge>,
    /// Drains whose drain pod is bound to a lost node.
    pub drains_on_lost_nodes: Family<SetLabels, Gauge>,
    /// Ordinals waiting for a drain.
    pub orphaned_claims_waiting: Family<SetLabels, Gauge>,
    /// Drain pod created → finished, successful drains.
    pub drain_duration: Family<SetLabels, Histogram, fn() -> Histogram>,
    /// Stateful pod gone → drain pod created.
    pub reaction: Histogram,
    /// Reconciles by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Reconcile errors by reason.
    pub reconcile_errors: Family<ReasonLabels, Counter>,
    /// API requests by verb, resource and status.
    pub kube_requests: Family<RequestLabels, Counter>,
    /// `1` while this replica may act.
    pub leader: Gauge,
    /// When stateful pods were seen gone, by `namespace/name`, until a drain pod is made.
    gone: Mutex<HashMap<String, Instant>>,
    /// The sets that have series in the per-set families.
    sets: Mutex<BTreeSet<SetLabels>>,
}

/// The `kind` label of `drains_failed_total` for a failure of `kind` (an interrupted drain is
/// counted by `drains_interrupted_total` instead).
fn failure_label(kind: FailureKind) -> Option<&'static str> {
    match kind {
        FailureKind::Interrupted => None,
        FailureKind::Failed => Some("failed"),
        FailureKind::Stuck => Some("stuck"),
        FailureKind::Stalled => Some("stalled"),
        FailureKind::DeadlineExceeded => Some("deadline_exceeded"),
        FailureKind::Vanished => Some("vanished"),
        FailureKind::Unproven => Some("unproven"),
    }
}

/// Every `kind` label of `drains_failed_total`.
const FAILURE_KINDS: [FailureKind; 7] = [
    FailureKind::Failed,
    FailureKind::Interrupted,
    FailureKind::Stuck,
    FailureKind::Stalled,
    FailureKind::DeadlineExceeded,
    FailureKind::Vanished,
    FailureKind::Unproven,
];

/// How long a pod's disappearance is remembered for the reaction histogram.
const GONE_TTL: Duration = Duration::from_secs(600);

impl Default for Metrics {
    fn default() -> Self {
        // 1 s to about 9 h.
        let drain_duration =
            Family::<SetLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 2.0, 16))
            });
        let mut m = Self {
            registry: Registry::with_prefix("statefulset_drain"),
            drains_started: Family::default(),
            drains_retried: Family::default(),
            drains_succeeded: Family::default(),
            drains_failed: Family::default(),
            drains_interrupted: Family::default(),
            drains_gave_up: Family::default(),
            drains_in_progress: Family::default(),
            quiet_drains: Family::default(),
            drains_on_lost_nodes: Family::default(),
            orphaned_claims_waiting: Family::default(),
            drain_duration,
            // 1 ms to about 33 s.
            reaction: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            kube_requests: Family::default(),
            leader: Gauge::default(),
            gone: Mutex::default(),
            sets: Mutex::default(),
        };
        let r = &mut m.registry;
        r.register(
            "drains_started",
            "Drain pods created (every attempt)",
            m.drains_started.clone(),
        );
        r.register(
            "drains_retried",
            "Drain attempts after the first",
            m.drains_retried.clone(),
        );
        r.register(
            "drains_succeeded",
            "Drains proven successful (claims deleted)",
            m.drains_succeeded.clone(),
        );
        r.register(
            "drains_failed",
            "Failed drain attempts by kind",
            m.drains_failed.clone(),
        );
        r.register(
            "drains_interrupted",
            "Drain pods that exited 0 after being asked to stop",
            m.drains_interrupted.clone(),
        );
        r.register(
            "drains_gave_up",
            "Ordinals whose retrying stopped",
            m.drains_gave_up.clone(),
        );
        r.register(
            "drains_in_progress",
            "Ordinals with a drain pod",
            m.drains_in_progress.clone(),
        );
        r.register(
            "quiet_drains",
            "Drains with no progress and no container change for --quiet-after",
            m.quiet_drains.clone(),
        );
        r.register(
            "drains_on_lost_nodes",
            "Drains whose drain pod is bound to a node not ready for --node-lost-after, or deleted",
            m.drains_on_lost_nodes.clone(),
        );
        r.register(
            "orphaned_claims_waiting",
            "Ordinals whose claims wait for a drain",
            m.orphaned_claims_waiting.clone(),
        );
        r.register(
            "drain_duration_seconds",
            "Drain pod created to finished, successful drains",
            m.drain_duration.clone(),
        );
        r.register(
            "reaction_seconds",
            "Stateful pod gone to drain pod created (first attempts)",
            m.reaction.clone(),
        );
        r.register("reconciles", "Reconciles by result", m.reconciles.clone());
        r.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            m.reconcile_errors.clone(),
        );
        r.register(
            "kube_requests",
            "The controller's own Kubernetes API requests",
            m.kube_requests.clone(),
        );
        r.register(
            "leader",
            "1 while this replica may act (leader, or no leader election)",
            m.leader.clone(),
        );
        m
    }
}

impl Metrics {
    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Notes that the stateful pod `namespace/name` is gone (a watch delete event).
    pub fn pod_gone(&self, namespace: &str, name: &str) {
        let mut gone = self.gone.lock().expect("metrics lock");
        let now = Instant::now();
        gone.retain(|_, at| now.duration_since(*at) < GONE_TTL);
        gone.insert(format!("{namespace}/{name}"), now);
    }

    /// Observes the reaction time of a first drain pod created for `namespace/name`.
    pub fn drain_pod_created(&self, namespace: &str, name: &str) {
        let at = self
            .gone
            .lock()
            .expect("metrics lock")
            .remove(&format!("{namespace}/{name}"));
        if let Some(at) = at {
            self.reaction.observe(at.elapsed().as_secs_f64());
        }
    }

    /// Counts what one reconcile of set `namespace/name` did: the actions of `plan` carried out
    /// (those of ordinals in `failed` are not counted: they are tried again), and the gauges
    /// from its status.
    pub fn record_reconcile(
        &self,
        namespace: &str,
        name: &str,
        plan: &Plan,
        snap: &Snapshot,
        failed: &BTreeSet<i32>,
    ) {
        let set = SetLabels::new(namespace, name);
        // Held until the series are written: a sweep of deleted sets (`retain_sets`) in between
        // would leave them for ever.
        let mut sets = self.sets.lock().expect("metrics lock");
        sets.insert(set.clone());
        for action in plan
            .actions
            .iter()
            .filter(|a| !failed.contains(&a.ordinal()))
        {
            match action {
                Action::CreateDrainPod {
                    ordinal, attempt, ..
                } => {
                    self.drains_started.get_or_create(&set).inc();
                    if *attempt > 1 {
                        self.drains_retried.get_or_create(&set).inc();
                    } else {
                        self.drain_pod_created(
                            namespace,
                            &drain_api::names::pod_name(name, *ordinal),
                        );
                    }
                }
                Action::RecordFailure { kind, gave_up, .. } => {
                    if *kind == FailureKind::Interrupted {
                        self.drains_interrupted.get_or_create(&set).inc();
                    }
                    if let Some(kind) = failure_label(*kind) {
                        self.drains_failed
                            .get_or_create(&FailureLabels {
                                namespace: namespace.to_owned(),
                                statefulset: name.to_owned(),
                                kind: kind.to_owned(),
                            })
                            .inc();
                    }
                    if *gave_up {
                        self.drains_gave_up.get_or_create(&set).inc();
                    }
                }
                Action::DeleteClaims { ordinal, .. } => {
                    self.drains_succeeded.get_or_create(&set).inc();
                    let took = snap.pods.iter().find_map(|p| match &p.kind {
                        PodKind::Drain(d) if p.ordinal == *ordinal => {
                            Some(d.finished_at?.duration_since(d.created_at?))
                        }
                        _ => None,
                    });
                    if let Some(took) = took {
                        self.drain_duration
                            .get_or_create(&set)
                            .observe(took.as_secs_f64().max(0.0));
                    }
                }
                _ => {}
            }
        }
        let count = |f: fn(&OrdinalState) -> bool| {
            i64::try_from(plan.status.values().filter(|s| f(s)).count()).unwrap_or(i64::MAX)
        };
        self.drains_in_progress.get_or_create(&set).set(count(|s| {
            matches!(
                s,
                OrdinalState::Draining { .. } | OrdinalState::Stuck { .. }
            )
        }));
        self.quiet_drains
            .get_or_create(&set)
            .set(i64::try_from(plan.quiet.len()).unwrap_or(i64::MAX));
        self.drains_on_lost_nodes
            .get_or_create(&set)
            .set(i64::try_from(plan.on_lost_nodes.len()).unwrap_or(i64::MAX));
        self.orphaned_claims_waiting
            .get_or_create(&set)
            .set(count(|s| {
                matches!(
                    s,
                    OrdinalState::Waiting { .. } | OrdinalState::Retrying { .. }
                )
            }));
    }

    /// Removes the series of every set for which `keep` is false (sets deleted): a deleted
    /// set's gauges would otherwise show its last drains in progress for ever, and the labels
    /// of sets come and gone would pile up.
    pub fn retain_sets(&self, keep: impl Fn(&SetLabels) -> bool) {
        let mut sets = self.sets.lock().expect("metrics lock");
        sets.retain(|set| {
            if keep(set) {
                return true;
            }
            self.drains_started.remove(set);
            self.drains_retried.remove(set);
            self.drains_succeeded.remove(set);
            self.drains_interrupted.remove(set);
            self.drains_gave_up.remove(set);
            self.drains_in_progress.remove(set);
            self.quiet_drains.remove(set);
            self.drains_on_lost_nodes.remove(set);
            self.orphaned_claims_waiting.remove(set);
            self.drain_duration.remove(set);
            for kind in FAILURE_KINDS.into_iter().filter_map(failure_label) {
                self.drains_failed.remove(&FailureLabels {
                    namespace: set.namespace.clone(),
                    statefulset: set.statefulset.clone(),
                    kind: kind.to_owned(),
                });
            }
            false
        });
    }

    /// Counts an API request and its outcome.
    pub fn request<T>(&self, verb: &str, resource: &str, result: &Result<T, kube::Error>) {
        let code = match result {
            Ok(_) => "200".to_owned(),
            Err(kube::Error::Api(s)) => s.code.to_string(),
            Err(_) => "0".to_owned(),
        };
        self.kube_requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                code,
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_the_prefix() {
        let m = Metrics::default();
        let set = SetLabels::new("ns", "web");
        m.drains_started.get_or_create(&set).inc();
        m.drains_failed
            .get_or_create(&FailureLabels {
                namespace: "ns".into(),
                statefulset: "web".into(),
                kind: "stuck".into(),
            })
            .inc();
        m.drain_duration.get_or_create(&set).observe(3.0);
        m.request::<()>("delete", "pods", &Ok(()));
        let text = m.render();
        for needle in [
            r#"statefulset_drain_drains_started_total{namespace="ns",statefulset="web"} 1"#,
            r#"statefulset_drain_drains_failed_total{namespace="ns",statefulset="web",kind="stuck"} 1"#,
            r#"statefulset_drain_drain_duration_seconds_count{namespace="ns",statefulset="web"} 1"#,
            r#"statefulset_drain_kube_requests_total{verb="delete",resource="pods",code="200"} 1"#,
            "# TYPE statefulset_drain_reaction_seconds histogram",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
    }

    /// The metrics reference in docs/operations.md and the registry name the same families:
    /// a metric added, renamed or removed in the code fails here until the reference says so.
    #[test]
    fn the_metrics_reference_names_every_family_and_only_those() {
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
        )
        .expect("docs/operations.md");
        let documented: std::collections::BTreeSet<String> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `statefulset_drain_"))
            .filter_map(|l| l.split('`').next())
            .map(|name| format!("statefulset_drain_{name}"))
            .collect();
        // Every family registered in the code (a family without samples renders nothing, so
        // the source is read, not the output); counters are served with `_total`.
        let source = include_str!("metrics.rs");
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        let served: std::collections::BTreeSet<String> = code
            .split("r.register(")
            .skip(1)
            .filter_map(|call| call.split('"').nth(1))
            .map(|name| format!("statefulset_drain_{name}"))
            .collect();
        let documented: std::collections::BTreeSet<String> = documented
            .into_iter()
            .map(|n| n.strip_suffix("_total").map(str::to_owned).unwrap_or(n))
            .collect();
        assert_eq!(
            documented, served,
            "the metrics reference (docs/operations.md) and the registry differ"
        );
    }

    /// A set of one replica, `set`, whose claims of `ordinals` are orphaned.
    fn orphaned(set: &str, ordinals: &[i32]) -> Snapshot {
        let claim = |o: i32| crate::plan::Claim {
            name: format!("data-{set}-{o}"),
            uid: format!("uid-{o}"),
            template: "data".into(),
            ordinal: o,
            terminating: false,
            record: crate::plan::DrainRecord::default(),
        };
        Snapshot {
            set_name: set.into(),
            replicas: 1,
            claim_templates: vec!["data".to_owned()],
            claims: ordinals.iter().map(|o| claim(*o)).collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_reconcile_counts_the_actions_carried_out_and_sets_the_gauges() {
        use crate::plan::{self, Settings};
        use jiff::Timestamp;
        let m = Metrics::default();
        // Two orphaned ordinals of a Parallel-like set (no limit): two drain pods created.
        let snap = orphaned("web", &[1, 2]);
        let settings = Settings {
            max_concurrent: None,
            ..Settings::default()
        };
        let p = plan::plan(&snap, &settings, Timestamp::now());
        m.pod_gone("ns", "web-2");
        m.record_reconcile("ns", "web", &p, &snap, &BTreeSet::from([1]));
        let text = m.render();
        for needle in [
            r#"statefulset_drain_drains_started_total{namespace="ns",statefulset="web"} 1"#,
            r#"statefulset_drain_drains_in_progress{namespace="ns",statefulset="web"} 2"#,
            "statefulset_drain_reaction_seconds_count 1",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
    }

    #[test]
    fn the_series_of_a_deleted_set_go_and_the_others_stay() {
        use crate::plan::{self, Settings};
        use jiff::Timestamp;
        let m = Metrics::default();
        let snap = orphaned("x", &[1]);
        let p = plan::plan(&snap, &Settings::default(), Timestamp::now());
        for name in ["web", "db"] {
            m.record_reconcile("ns", name, &p, &snap, &BTreeSet::new());
            m.drains_failed
                .get_or_create(&FailureLabels {
                    namespace: "ns".into(),
                    statefulset: name.into(),
                    kind: "vanished".into(),
                })
                .inc();
            m.drain_duration
                .get_or_create(&SetLabels::new("ns", name))
                .observe(2.0);
        }
        m.retain_sets(|s| s.statefulset == "db");
        let text = m.render();
        assert!(
            !text.contains(r#"statefulset="web""#),
            "web's series left:\n{text}"
        );
        for needle in [
            r#"statefulset_drain_drains_in_progress{namespace="ns",statefulset="db"} 1"#,
            r#"statefulset_drain_drains_started_total{namespace="ns",statefulset="db"} 1"#,
            r#"statefulset_drain_drains_failed_total{namespace="ns",statefulset="db",kind="vanished"} 1"#,
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        // A set reconciled again after its series went gets them back.
        m.record_reconcile("ns", "web", &p, &snap, &BTreeSet::new());
        assert!(m.render().contains(
            r#"statefulset_drain_drains_in_progress{namespace="ns",statefulset="web"} 1"#
        ));
    }

    #[test]
    fn reaction_is_observed_once_per_pod_gone() {
        let m = Metrics::default();
        m.drain_pod_created("ns", "web-2");
        assert!(
            m.render()
                .contains("statefulset_drain_reaction_seconds_count 0")
        );
        m.pod_gone("ns", "web-2");
        m.drain_pod_created("ns", "web-2");
        m.drain_pod_created("ns", "web-2");
        assert!(
            m.render()
                .contains("statefulset_drain_reaction_seconds_count 1")
        );
    }
}
