//! Hook mode: runs the user's command with the drain's context, retrying it when it asks to.
//!
//! The command gets the drain context in its environment (see [`env`]) and the controller's
//! `DRAIN_*` variables. Its exit code decides what happens:
//! - `0`: the drain succeeded, the drainer exits `0`;
//! - [`RETRY`](drain_api::exit_codes::RETRY) (`75`): a transient problem; the command runs again
//!   after an exponential backoff, up to a number of retries, after which the drainer fails with
//!   [`FAILURE`](drain_api::exit_codes::FAILURE);
//! - anything else: the drainer exits with that code (the pod fails, the controller retries it).
//!
//! SIGTERM and SIGINT received by the drainer are forwarded to the command's process group; after
//! one, the command is not run again and the drainer exits with the command's code.
//!
//! Peers are discovered again before each run. If discovery is impossible or fails (`--no-peers`,
//! no Kubernetes API, missing RBAC), the drainer logs why and runs the command with `DRAIN_PEERS`
//! empty rather than failing: the command decides whether it needs peers.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use drain_api::exit_codes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::peers::{Peer, PeerSource};

/// Environment variables the drainer adds for the command (besides the controller's `DRAIN_*`).
pub mod env {
    /// The data directory (`--data-dir`).
    pub const DATA_DIR: &str = "DRAIN_DATA_DIR";
    /// Comma-separated base URLs of the Ready peers (`http://10.0.0.7:8080,...`), ordered by
    /// ordinal; empty if discovery was off or failed.
    pub const PEERS: &str = "DRAIN_PEERS";
    /// Comma-separated ordinals of the same peers, in the same order.
    pub const PEER_ORDINALS: &str = "DRAIN_PEER_ORDINALS";
    /// Comma-separated ordinals of the set's live members except the drained one (Ready or
    /// not): the owners to place keys among with `placement::owner`.
    pub const MEMBER_ORDINALS: &str = "DRAIN_MEMBER_ORDINALS";
    /// Which run of the command this is, from 1.
    pub const ATTEMPT: &str = "DRAIN_HOOK_ATTEMPT";
}

/// When to run the command again after it exits with [`exit_codes::RETRY`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Reruns at most, after the first run.
    pub max_retries: usize,
    /// Delay before the first rerun; doubles each time.
    pub base_delay: Duration,
    /// Longest delay between runs.
    pub max_delay: Duration,
}

/// The command and its fixed context.
#[derive(Clone, Debug)]
pub struct Hook {
    /// Program and arguments; the program is looked up in `PATH`.
    pub command: Vec<OsString>,
    /// Variables set for the command on top of the drainer's own environment.
    pub env: Vec<(String, String)>,
    /// Reruns.
    pub retry: RetryPolicy,
}

/// Errors of hook mode.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// No command was given.
    #[error("no command to run")]
    NoCommand,
    /// The command could not be started.
    #[error("failed to start {program:?}")]
    Spawn {
        /// The program.
        program: OsString,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for the command failed.
    #[error("failed to wait for {program:?}")]
    Wait {
        /// The program.
        program: OsString,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("failed to install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The command kept asking to be retried.
    #[error("command still asked for a retry (exit code {code}) after {attempts} runs", code = exit_codes::RETRY)]
    RetriesExhausted {
        /// Runs made.
        attempts: usize,
    },
}

impl HookError {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoCommand => "NoCommand",
            Self::Spawn { .. } => "SpawnHook",
            Self::Wait { .. } => "WaitHook",
            Self::Signals(_) => "Signals",
            Self::RetriesExhausted { .. } => "RetriesExhausted",
        }
    }
}

