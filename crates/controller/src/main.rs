//! `statefulset-drain-controller`: parses the command line and runs the controller.

use clap::Parser;
use statefulset_drain_controller::{cli::Args, init_logging, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_filter, args.log_json)?;
    run(args).await
}
