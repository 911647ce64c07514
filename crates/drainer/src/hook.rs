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
//! came of it: `found` (at least one other member is Ready), `not-ready` (the set has other
//! members but none is Ready), `none` (the set has no other members: it is being scaled to
//! zero), or `disabled` (`--no-peers`: no discovery, the peer variables are empty).
//!
//! A naive command that loops over `DRAIN_PEERS` and exits `0` would "finish" having moved
//! nothing when that list is empty, and the controller would delete the claim. So by default
//! the command runs only when discovery worked **and** found a Ready peer (`found`); with
//! `not-ready` or `none` it is not run, and the attempt counts as one asking for a retry. So
//! does a *failed* discovery (no Kubernetes API, missing RBAC, an API error). Retries have the
//! same backoff and limit as exit code `75`; when none are left the drainer fails with
//! [`HookError::NoReadyPeers`] or [`HookError::DiscoveryFailed`], and the claim stays. A
//! command that can finish without peers (it uploads the data elsewhere, or decides itself)
//! opts in with `--run-without-ready-peers` and is then run with `not-ready` or `none` too.
//!
//! The command is done when its process **and every process it started** have exited: it runs
//! in its own process group, and after it exits `0` the drainer waits for the rest of the group
//! (a background `&` job, a daemon it forgot to stop) for up to
//! [`Hook::processes_timeout`]. If some are still running then, they are stopped and the drain
//! fails ([`HookError::LeftRunning`], naming them): a drain whose helpers still write is not
//! finished. After any other exit code the rest of the group is stopped before the next run.
//! Processes that leave the group on purpose (`setsid`, `setpgid`) are not waited for.
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
    /// `found`: discovery worked and at least one member besides the drained ordinal is Ready
    /// (`DRAIN_PEERS` is not empty; members that are not Ready are only in
    /// `DRAIN_MEMBER_ORDINALS`).
    Found,
    /// `not-ready`: the set has other members, but none is Ready (`DRAIN_PEERS` is empty).
    /// The command runs with it only with `--run-without-ready-peers`.
    NotReady,
    /// `none`: discovery worked and the set has no other members (it is being scaled to zero).
    /// The command runs with it only with `--run-without-ready-peers`.
    NoMembers,
    /// `disabled`: `--no-peers`; there was no discovery and the peer variables are empty.
    Disabled,
}

impl PeersStatus {
    /// The status of a discovered set.
    pub fn of(set: &PeerSet) -> Self {
        if set.members.is_empty() {
            Self::NoMembers
        } else if set.ready.is_empty() {
            Self::NotReady
        } else {
            Self::Found
        }
    }

    /// The text the command sees.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::NotReady => "not-ready",
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
    /// Run the command when discovery found no Ready peer (`not-ready`, `none`) too.
    pub run_without_ready_peers: bool,
    /// After the command exits `0`, how long the other processes of its group may take to
    /// exit before the drain fails.
    pub processes_timeout: Duration,
}

/// How long the processes left of a group get between `SIGTERM` and `SIGKILL`.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

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
    /// Discovery found no Ready peer on the last attempt allowed, so the command was not run
    /// then.
    #[error(
        "no peer was Ready to take the data (DRAIN_PEERS_STATUS={status}) on attempt \
         {attempts}, the last allowed, so the command was not run (pass \
         --run-without-ready-peers if it can finish without peers)",
        status = status.as_str()
    )]
    NoReadyPeers {
        /// Attempts made.
        attempts: usize,
        /// What discovery found.
        status: PeersStatus,
    },
    /// The command exited `0`, but processes it started were still running after the wait.
    #[error(
        "the hook exited 0 but processes it started were still running after {}s, so the drain \
         is not finished; they were stopped: {}",
        waited.as_secs(),
        processes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    LeftRunning {
        /// How long the drainer waited for them.
        waited: Duration,
        /// The processes.
        processes: Vec<crate::group::Process>,
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
            Self::NoReadyPeers { .. } => "NoReadyPeers",
            Self::LeftRunning { .. } => "LeftRunning",
        }
    }
}

/// Why an attempt did not finish the drain and may be retried.
enum Retry {
    /// The command exited [`exit_codes::RETRY`].
    Asked,
    /// Discovery failed; the command was not run.
    Discovery(PeersError),
    /// Discovery found no Ready peer; the command was not run.
    NoReadyPeers(PeersStatus),
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
            Ok((status, _))
                if !hook.run_without_ready_peers
                    && matches!(status, PeersStatus::NotReady | PeersStatus::NoMembers) =>
            {
                Retry::NoReadyPeers(status)
            }
            Ok((_, peer_env)) => {
                runs += 1;
                let mut command = tokio::process::Command::new(program);
                command
                    .args(args)
                    .envs(hook.env.iter().map(|(k, v)| (k, v)))
                    .envs(peer_env)
                    .env(env::ATTEMPT, runs.to_string());
                tracing::info!(attempt, run = runs, command = ?hook.command, "running hook");
                let exit = run_command(command, program, hook, signals, running).await?;
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
                Retry::NoReadyPeers(status) => HookError::NoReadyPeers {
                    attempts: attempt,
                    status,
                },
            });
        };
        match &retry {
            Retry::Asked => tracing::warn!(attempt, retry_in = ?delay, "hook asked for a retry"),
            Retry::Discovery(e) => tracing::warn!(
                attempt,
                retry_in = ?delay,
                reason = e.reason(),
                error = %drain_logging::error_chain(e),
                "peer discovery failed, not running the hook without peers"
            ),
            Retry::NoReadyPeers(status) => tracing::warn!(
                attempt,
                retry_in = ?delay,
                status = status.as_str(),
                "no peer is Ready to take the data, not running the hook (pass --run-without-ready-peers if it can finish without peers)"
            ),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            signal = signals.recv() => return Ok(stopped(signal, attempt)),
        }
    }
}

