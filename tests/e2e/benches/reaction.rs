//! Reaction latency of the controller on the real local cluster, side by side with a floor
//! measured in the same run (issue 27). Not a test: it prints figures and writes them to
//! `tests/bench/results/reaction.txt`.
//!
//! Three Parallel sets of `STSD_BENCH_REPLICAS` (10), alike but for who drains them, each in
//! a namespace of its own: the controller drains one (opted in); the floor
//! ([`common::floor`], a minimal drain controller this program runs with a client of its own)
//! the second; the 2018 proof of concept ([`common::poc`], `tests/bench/poc`, its own
//! annotation) the third, as the peer. They take turns, one cycle each, the side that goes
//! first rotating, so none ever reacts to another's events or queues behind its writes, and
//! all see the same background load. The cycles, in a fixed shuffled order:
//! - **bursts** (`STSD_BENCH_BURSTS`, 40 per side): the set scaled to 0, 10 drains at once;
//! - **singles** (`STSD_BENCH_SINGLES`, 100 per side): one pod removed (scaled down by one);
//! - **after idle** (`STSD_BENCH_IDLE_CYCLES`, 3 per side): a single after
//!   `STSD_BENCH_IDLE_SECS` (100) of quiet, longer than the idle timeout of the clients'
//!   pooled connections (90 s), so a reaction that needs a new connection shows.
//!
//! `STSD_BENCH_MINUTES` bounds the cycles' time: no cycle starts after it, and the report
//! covers the cycles made and says so (the full run takes 100 minutes on a quiet machine and
//! half as long again on a busier one).
//!
//! Every cycle ends with the set scaled back up and every pod Running. All times come from this
//! program's own watches of the two namespaces, the same way for both sides:
//! - **pod gone → drain pod created**: a stateful pod's Deleted event → the Added event of the
//!   drain pod of that name;
//! - **drain finished → claim deleted**: the drain pod's first event that shows its program
//!   finished well (every container terminated with 0, or the phase Succeeded) → the first
//!   event of its claim with a deletion timestamp;
//! - **bare watch latency** (the baseline of the floor itself): a ConfigMap create request
//!   sent → its Added event, 100 before the cycles and one every 500 ms during them (one write
//!   each, little load of its own); and a Pod the same way, 100 before the cycles.
//!
//! Each ratio to the floor comes with its 90% interval over the rounds
//! ([`e2e::stats::ratio_interval`]): a burst's ten samples share their moment, so the rounds,
//! not the samples, are what a run has of each (40 bursts, 100 singles), and two runs of one
//! binary differ by about as much as that interval says.
//!
//! Run by `tests/bench/run`.

#[allow(dead_code)] // each bench uses a part of what they share
mod common;

use std::time::Duration;

use anyhow::{Result, ensure};
use common::floor::Floor;
use common::poc::{self, Poc};
use common::*;
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::labels::DRAIN_POD;
use e2e::objects::drain_template_without_record;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::stats::ratio_interval;
use e2e::{ControllerProcess, TestNamespace, client, wait_for};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use serde_json::json;

/// How long after a scale-down a removed ordinal's claim without its pod is taken for one the
/// StatefulSet controller made again ([`Side::cycle`]).
/// The reaction budget (issue 42 §2): the controller's p50 and p99 at most these ratios to the
/// floor's, for both the reaction and the cleanup.
const P50_BUDGET: f64 = 1.3;
const P99_BUDGET: f64 = 1.5;

/// Whether a p50 and a p99 ratio keep to the budget.
fn met(p50: f64, p99: f64) -> &'static str {
    if p50 <= P50_BUDGET && p99 <= P99_BUDGET {
        "met"
    } else {
        "NOT met"
    }
}

const ORPHAN_AFTER: Duration = Duration::from_secs(20);

/// One cycle of one side.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cycle {
    /// The set scaled to 0.
    Burst,
    /// The set scaled down by one.
    Single,
    /// As `Single`, after an idle period.
    AfterIdle,
}

/// The samples of one side, each with its round (its cycle's place in the schedule, the same
/// for every side) and its kind of cycle.
#[derive(Default)]
struct Samples {
    reactions: Vec<(usize, Cycle, Duration)>,
    cleanups: Vec<(usize, Cycle, Duration)>,
}

