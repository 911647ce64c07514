//! The drainer: runs inside a drain pod and moves the drained ordinal's data to the remaining
//! pods of its StatefulSet, either itself ([`redistribute`]) or by running the user's command
//! ([`hook`]).
//!
//! Exit codes follow [`drain_api::exit_codes`]: `0` when the drain is done (the controller then
//! deletes the claims), [`FAILURE`](drain_api::exit_codes::FAILURE) when it failed (nothing
//! unacknowledged was deleted; the controller retries the pod), or the hook's own code.

pub mod cli;
pub mod hook;
pub mod logging;
pub mod peers;
pub mod placement;
pub mod redistribute;

use cli::{Args, Command, DrainContext, ExecArgs, PeerArgs, RedistributeArgs};
use peers::{Addressing, KubePeers, Target, Unavailable};

/// Errors that end the drainer with [`FAILURE`](drain_api::exit_codes::FAILURE).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A context value the mode needs is not set.
    #[error("missing --{flag} (environment variable {env})")]
    MissingContext {
        /// The flag.
        flag: &'static str,
        /// Its environment variable.
        env: &'static str,
    },
    /// Built-in redistribution failed.
    #[error("redistribution failed")]
    Redistribute(#[from] redistribute::RedistributeError),
    /// Hook mode failed.
    #[error("hook failed")]
    Hook(#[from] hook::HookError),
    /// Installing the signal handlers failed.
    #[error("failed to install signal handlers")]
    Signals(#[source] std::io::Error),
}

impl Error {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingContext { .. } => "MissingContext",
            Self::Redistribute(e) => e.reason(),
            Self::Hook(e) => e.reason(),
            Self::Signals(_) => "Signals",
        }
    }
}

/// Runs the mode chosen by `args`; returns the exit code.
pub async fn run(args: Args) -> Result<i32, Error> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        statefulset = args.drain.statefulset.as_deref().unwrap_or(""),
        namespace = args.drain.namespace.as_deref().unwrap_or(""),
        ordinal = ?args.drain.ordinal,
        pod = args.drain.pod_name.as_deref().unwrap_or(""),
        "starting drainer"
    );
    match args.command {
        Command::Redistribute(options) => run_redistribute(&args.drain, options).await,
        Command::Exec(options) => run_exec(&args.drain, options).await,
    }
}

async fn run_redistribute(drain: &DrainContext, args: RedistributeArgs) -> Result<i32, Error> {
    let source = KubePeers::new(target(drain, &args.peers)?);
    let options = redistribute::Options {
        data_dir: args.data_dir,
        concurrency: args.concurrency as usize,
        max_rate: args.max_rate,
        put_retries: args.put_retries as usize,
        put_retry_delay: args.put_retry_delay,
        max_rounds: args.max_rounds as usize,
        round_delay: args.round_delay,
        request_timeout: args.request_timeout,
        progress_interval: args.progress_interval,
    };
    // On SIGTERM/SIGINT (the drain pod deleted, evicted, or its node drained) stop at once:
    // dropping the run cancels the PUTs in flight, and a file is deleted only after its PUT was
    // acknowledged, so every record not yet moved stays for the next drain pod to resume from.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(Error::Signals)?;
    let summary = tokio::select! {
        summary = redistribute::redistribute(&options, &source) => summary?,
        _ = term.recv() => return Ok(stopped("SIGTERM", 15)),
        _ = tokio::signal::ctrl_c() => return Ok(stopped("SIGINT", 2)),
    };
    tracing::info!(
        records = summary.records,
        bytes = summary.bytes,
        rounds = summary.rounds,
        "drain done"
    );
    Ok(drain_api::exit_codes::SUCCESS)
}

/// Logs a stop by signal and returns the conventional exit code (128 + signal number).
fn stopped(signal: &str, number: i32) -> i32 {
    tracing::warn!(
        signal,
        "stopping the drain; records not yet acknowledged stay for the next attempt"
    );
    128 + number
}

async fn run_exec(drain: &DrainContext, args: ExecArgs) -> Result<i32, Error> {
    let mut env = drain.env_vars();
    env.push((
        hook::env::DATA_DIR.to_owned(),
        args.data_dir.to_string_lossy().into_owned(),
    ));
    let hook = hook::Hook {
        command: args.command,
        env,
        retry: hook::RetryPolicy {
            max_retries: args.max_retries as usize,
            base_delay: args.retry_base_delay,
            max_delay: args.retry_max_delay,
        },
    };
    let code = if args.no_peers {
        let reason = "--no-peers is set".to_owned();
        hook::run(&hook, &Unavailable { reason }).await?
    } else {
        match target(drain, &args.peers) {
            Ok(target) => hook::run(&hook, &KubePeers::new(target)).await?,
            Err(e) => {
                let reason = e.to_string();
                hook::run(&hook, &Unavailable { reason }).await?
            }
        }
    };
    Ok(code)
}

/// The discovery target from the drain's context.
fn target(drain: &DrainContext, peers: &PeerArgs) -> Result<Target, Error> {
    let missing = |flag, env| Error::MissingContext { flag, env };
    use drain_api::env;
    let port = peers.peer_port;
    Ok(Target {
        namespace: drain
            .namespace
            .clone()
            .ok_or_else(|| missing("namespace", env::NAMESPACE))?,
        statefulset: drain
            .statefulset
            .clone()
            .ok_or_else(|| missing("statefulset", env::STATEFULSET))?,
        drained_ordinal: drain
            .ordinal
            .ok_or_else(|| missing("ordinal", env::ORDINAL))?,
        addressing: match &peers.peer_dns_suffix {
            Some(suffix) if !suffix.is_empty() => Addressing::Dns {
                suffix: suffix.clone(),
                port,
            },
            _ => Addressing::PodIp { port },
        },
    })
}

/// `error` and its sources, joined with `: ` (a source whose text is already in the message,
/// as some libraries include it, is not repeated).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
