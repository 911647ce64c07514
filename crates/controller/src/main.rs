//! `statefulset-drain-controller`: parses the command line and runs the controller.

use clap::Parser;
use statefulset_drain_controller::{cli::Args, init_logging, run};

/// jemalloc, configured in `.cargo/config.toml` to give freed memory back to the system: the
/// first lists of every pod, claim and StatefulSet are transient, and glibc's allocator kept
/// them resident (measured at 10,000 pods and claims and 1,000 sets: 62 MiB after sync with
/// glibc, 29 MiB with this; `tests/e2e/benches/scale.rs`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_filter, args.log_json)?;
    run(args).await
}