impl Samples {
    fn reactions(&self, of: &[Cycle]) -> Vec<Duration> {
        untag(&pick(&self.reactions, of))
    }
    fn cleanups(&self, of: &[Cycle]) -> Vec<Duration> {
        untag(&pick(&self.cleanups, of))
    }
    /// The reactions of those kinds, with their rounds.
    fn reactions_by_round(&self, of: &[Cycle]) -> Vec<(usize, Duration)> {
        pick(&self.reactions, of)
    }
    /// The cleanups of those kinds, with their rounds.
    fn cleanups_by_round(&self, of: &[Cycle]) -> Vec<(usize, Duration)> {
        pick(&self.cleanups, of)
    }
}

fn pick(samples: &[(usize, Cycle, Duration)], of: &[Cycle]) -> Vec<(usize, Duration)> {
    samples
        .iter()
        .filter(|(_, c, _)| of.contains(c))
        .map(|(r, _, d)| (*r, *d))
        .collect()
}

fn untag(samples: &[(usize, Duration)]) -> Vec<Duration> {
    samples.iter().map(|(_, d)| *d).collect()
}

/// ` (90% lo-hi)`: the interval of the ratio of `a`'s and `b`'s `q` quantiles, rounds
/// resampled ([`ratio_interval`]); nothing without a round both have.
fn interval(a: &[(usize, Duration)], b: &[(usize, Duration)], q: f64) -> String {
    ratio_interval(a, b, q)
        .map(|(_, lo, hi)| format!(" (90% {lo:.2}-{hi:.2})"))
        .unwrap_or_default()
}

/// One side: a namespace, this program's watches of it, the label of its drain pods, and the
/// set's size.
struct Side {
    name: &'static str,
    ns: TestNamespace,
    drain_label: &'static str,
    watches: Watches,
    /// Whether the bench deletes a removed ordinal's claim made again without its pod (for
    /// the floor, which reacts only to pods' deletions; the controller and the PoC drain such
    /// a claim themselves).
    cleans_orphans: bool,
    replicas: i32,
    samples: Samples,
}

impl Side {
    /// A side named `name` in a new namespace (`prefix`), watched, with no samples yet.
    async fn new(
        client: &kube::Client,
        name: &'static str,
        prefix: &str,
        drain_label: &'static str,
        cleans_orphans: bool,
        replicas: i32,
    ) -> Result<Self> {
        let ns = TestNamespace::new(client, prefix).await?;
        Ok(Self {
            name,
            watches: Watches::start(&ns).await?,
            ns,
            drain_label,
            cleans_orphans,
            replicas,
            samples: Samples::default(),
        })
    }

    /// What a cycle whose wait timed out is left with: the removed ordinals' claims and the
    /// drain pods still there, each described (their state says whose step is missing).
    async fn left_over(&self, removed: &[String]) -> String {
        let mut lines = Vec::new();
        let claims = self.ns.api::<PersistentVolumeClaim>();
        match claims.list(&ListParams::default()).await {
            Ok(list) => lines.extend(
                list.items
                    .iter()
                    .filter(|c| {
                        c.metadata
                            .name
                            .as_ref()
                            .is_some_and(|n| removed.contains(n))
                    })
                    .map(describe_claim),
            ),
            Err(e) => lines.push(format!("could not list the claims: {e}")),
        }
        let drains = ListParams::default().labels(self.drain_label);
        match self.ns.api::<Pod>().list(&drains).await {
            Ok(list) => lines.extend(list.items.iter().map(describe_pod)),
            Err(e) => lines.push(format!("could not list the drain pods: {e}")),
        }
        format!(
            "{} left, after the cycle's wait:\n{}",
            self.name,
            lines.join("\n")
        )
    }

