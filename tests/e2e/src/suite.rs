//! The fault suite's shared parts (issues 10 and 21): a seeded random source whose seed is
//! printed, a log of the faults injected, the independent checker around a scenario (record,
//! the drains' witness, settle, verdict) and the faults themselves (a drain pod deleted or
//! evicted, a cluster component restarted).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use checker::{Recorder, Verdict};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, ListParams};
use kube::{Client, ResourceExt};

use crate::witness::Witness;
use crate::{TestNamespace, repo_root};

/// Prints a line of the suite's report (seed, faults, verdict) on stderr, past the test
/// harness's output capture, so a passing run shows it too.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A small seeded random source (SplitMix64): the same seed gives the same faults.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `STSD_FAULT_SEED` if set, else from the clock; prints the seed and how to
    /// replay it, naming the scenario.
    pub fn for_scenario(scenario: &str) -> Self {
        let seed = std::env::var("STSD_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        say(format_args!(
            "[{scenario}] seed {seed} (replay: STSD_FAULT_SEED={seed})"
        ));
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` if empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// A duration of `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// One of `items`, if any.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.range(0, items.len() as u64) as usize])
    }
}

/// The faults a scenario injected, counted by kind and listed with their instants.
pub struct FaultLog {
    scenario: String,
    start: Instant,
    counts: BTreeMap<&'static str, u32>,
    lines: String,
}

impl FaultLog {
    /// An empty log for `scenario`.
    pub fn new(scenario: &str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            start: Instant::now(),
            counts: BTreeMap::new(),
            lines: String::new(),
        }
    }

    /// Records one fault of `kind` with a detail.
    pub fn add(&mut self, kind: &'static str, detail: impl std::fmt::Display) {
        *self.counts.entry(kind).or_default() += 1;
        let _ = writeln!(
            self.lines,
            "  {:>7.2}s {kind}: {detail}",
            self.start.elapsed().as_secs_f64()
        );
    }

    /// How many faults of `kind` were injected.
    pub fn count(&self, kind: &str) -> u32 {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    /// Prints the summary and every fault.
    pub fn print(&self) {
        say(format_args!(
            "[{}] faults injected: {:?}\n{}",
            self.scenario, self.counts, self.lines
        ));
    }
}

/// Where a scenario's I1 takes the drains' word that they finished from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum I1From {
    /// The drain scripts' reports to the scenario's [`crate::witness::Witness`]: every drain
    /// script must be built with [`Checked::drain_script`].
    Witness,
    /// The completion records in the drain pods' termination messages: for drains the test
    /// cannot script (the example datastore's `drainer` image). The same evidence the
    /// controller reads, so the drain itself must be judged from its data (I4).
    TerminationMessages,
}

/// The independent checker around a scenario: it records the namespace from before the first
/// object is created until the scenario has settled, and (under [`I1From::Witness`]) runs the
/// witness the drain scripts report their completion to.
pub struct Checked {
    scenario: String,
    recorder: Recorder,
    witness: Option<Witness>,
}

impl Checked {
    /// Starts recording `ns` (and the witness, under [`I1From::Witness`]) and waits until the
    /// checker's watches have listed.
    pub async fn start(
        client: &Client,
        ns: &TestNamespace,
        scenario: &str,
        i1: I1From,
    ) -> Result<Self> {
        let witness = match i1 {
            I1From::Witness => Some(Witness::start().await?),
            I1From::TerminationMessages => None,
        };
        let recorder = Recorder::start(client, &ns.name);
        ensure!(
            recorder.wait_listed(1, Duration::from_secs(30)).await,
            "the checker's watches did not start"
        );
        if let Some(w) = &witness {
            say(format_args!(
                "[{scenario}] witness listening on {}",
                w.addr()
            ));
        }
        Ok(Self {
            scenario: scenario.to_owned(),
            recorder,
            witness,
        })
    }