/// Runs `hook` until it succeeds, fails, or runs out of retries; returns the exit code the
/// drainer should exit with.
pub async fn run<P: PeerSource>(hook: &Hook, peers: &P) -> Result<i32, HookError> {
    let (program, args) = hook.command.split_first().ok_or(HookError::NoCommand)?;
    let mut term = signal(SignalKind::terminate()).map_err(HookError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(HookError::Signals)?;
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(hook.retry.base_delay)
        .with_max_delay(hook.retry.max_delay.max(hook.retry.base_delay))
        .with_max_times(hook.retry.max_retries)
        .build();
    let mut attempt = 0usize;
    loop {
        attempt += 1;
        let peer_env = peer_env(peers).await;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(hook.env.iter().map(|(k, v)| (k, v)))
            .envs(peer_env)
            .env(env::ATTEMPT, attempt.to_string())
            .stdin(Stdio::null())
            // Own process group, so a forwarded signal reaches the command's children too.
            .process_group(0)
            .kill_on_drop(true);
        tracing::info!(attempt, command = ?hook.command, "running hook");
        let mut child = command.spawn().map_err(|source| HookError::Spawn {
            program: program.clone(),
            source,
        })?;
        let mut forwarded = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status.map_err(|source| HookError::Wait {
                    program: program.clone(),
                    source,
                })?,
                _ = term.recv() => forwarded = forward(&child, Signal::SIGTERM).or(forwarded),
                _ = int.recv() => forwarded = forward(&child, Signal::SIGINT).or(forwarded),
            }
        };
        let code = exit_code(status);
        tracing::info!(attempt, code, "hook exited");
        if code != exit_codes::RETRY || forwarded.is_some() {
            return Ok(code);
        }
        let Some(delay) = delays.next() else {
            return Err(HookError::RetriesExhausted { attempts: attempt });
        };
        tracing::warn!(attempt, retry_in = ?delay, "hook asked for a retry");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = term.recv() => return Ok(signal_exit_code(Signal::SIGTERM)),
            _ = int.recv() => return Ok(signal_exit_code(Signal::SIGINT)),
        }
    }
}

/// `DRAIN_PEERS`, `DRAIN_PEER_ORDINALS` and `DRAIN_MEMBER_ORDINALS` from a fresh discovery, or
/// all empty (with a log line saying why) if discovery fails.
async fn peer_env<P: PeerSource>(peers: &P) -> [(&'static str, String); 3] {
    match peers.discover().await {
        Ok(set) => {
            let ready: Vec<&Peer> = set.ready.values().collect();
            tracing::info!(
                peers = ?ready.iter().map(|p| p.base_url()).collect::<Vec<_>>(),
                members = ?set.members,
                "discovered peers"
            );
            [
                (env::PEERS, join(ready.iter().map(|p| p.base_url()))),
                (env::PEER_ORDINALS, join(ready.iter().map(|p| p.ordinal))),
                (env::MEMBER_ORDINALS, join(set.members.iter())),
            ]
        }
        Err(e) => {
            tracing::warn!(
                reason = e.reason(),
                error = %crate::error_chain(&e),
                "no peer discovery, running the hook with DRAIN_PEERS empty"
            );
            [
                (env::PEERS, String::new()),
                (env::PEER_ORDINALS, String::new()),
                (env::MEMBER_ORDINALS, String::new()),
            ]
        }
    }
}

fn join<T: ToString>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// Sends `sig` to the child's process group; returns the signal if it was sent.
fn forward(child: &tokio::process::Child, sig: Signal) -> Option<Signal> {
    let pid = child.id()?;
    let pgid = Pid::from_raw(i32::try_from(pid).ok()?);
    match killpg(pgid, sig) {
        Ok(()) => {
            tracing::info!(signal = %sig, pid, "forwarded signal to hook");
            Some(sig)
        }
        Err(e) => {
            tracing::warn!(signal = %sig, pid, error = %e, "failed to forward signal to hook");
            None
        }
    }
}

/// The code a shell would report: the exit code, or 128 + the signal that ended the process.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(exit_codes::FAILURE)
}

fn signal_exit_code(sig: Signal) -> i32 {
    128 + sig as i32
}
