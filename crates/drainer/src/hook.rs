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
//! Peers are discovered again before each run, and [`env::PEERS_STATUS`] tells the command what
//! came of it: `found` (the set has other members), `none` (discovery worked and the set has no
//! other members), or `disabled` (`--no-peers`: no discovery, the peer variables are empty). If
//! discovery *fails* (no Kubernetes API, missing RBAC, an API error), the command is **not** run:
//! a command that ignored the peer variables would otherwise report success without having moved
//! anything, and the controller would delete the claim. The failed discovery counts as an attempt
//! asking for a retry, with the same backoff and limit as exit code `75`; when no retries are
//! left the drainer fails with [`HookError::DiscoveryFailed`].
//!
//! SIGTERM and SIGINT received by the drainer are forwarded to the command's process group; after
//! one, the command is not run again and the drainer exits with the command's code. A signal
//! while no command runs (during discovery or a backoff) ends the drainer at once with `128 + N`.
//!
//! The command's orphaned background processes are reaped by [`crate::reaper`]; [`run`] tells it
//! which process is the command's own through a [`ChildPid`].

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use drain_api::exit_codes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::peers::{Peer, PeerSet, PeerSource, PeersError};
use crate::reaper::ChildPid;

/// Environment variables the drainer adds for the command (besides the controller's `DRAIN_*`).
pub mod env {
    /// The data directory (`--data-dir`).
    pub const DATA_DIR: &str = "DRAIN_DATA_DIR";
    /// Comma-separated base URLs of the Ready peers (`http://10.0.0.7:8080,...`), ordered by
    /// ordinal; empty if there are none or discovery is disabled.
    pub const PEERS: &str = "DRAIN_PEERS";
    /// Comma-separated ordinals of the same peers, in the same order.
    pub const PEER_ORDINALS: &str = "DRAIN_PEER_ORDINALS";
    /// Comma-separated ordinals of the set's live members except the drained one (Ready or
    /// not): the owners to place keys among with `placement::owner`.
    pub const MEMBER_ORDINALS: &str = "DRAIN_MEMBER_ORDINALS";
    /// What peer discovery found, one of [`PeersStatus`](super::PeersStatus): `found`, `none`
    /// or `disabled`.
    pub const PEERS_STATUS: &str = "DRAIN_PEERS_STATUS";
    /// Which run of the command this is, from 1 (attempts whose discovery failed, when the
    /// command was not run, do not count).
    pub const ATTEMPT: &str = "DRAIN_HOOK_ATTEMPT";
}

/// The value of [`env::PEERS_STATUS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeersStatus {
    /// `found`: discovery worked and the set has members besides the drained ordinal
    /// (`DRAIN_MEMBER_ORDINALS` is not empty; `DRAIN_PEERS` may still be, if none is Ready).
    Found,
    /// `none`: discovery worked and the set has no other members (it is being scaled to zero).
    NoMembers,
    /// `disabled`: `--no-peers`; there was no discovery and the peer variables are empty.
    Disabled,
}

impl PeersStatus {
    /// The status of a discovered set.
    pub fn of(set: &PeerSet) -> Self {
        if set.members.is_empty() {
            Self::NoMembers
        } else {
            Self::Found
        }
    }

    /// The text the command sees.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::NoMembers => "none",
            Self::Disabled => "disabled",
        }
    }
}

/// Whether and how peers are discovered before each run.
#[derive(Clone, Debug)]
pub enum Discovery<P> {
    /// `--no-peers`: the command runs with [`PeersStatus::Disabled`] and empty peer variables.
    Disabled,
    /// Discover from this source; the command runs only when that works.
    Source(P),
}

/// When to run the command again after it exits with [`exit_codes::RETRY`] or discovery fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries at most, after the first attempt.
    pub max_retries: usize,
    /// Delay before the first retry; doubles each time.
    pub base_delay: Duration,
    /// Longest delay between attempts.
    pub max_delay: Duration,
}

/// The command and its fixed context.
#[derive(Clone, Debug)]
pub struct Hook {
    /// Program and arguments; the program is looked up in `PATH`.
    pub command: Vec<OsString>,
    /// Variables set for the command on top of the drainer's own environment.
    pub env: Vec<(String, String)>,
    /// Retries.
    pub retry: RetryPolicy,
}

/// Where SIGTERM and SIGINT come from: this process's signals, or a channel (tests).
#[derive(Debug)]
pub struct Signals(SignalSource);

#[derive(Debug)]
enum SignalSource {
    Os {
        term: tokio::signal::unix::Signal,
        int: tokio::signal::unix::Signal,
    },
    Channel(mpsc::UnboundedReceiver<Signal>),
}

