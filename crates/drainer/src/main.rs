//! The `drainer` binary: parse the arguments, set up logging, run the chosen mode, exit with
//! its code.

use std::process::ExitCode;

use clap::Parser;
use drain_api::exit_codes;

#[tokio::main]
async fn main() -> ExitCode {
    let args = drainer::cli::Args::parse();
    if let Err(e) = drain_logging::init(&args.log_filter, args.log_json) {
        eprintln!("drainer: {}", drainer::error_chain(&e));
        return exit(exit_codes::FAILURE);
    }
    let drain = args.drain.clone();
    match drainer::run(args).await {
        Ok(code) => exit(code),
        Err(e) => {
            tracing::error!(reason = e.reason(), error = %drainer::error_chain(&e), "drain failed");
            drainer::record_failure(&drain, &e);
            exit(exit_codes::FAILURE)
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