/// Starts `command` in its own process group and waits for it, forwarding signals to the group;
/// then waits for the rest of the group ([`settle_group`]).
async fn run_command(
    mut command: tokio::process::Command,
    program: &OsString,
    hook: &Hook,
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
    let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
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
    let mut exit = Exit {
        code: exit_code(status),
        signalled,
    };
    if let Some(pgid) = pgid {
        settle_group(pgid, hook, &mut exit, signals).await?;
    }
    Ok(exit)
}

/// After the command exited: if it exited `0` (and was not told to stop), waits up to
/// [`Hook::processes_timeout`] for the rest of its group, forwarding signals, and fails with
/// [`HookError::LeftRunning`] if some still run then. Otherwise, or after a signal, stops what
/// is left of the group.
async fn settle_group(
    pgid: i32,
    hook: &Hook,
    exit: &mut Exit,
    signals: &mut Signals,
) -> Result<(), HookError> {
    if exit.code == exit_codes::SUCCESS && exit.signalled.is_none() {
        let left = crate::group::running(pgid);
        if left.is_empty() {
            return Ok(());
        }
        let listed: Vec<String> = left.iter().map(ToString::to_string).collect();
        tracing::info!(processes = ?listed, timeout = ?hook.processes_timeout, "the hook exited 0; waiting for the processes it started");
        let deadline = tokio::time::Instant::now() + hook.processes_timeout;
        loop {
            if crate::group::running(pgid).is_empty() {
                tracing::info!("the hook's processes have exited");
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let processes = crate::group::stop(pgid, STOP_GRACE).await;
                return Err(HookError::LeftRunning {
                    waited: hook.processes_timeout,
                    processes,
                });
            }
            tokio::select! {
                () = tokio::time::sleep(crate::group::POLL) => {}
                signal = signals.recv() => {
                    exit.signalled = Some(signal);
                    crate::group::signal(pgid, signal);
                    tracing::info!(signal = %signal, "forwarded signal to the hook's processes");
                    break;
                }
            }
        }
    }
    let stopped = crate::group::stop(pgid, STOP_GRACE).await;
    if !stopped.is_empty() {
        let listed: Vec<String> = stopped.iter().map(ToString::to_string).collect();
        tracing::warn!(processes = ?listed, "stopped processes the hook left running");
    }
    Ok(())
}

/// What discovery found, and `DRAIN_PEERS`, `DRAIN_PEER_ORDINALS`, `DRAIN_MEMBER_ORDINALS` and
/// `DRAIN_PEERS_STATUS` of a discovered set.
fn peer_env(set: &PeerSet) -> (PeersStatus, [(&'static str, String); 4]) {
    let ready: Vec<&Peer> = set.ready.values().collect();
    let status = PeersStatus::of(set);
    tracing::info!(
        peers = ?ready.iter().map(|p| p.base_url()).collect::<Vec<_>>(),
        members = ?set.members,
        status = status.as_str(),
        "discovered peers"
    );
    (
        status,
        [
            (env::PEERS, join(ready.iter().map(|p| p.base_url()))),
            (env::PEER_ORDINALS, join(ready.iter().map(|p| p.ordinal))),
            (env::MEMBER_ORDINALS, join(set.members.iter())),
            (env::PEERS_STATUS, status.as_str().to_owned()),
        ],
    )
}

/// The peer variables with discovery disabled: all empty, status `disabled`.
fn disabled_env() -> (PeersStatus, [(&'static str, String); 4]) {
    (
        PeersStatus::Disabled,
        [
            (env::PEERS, String::new()),
            (env::PEER_ORDINALS, String::new()),
            (env::MEMBER_ORDINALS, String::new()),
            (env::PEERS_STATUS, PeersStatus::Disabled.as_str().to_owned()),
        ],
    )
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
        assert_eq!(PeersStatus::of(&not_ready), PeersStatus::NotReady);
        assert_eq!(PeersStatus::NotReady.as_str(), "not-ready");
        assert_eq!(PeersStatus::Found.as_str(), "found");
        assert_eq!(PeersStatus::NoMembers.as_str(), "none");
        assert_eq!(PeersStatus::Disabled.as_str(), "disabled");
    }
}
