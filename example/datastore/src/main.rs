//! The `datastore` binary: parse the arguments, set up logging, run the service.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = datastore::cli::Args::parse();
    datastore::init_tracing(&args.log_filter, args.log_json)?;
    datastore::run(args).await?;
    Ok(())
}
