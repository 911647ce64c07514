//! Reaction latency of the controller on the real local cluster, next to a baseline measured in
//! the same run (issue 10). Not a test: it prints figures and writes them to
//! `tests/bench/results/reaction.txt`.
//!
//! All times come from this program's own watch of the namespace, so both sides of each
//! interval are seen the same way:
//! - **pod gone → drain pod created**: a stateful pod's Deleted event → the Added event of the
//!   drain pod of that name;
//! - **drain succeeded → claims deleted**: the drain pod's first event in phase Succeeded → the
//!   first event of its claim with a deletion timestamp;
//! - **baseline, bare watch latency**: a ConfigMap create request sent → its Added event, 100
//!   of them one after the other before the drains, and one every 100 ms during the drain
//!   cycles (the same load as the drains: the node stopping and starting pods);
//! - **baseline, a pod written**: the same for a Pod (never scheduled, deleted once seen), the
//!   kind of write a reaction makes;
//! - **floor, a minimal reactor**: this program creating a probe pod the instant it sees each
//!   stateful pod's Deleted event, alongside the controller: the stateful pod's Deleted event
//!   → the probe's Added event. The least any controller's reaction costs at that instant (the
//!   node is tearing the pod down then), with nothing read, confirmed or recorded.
//!
//! Drains: a Parallel set of `STSD_BENCH_REPLICAS` (10) scaled to 0 and back,
//! `STSD_BENCH_CYCLES` (10) times: 100 drains by default. Run by `tests/bench/run`.

mod common;

use std::time::Duration;

use anyhow::{Result, ensure};
use common::*;
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use e2e::objects::{SetBuilder, drain_template};
use e2e::ops::*;
use e2e::{ControllerProcess, TestNamespace, client};
use kube::api::ListParams;
use serde_json::json;

#[tokio::main]
async fn main() -> Result<()> {
    let replicas = env_or("STSD_BENCH_REPLICAS", 10) as i32;
    let cycles = env_or("STSD_BENCH_CYCLES", 10);
    let client = client().await;
    let ns = TestNamespace::new(&client, "bench-reaction").await?;
    let mut watches = Watches::start(&ns).await?;

    // Baseline: the same cluster's bare watch latency, interleaved with nothing else.
    let baseline = watches.baseline(&ns, 100).await?;
    let pod_baseline = watches.pod_baseline(&ns, 100).await?;

    let controller = ControllerProcess::start_named(&ns.name, "bench", &[]);
    let set = SetBuilder::new("web")
        .replicas(replicas)
        .parallel()
        .annotation(
            DRAINER_POD_TEMPLATE,
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})),
        );
    start_set(&ns, &set).await?;
    watches.react();
    let (wall, during) = watches
        .baseline_during(
            &ns,
            drain_cycles(&ns, "web", replicas, cycles, &ListParams::default()),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(controller);
    watches.stop();

    let seen = watches.seen.lock().expect("lock");
    let expected = replicas as usize * cycles;
    ensure!(
        seen.reactions.len() == expected,
        "saw {} reactions for {expected} drains",
        seen.reactions.len()
    );
    let (base_p50, ..) = summary(&baseline);
    let (pod_p50, ..) = summary(&pod_baseline);
    let (react_p50, react_p99, ..) = summary(&seen.reactions);
    let report = [
        format!(
            "reaction latency, {expected} drains ({cycles} x a Parallel set of {replicas} scaled to 0), {} on {}",
            utc_now(),
            host()
        ),
        line("baseline: ConfigMap created -> watch event", &baseline),
        line("baseline during the cycles (every 100 ms)", &during.configmaps),
        line("baseline: Pod created -> watch event", &pod_baseline),
        line("the same during the cycles (every 100 ms)", &during.pods),
        line("stateful pod gone -> drain pod created", &seen.reactions),
        line("floor: gone -> a minimal reactor's pod", &seen.floor),
        line("drain pod Succeeded -> claim deleted", &seen.cleanups),
        format!(
            "median reaction / median baseline: {:.2} (goal <= 1.5), / median baseline during the cycles: {:.2}; p99 reaction {:.1} ms (goal <= 30)",
            react_p50 / base_p50,
            react_p50 / summary(&during.configmaps).0,
            react_p99
        ),
        format!(
            "median reaction / median Pod baseline: {:.2}, / median Pod baseline during the cycles: {:.2}, / median floor: {:.2}; p99 reaction / p99 floor: {:.2}",
            react_p50 / pod_p50,
            react_p50 / summary(&during.pods).0,
            react_p50 / summary(&seen.floor).0,
            react_p99 / summary(&seen.floor).1,
        ),
        format!("wall time of the drain cycles: {:.1} s", wall.as_secs_f64()),
    ]
    .join("\n");
    println!("{report}");
    write_result("reaction.txt", &report)?;
    Ok(())
}