    /// A drain script that runs `drain` and, as its last step, reports its completion to the
    /// witness ([`Witness::script`]), for `e2e::objects::drain_template`.
    ///
    /// # Panics
    /// When the scenario's I1 is not judged from the witness (a mistake in the scenario).
    pub fn drain_script(&self, drain: &str) -> String {
        self.witness
            .as_ref()
            .unwrap_or_else(|| panic!("[{}] has no witness to report to", self.scenario))
            .script(drain)
    }

    /// As [`Checked::drain_script`], reporting only the claim of `template`
    /// ([`Witness::claim_script`]): for a container that drains one claim of several.
    ///
    /// # Panics
    /// When the scenario's I1 is not judged from the witness (a mistake in the scenario).
    pub fn claim_drain_script(&self, drain: &str, template: &str) -> String {
        self.witness
            .as_ref()
            .unwrap_or_else(|| panic!("[{}] has no witness to report to", self.scenario))
            .claim_script(drain, template)
    }

    /// The recorder (e.g. to wait for it to list again after an API server restart).
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// I3: waits until nothing is left unsettled, at most `bound` (it must stay settled for
    /// one second); how long it took.
    pub async fn settle(&self, bound: Duration) -> Result<Duration> {
        let start = Instant::now();
        let mut settled_since: Option<Instant> = None;
        loop {
            let left = checker::unsettled(&self.recorder.history());
            if left.is_empty() {
                let since = *settled_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(1) {
                    let took = since - start;
                    say(format_args!(
                        "[{}] I3 holds: settled {:.1}s after the faults stopped",
                        self.scenario,
                        took.as_secs_f64()
                    ));
                    return Ok(took);
                }
            } else {
                settled_since = None;
                if start.elapsed() > bound {
                    bail!(
                        "[{}] I3 violated: not settled {bound:?} after the faults stopped: {left:#?}",
                        self.scenario
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops recording and checks I1 and I2 over everything recorded; fails on a violation, or
    /// when the witness received a line that was not a completion record (a drain handed a
    /// broken record).
    pub fn verdict(self) -> Result<Verdict> {
        let lists = self.recorder.lists();
        let (witness, rejected) = match &self.witness {
            Some(w) => (checker::Witness::Reports(w.reports()), w.rejected()),
            None => (checker::Witness::TerminationMessages, Vec::new()),
        };
        let verdict = checker::check(&self.recorder.stop(), &witness);
        say(format_args!(
            "[{}] checker: {verdict} (lists: {lists:?})",
            self.scenario
        ));
        ensure!(verdict.ok(), "[{}] {verdict}", self.scenario);
        ensure!(
            rejected.is_empty(),
            "[{}] the witness received {} reports that were not completion records: {rejected:?}",
            self.scenario,
            rejected.len()
        );
        Ok(verdict)
    }
}

/// The drain pods of the namespace that are not being deleted, by name.
pub async fn live_drain_pods(ns: &TestNamespace) -> Result<Vec<String>> {
    let lp = ListParams::default().labels(drain_api::labels::DRAIN_POD);
    Ok(ns
        .api::<Pod>()
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.name_any())
        .collect())
}

/// Deletes a drain pod as a person or a node drain would (its grace period: it is asked to
/// stop); NotFound is fine (it may have finished).
pub async fn delete_pod(ns: &TestNamespace, name: &str) -> Result<()> {
    match ns.api::<Pod>().delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("delete pod {name}")),
    }
}

/// Evicts a drain pod through the Eviction API; NotFound is fine.
pub async fn evict_pod(ns: &TestNamespace, name: &str) -> Result<()> {
    match ns.api::<Pod>().evict(name, &EvictParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("evict pod {name}")),
    }
}

/// Kills a component of the local cluster with SIGKILL, as a crash would, and starts it again
/// (`tests/cluster/restart --kill`); the seconds it was away.
pub async fn restart_component(name: &str) -> Result<f64> {
    let out = tokio::process::Command::new(repo_root().join("tests/cluster/restart"))
        .args(["--kill", name])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("run tests/cluster/restart")?;
    ensure!(
        out.status.success(),
        "tests/cluster/restart {name} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .with_context(|| format!("tests/cluster/restart printed {text:?}"))
}