    /// Runs one cycle: scale down (to 0 or by one), wait until every removed ordinal's claim is
    /// gone and no drain pod is left, scale back up and wait until every pod runs. The samples
    /// the watches took meanwhile are this cycle's.
    async fn cycle(&mut self, round: usize, cycle: Cycle) -> Result<()> {
        let to = match cycle {
            Cycle::Burst => 0,
            Cycle::Single | Cycle::AfterIdle => self.replicas - 1,
        };
        // Which side's cycle the trace lines that follow belong to.
        common::trace(&format!("cycle-{cycle:?}"), self.name);
        let (reactions0, cleanups0) = {
            let seen = self.watches.seen.lock().expect("lock");
            (seen.reactions.len(), seen.cleanups.len())
        };
        scale(&self.ns, "web", to).await?;
        let claims = self.ns.api::<PersistentVolumeClaim>();
        let removed: Vec<String> = (to..self.replicas)
            .map(|o| format!("data-web-{o}"))
            .collect();
        let scaled = std::time::Instant::now();
        let drained = wait_for(CYCLE_TIMEOUT, "the removed ordinals drained", || async {
            let left = claims.list_metadata(&ListParams::default()).await?.items;
            let left: Vec<&str> = left
                .iter()
                .filter_map(|c| c.metadata.name.as_deref())
                .filter(|n| removed.iter().any(|r| r == n))
                .collect();
            let all = ListParams::default();
            let pods: Vec<String> = self
                .ns
                .api::<Pod>()
                .list_metadata(&all)
                .await?
                .items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            if self.cleans_orphans && scaled.elapsed() > ORPHAN_AFTER {
                // The StatefulSet controller, acting on a stale replica count, can make a
                // claim of a removed ordinal again and then not run its pod: the floor only
                // reacts to a pod's deletion, so the bench deletes it (not a sample).
                for claim in &left {
                    let pod = claim.trim_start_matches("data-");
                    if !pods.iter().any(|p| p == pod) {
                        eprintln!(
                            "{}: {claim} made again without its pod; deleted by the bench",
                            self.name
                        );
                        let _ = claims.delete(claim, &Default::default()).await;
                    }
                }
            }
            let drains = ListParams::default().labels(self.drain_label);
            let drains = self.ns.api::<Pod>().list_metadata(&drains).await?.items;
            Ok(left.is_empty() && drains.is_empty())
        })
        .await;
        if let Err(e) = drained {
            return Err(e.context(self.left_over(&removed).await));
        }
        // The last claim's event may trail the list that no longer has it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        {
            let seen = self.watches.seen.lock().expect("lock");
            let n = (self.replicas - to) as usize;
            ensure!(
                seen.reactions.len() - reactions0 == n,
                "{}: {} reactions seen for {n} drains",
                self.name,
                seen.reactions.len() - reactions0
            );
            self.samples.reactions.extend(
                seen.reactions[reactions0..]
                    .iter()
                    .map(|d| (round, cycle, *d)),
            );
            self.samples.cleanups.extend(
                seen.cleanups[cleanups0..]
                    .iter()
                    .map(|d| (round, cycle, *d)),
            );
        }
        scale(&self.ns, "web", self.replicas).await?;
        wait_running(&self.ns, &pod_names("web", 0..self.replicas)).await
    }
}

/// The cycles of one side, in a fixed shuffled order (a small linear congruential generator:
/// the same order every run).
fn schedule(bursts: usize, singles: usize, idle: usize) -> Vec<Cycle> {
    let mut cycles: Vec<Cycle> = std::iter::repeat_n(Cycle::Burst, bursts)
        .chain(std::iter::repeat_n(Cycle::Single, singles))
        .chain(std::iter::repeat_n(Cycle::AfterIdle, idle))
        .collect();
    let mut order = e2e::stats::Lcg::new();
    for i in (1..cycles.len()).rev() {
        cycles.swap(i, order.below(i + 1));
    }
    cycles
}