impl Signals {
    /// This process's SIGTERM and SIGINT (from now on they no longer end the process by
    /// themselves). Needs a tokio runtime.
    pub fn os() -> Result<Self, HookError> {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).map_err(HookError::Signals)?;
        let int = signal(SignalKind::interrupt()).map_err(HookError::Signals)?;
        Ok(Self(SignalSource::Os { term, int }))
    }

    /// Signals sent through the returned sender instead of the process's own.
    pub fn channel() -> (mpsc::UnboundedSender<Signal>, Self) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (sender, Self(SignalSource::Channel(receiver)))
    }

    /// The next signal; never ready once no more can come.
    pub async fn recv(&mut self) -> Signal {
        let received = match &mut self.0 {
            SignalSource::Os { term, int } => tokio::select! {
                Some(()) = term.recv() => Some(Signal::SIGTERM),
                Some(()) = int.recv() => Some(Signal::SIGINT),
                else => None,
            },
            SignalSource::Channel(receiver) => receiver.recv().await,
        };
        match received {
            Some(signal) => signal,
            None => std::future::pending().await,
        }
    }
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
    #[error("command still asked for a retry (exit code {code}) after {attempts} attempts", code = exit_codes::RETRY)]
    RetriesExhausted {
        /// Attempts made.
        attempts: usize,
    },
    /// Peer discovery failed on the last attempt allowed, so the command was not run then.
    #[error(
        "peer discovery failed on attempt {attempts}, the last allowed, so the command was not \
         run (pass --no-peers if it does not need peers)"
    )]
    DiscoveryFailed {
        /// Attempts made.
        attempts: usize,
        /// The last discovery error.
        #[source]
        source: PeersError,
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
            Self::DiscoveryFailed { .. } => "DiscoveryFailed",
        }
    }
}

/// Why an attempt did not finish the drain and may be retried.
enum Retry {
    /// The command exited [`exit_codes::RETRY`].
    Asked,
    /// Discovery failed; the command was not run.
    Discovery(PeersError),
}

/// How the command ended.
struct Exit {
    /// Its exit code, or `128 + N` if a signal ended it.
    code: i32,
    /// The last signal the drainer received while it ran (and forwarded if it could).
    signalled: Option<Signal>,
}

/// Runs `hook` until it succeeds, fails, runs out of retries or a signal stops the drainer;
/// returns the exit code the drainer should exit with. `discovery` says where peers come from;
/// `signals` are forwarded to the command while it runs and stop the drainer otherwise; the
/// command's pid is published in `running` for the [reaper](crate::reaper) while it runs.
pub async fn run<P: PeerSource>(
    hook: &Hook,
    discovery: &Discovery<P>,
    signals: &mut Signals,
    running: &ChildPid,
) -> Result<i32, HookError> {
    let (program, args) = hook.command.split_first().ok_or(HookError::NoCommand)?;
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(hook.retry.base_delay)
        .with_max_delay(hook.retry.max_delay.max(hook.retry.base_delay))
        .with_max_times(hook.retry.max_retries)
        .build();
    let mut attempt = 0usize;
    let mut runs = 0usize;
    loop {
        attempt += 1;
        let peer_env = match discovery {
            Discovery::Disabled => Ok(disabled_env()),
            Discovery::Source(source) => tokio::select! {
                found = source.discover() => found.map(|set| peer_env(&set)),
                signal = signals.recv() => return Ok(stopped(signal, attempt)),
            },
        };
        let retry = match peer_env {
            Ok(peer_env) => {
                runs += 1;
                let mut command = tokio::process::Command::new(program);
                command
                    .args(args)
                    .envs(hook.env.iter().map(|(k, v)| (k, v)))
                    .envs(peer_env)
                    .env(env::ATTEMPT, runs.to_string());
                tracing::info!(attempt, run = runs, command = ?hook.command, "running hook");
                let exit = run_command(command, program, signals, running).await?;
                tracing::info!(attempt, code = exit.code, "hook exited");
                if let Some(sig) = exit.signalled
                    && exit.code == exit_codes::SUCCESS
                {
                    // Many programs exit 0 on SIGTERM: that is a stop, not a finished drain.
                    tracing::warn!(signal = %sig, "the hook exited 0 after it was told to stop: not a finished drain");
                    return Ok(signal_exit_code(sig));
                }
                if exit.code != exit_codes::RETRY || exit.signalled.is_some() {
                    return Ok(exit.code);
                }
                Retry::Asked
            }
            Err(e) => Retry::Discovery(e),
        };
        let Some(delay) = delays.next() else {
            return Err(match retry {
                Retry::Asked => HookError::RetriesExhausted { attempts: attempt },
                Retry::Discovery(source) => HookError::DiscoveryFailed {
                    attempts: attempt,
                    source,
                },
            });
        };
        match &retry {
            Retry::Asked => tracing::warn!(attempt, retry_in = ?delay, "hook asked for a retry"),
            Retry::Discovery(e) => tracing::warn!(
                attempt,
                retry_in = ?delay,
                reason = e.reason(),
                error = %crate::error_chain(e),
                "peer discovery failed, not running the hook without peers"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            signal = signals.recv() => return Ok(stopped(signal, attempt)),
        }
    }
}

/// Starts `command` in its own process group and waits for it, forwarding signals to the group.
async fn run_command(
    mut command: tokio::process::Command,
    program: &OsString,
    signals: &mut Signals,
    running: &ChildPid,
) -> Result<Exit, HookError> {
    command
        .stdin(Stdio::null())
        // Own process group, so a forwarded signal reaches the command's children too.
        .process_group(0)
        .kill_on_drop(true);
    // Until the guard drops (after tokio collected the exit status), the reaper leaves the
    // command's process alone.
    let guard = running.spawning();
    let mut child = command.spawn().map_err(|source| HookError::Spawn {
        program: program.clone(),
        source,
    })?;
    if let Some(pid) = child.id() {
        guard.set(pid);
    }
    let mut signalled = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|source| HookError::Wait {
                program: program.clone(),
                source,
            })?,
            signal = signals.recv() => {
                signalled = Some(signal);
                forward(&child, signal);
            }
        }
    };
    drop(guard);
    Ok(Exit {
        code: exit_code(status),
        signalled,
    })
}

/// `DRAIN_PEERS`, `DRAIN_PEER_ORDINALS`, `DRAIN_MEMBER_ORDINALS` and `DRAIN_PEERS_STATUS` of a
/// discovered set.
fn peer_env(set: &PeerSet) -> [(&'static str, String); 4] {
    let ready: Vec<&Peer> = set.ready.values().collect();
    let status = PeersStatus::of(set);
    tracing::info!(
        peers = ?ready.iter().map(|p| p.base_url()).collect::<Vec<_>>(),
        members = ?set.members,
        status = status.as_str(),
        "discovered peers"
    );
    [
        (env::PEERS, join(ready.iter().map(|p| p.base_url()))),
        (env::PEER_ORDINALS, join(ready.iter().map(|p| p.ordinal))),
        (env::MEMBER_ORDINALS, join(set.members.iter())),
        (env::PEERS_STATUS, status.as_str().to_owned()),
    ]
}

/// The peer variables with discovery disabled: all empty, status `disabled`.
fn disabled_env() -> [(&'static str, String); 4] {
    [
        (env::PEERS, String::new()),
        (env::PEER_ORDINALS, String::new()),
        (env::MEMBER_ORDINALS, String::new()),
        (env::PEERS_STATUS, PeersStatus::Disabled.as_str().to_owned()),
    ]
}

fn join<T: ToString>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// Sends `sig` to the child's process group (logging the outcome).
fn forward(child: &tokio::process::Child, sig: Signal) {
    let Some(pid) = child.id() else {
        return;
    };
    let Ok(pgid) = i32::try_from(pid).map(Pid::from_raw) else {
        return;
    };
    match killpg(pgid, sig) {
        Ok(()) => tracing::info!(signal = %sig, pid, "forwarded signal to hook"),
        Err(e) => {
            tracing::warn!(signal = %sig, pid, error = %e, "failed to forward signal to hook");
        }
    }
}

/// Logs a stop by `sig` while no command runs; returns `128 + sig`.
fn stopped(sig: Signal, attempt: usize) -> i32 {
    tracing::warn!(signal = %sig, attempt, "stopping; the hook is not run again");
    signal_exit_code(sig)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_of_a_discovered_set() {
        assert_eq!(PeersStatus::of(&PeerSet::default()), PeersStatus::NoMembers);
        let not_ready = PeerSet {
            members: vec![0],
            ..Default::default()
        };
        assert_eq!(PeersStatus::of(&not_ready), PeersStatus::Found);
        assert_eq!(PeersStatus::Found.as_str(), "found");
        assert_eq!(PeersStatus::NoMembers.as_str(), "none");
        assert_eq!(PeersStatus::Disabled.as_str(), "disabled");
    }
}