#[tokio::main]
async fn main() -> Result<()> {
    let replicas = env_or("STSD_BENCH_REPLICAS", 10) as i32;
    let bursts = env_or("STSD_BENCH_BURSTS", 40);
    let singles = env_or("STSD_BENCH_SINGLES", 100);
    let idle_cycles = env_or("STSD_BENCH_IDLE_CYCLES", 3);
    let idle = Duration::from_secs(env_or("STSD_BENCH_IDLE_SECS", 100) as u64);
    // A time budget for the cycles: none is started after it, and the report covers the
    // cycles made (the schedule is shuffled, so a run cut short keeps its mix of kinds).
    let budget = std::env::var("STSD_BENCH_MINUTES")
        .ok()
        .and_then(|m| m.parse::<u64>().ok())
        .map(|m| Duration::from_secs(m * 60));
    let client = client().await;
    let template = drain_template("true", &["data"], json!({"restartPolicy": "Never"}));

    let mut ctl = Side::new(
        &client,
        "controller",
        "bench-reaction",
        DRAIN_POD,
        false,
        replicas,
    )
    .await?;
    let mut floor = Side::new(&client, "floor", "bench-floor", DRAIN_POD, true, replicas).await?;
    let mut peer = Side::new(
        &client,
        "2018 PoC",
        "bench-poc",
        poc::POD_LABEL,
        false,
        replicas,
    )
    .await?;

    // The bare watch latency, interleaved with nothing else.
    let baseline = ctl.watches.baseline(&ctl.ns, 100).await?;
    let pod_baseline = ctl.watches.pod_baseline(&ctl.ns, 100).await?;

    let controller = ControllerProcess::start_named(&ctl.ns.name, "bench", &[]);
    let opted_in = SetBuilder::new("web")
        .replicas(replicas)
        .parallel()
        .annotation(DRAINER_POD_TEMPLATE, template.clone());
    start_set(&ctl.ns, &opted_in).await?;
    start_set(
        &floor.ns,
        &SetBuilder::new("web").replicas(replicas).parallel(),
    )
    .await?;
    // Started once its set exists: it builds its drain pods from the set, as the controller.
    let _floor = Floor::start(&floor.ns.name, "web", &template, "data").await?;
    // The PoC's cleanup pod: the same program, restarted on failure as it requires.
    let poc_template =
        drain_template_without_record("true", &["data"], json!({"restartPolicy": "OnFailure"}));
    let poc_process = Poc::start(&peer.ns.name)?;
    let poc_set = SetBuilder::new("web")
        .replicas(replicas)
        .parallel()
        .annotation(poc::ANNOTATION, poc_template);
    start_set(&peer.ns, &poc_set).await?;
    poc_process.wait_handles(&peer.ns, "web").await?;
    for side in [&ctl, &floor, &peer] {
        wait_running(&side.ns, &pod_names("web", 0..replicas)).await?;
    }

    let plan = schedule(bursts, singles, idle_cycles);
    let total = plan.len();
    let probe_ns = TestNamespace::new(&client, "bench-probes").await?;
    let mut probes = Watches::start(&probe_ns).await?;
    let cycles = async {
        let started = std::time::Instant::now();
        let mut made = 0;
        for (i, cycle) in plan.iter().enumerate() {
            if budget.is_some_and(|b| started.elapsed() >= b) {
                eprintln!(
                    "the time budget (STSD_BENCH_MINUTES) is spent: {i} of {total} cycles made"
                );
                break;
            }
            // Each side goes first in turn.
            let mut sides: [&mut Side; 3] = [&mut ctl, &mut floor, &mut peer];
            sides.rotate_left(i % 3);
            for side in sides {
                if *cycle == Cycle::AfterIdle {
                    eprintln!("idle for {} s", idle.as_secs());
                    tokio::time::sleep(idle).await;
                }
                side.cycle(i, *cycle).await?;
            }
            eprintln!("cycle {}/{total} ({cycle:?}) done", i + 1);
            made = i + 1;
        }
        anyhow::Ok((started.elapsed(), made))
    };
    let ((wall, made), during) = probes
        .baseline_every(&probe_ns, Duration::from_millis(500), false, cycles)
        .await?;
    drop(controller);
    drop(poc_process);

    let (c, f, p) = (&ctl.samples, &floor.samples, &peer.samples);
    let all = [Cycle::Burst, Cycle::Single, Cycle::AfterIdle];
    let ratio = |a: &[std::time::Duration], b: &[std::time::Duration], q: f64| {
        quantile(a, q) / quantile(b, q)
    };
    let (cr, fr) = (c.reactions(&all), f.reactions(&all));
    let (cc, fc) = (c.cleanups(&all), f.cleanups(&all));
    let mut report = vec![
        format!(
            "reaction latency: the controller, the floor (a minimal drain controller creating the controller's own drain pod) and the 2018 PoC on triplet sets of {replicas}, \
             taking turns: {bursts} bursts (scaled to 0), {singles} singles (scaled down by one), \
             {idle_cycles} singles after {} s idle, per side; {} on {}",
            idle.as_secs(),
            utc_now(),
            host()
        ),
        line90("bare watch: ConfigMap created -> event", &baseline),
        line90(
            "  the same during the cycles (every 500 ms)",
            &during.configmaps,
        ),
        line90("bare watch: Pod created -> event", &pod_baseline),
        String::new(),
        "stateful pod gone -> drain pod created".to_owned(),
    ];
    for (what, kinds) in [
        ("all", &all[..]),
        ("bursts", &[Cycle::Burst][..]),
        ("singles", &[Cycle::Single][..]),
        ("after idle", &[Cycle::AfterIdle][..]),
    ] {
        let (a, b) = (c.reactions(kinds), f.reactions(kinds));
        report.push(line90(&format!("  controller, {what}"), &a));
        report.push(line90(&format!("  floor, {what}"), &b));
        let pa = p.reactions(kinds);
        report.push(line90(&format!("  2018 PoC, {what}"), &pa));
        let fb = f.reactions_by_round(kinds);
        for (who, x, xb) in [
            ("controller", &a, c.reactions_by_round(kinds)),
            ("2018 PoC", &pa, p.reactions_by_round(kinds)),
        ] {
            report.push(format!(
                "  {who} / floor, {what}: p50 {:.2}{}  p90 {:.2}  p99 {:.2}{}  max {:.2}",
                ratio(x, &b, 0.5),
                interval(&xb, &fb, 0.5),
                ratio(x, &b, 0.9),
                ratio(x, &b, 0.99),
                interval(&xb, &fb, 0.99),
                ratio(x, &b, 1.0)
            ));
        }
    }
    let (crr, frr) = (c.reactions_by_round(&all), f.reactions_by_round(&all));
    let (ccr, fcr) = (c.cleanups_by_round(&all), f.cleanups_by_round(&all));
    report.extend([
        format!(
            "  budget: p50 <= {P50_BUDGET}x the floor ({:.2}{}), p99 <= {P99_BUDGET}x ({:.2}{}): {}",
            ratio(&cr, &fr, 0.5),
            interval(&crr, &frr, 0.5),
            ratio(&cr, &fr, 0.99),
            interval(&crr, &frr, 0.99),
            met(ratio(&cr, &fr, 0.5), ratio(&cr, &fr, 0.99))
        ),
        String::new(),
        "drain finished (containers exited 0) -> claim deleted".to_owned(),
        line90("  controller", &cc),
        line90("  floor (one API write after the event)", &fc),
        line90("  2018 PoC (acts on the phase Succeeded)", &p.cleanups(&all)),
        format!(
            "  controller / floor: p50 {:.2}{}  p99 {:.2}{}; controller p50 / bare watch p50 during the cycles: {:.2}",
            ratio(&cc, &fc, 0.5),
            interval(&ccr, &fcr, 0.5),
            ratio(&cc, &fc, 0.99),
            interval(&ccr, &fcr, 0.99),
            quantile(&cc, 0.5) / quantile(&during.configmaps, 0.5)
        ),
        format!(
            "  budget: p50 <= {P50_BUDGET}x the floor ({:.2}{}), p99 <= {P99_BUDGET}x ({:.2}{}): {}",
            ratio(&cc, &fc, 0.5),
            interval(&ccr, &fcr, 0.5),
            ratio(&cc, &fc, 0.99),
            interval(&ccr, &fcr, 0.99),
            met(ratio(&cc, &fc, 0.5), ratio(&cc, &fc, 0.99))
        ),
        String::new(),
        "90%: the ratio's interval over the rounds (a paired cluster bootstrap: a burst's samples \
         share their moment, so whole rounds are resampled; e2e::stats::ratio_interval)"
            .to_owned(),
        String::new(),
        format!(
            "wall time of the cycles: {:.1} s, {made} of {total} cycles{}; samples: controller {} reactions, {} cleanups; floor {} reactions, {} cleanups; 2018 PoC {} reactions, {} cleanups",
            wall.as_secs_f64(),
            if made < total {
                " (cut short by STSD_BENCH_MINUTES)"
            } else {
                ""
            },
            cr.len(),
            cc.len(),
            fr.len(),
            fc.len(),
            p.reactions(&all).len(),
            p.cleanups(&all).len()
        ),
    ]);
    let report = report.join("\n");
    println!("{report}");
    write_result("reaction.txt", &report)?;
    Ok(())
}
