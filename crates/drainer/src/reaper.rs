//! Orphan reaping in hook mode: the drainer adopts the processes the hook leaves behind and
//! collects their exit status, so they do not pile up as zombies.
//!
//! The hook runs in its own process group and may start background processes that outlive it.
//! When their parent exits they are reparented to the nearest *subreaper* ancestor, or to PID 1;
//! in a drain pod the drainer is often PID 1 of its container. A process that exits is a zombie
//! until its parent waits for it, so without reaping every orphan the hook leaves would stay a
//! zombie for the life of the pod. [`Reaper::start`] makes the drainer a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`), so orphans come to it whether or not it is PID 1, and reaps them.
//!
//! The running hook is the drainer's child too, and tokio must collect *its* exit status. So the
//! reaper never waits for "any child": it peeks at the next exited child without reaping it
//! (`waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT)`), and reaps exactly that pid (`waitpid(pid,
//! WNOHANG)`) only if it is not the hook, which the caller publishes in a [`ChildPid`]. Peeking
//! runs on every SIGCHLD and once a second.
//!
//! Limitations:
//! - the kernel reports exited children oldest first, so while the hook has exited but tokio has
//!   not collected its status yet, peeking stops at the hook: an orphan that exits in that window
//!   waits for the next SIGCHLD or tick (at most a second);
//! - a child killed by a real-time signal cannot be described by `nix` and stops peeking until
//!   it is collected by its own waiter;
//! - any other child the drainer starts and waits for itself (such as a kubeconfig `exec`
//!   credential plugin; drain pods use their service account instead) may have its status taken
//!   by the reaper.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

/// How often the reaper looks for exited orphans besides on SIGCHLD.
pub const TICK: Duration = Duration::from_secs(1);

/// No hook is running.
const NO_CHILD: i32 = 0;
/// A hook is being spawned and its pid is not known yet.
const SPAWNING: i32 = -1;

/// The pid of the hook's running process, shared between the code that runs it and the reaper,
/// which must leave that process to tokio.
#[derive(Clone, Debug)]
pub struct ChildPid(Arc<AtomicI32>);

impl Default for ChildPid {
    fn default() -> Self {
        Self(Arc::new(AtomicI32::new(NO_CHILD)))
    }
}

impl ChildPid {
    /// Marks a spawn as started. Until the returned guard is dropped, the reaper leaves the pid
    /// given to [`SpawnGuard::set`] alone, and before that every child (any exited child may be
    /// the new one).
    pub fn spawning(&self) -> SpawnGuard<'_> {
        self.0.store(SPAWNING, Ordering::SeqCst);
        SpawnGuard(self)
    }

    /// Whether the reaper must leave the exited child `pid` for the hook's owner to collect.
    pub fn protects(&self, pid: Pid) -> bool {
        match self.0.load(Ordering::SeqCst) {
            SPAWNING => true,
            current => current == pid.as_raw(),
        }
    }
}

/// A hook process being spawned or running; dropping it (once tokio collected the process's
/// status, or the spawn failed) lets the reaper reap everything again.
#[derive(Debug)]
pub struct SpawnGuard<'a>(&'a ChildPid);

impl SpawnGuard<'_> {
    /// Records the spawned process's pid.
    pub fn set(&self, pid: u32) {
        let pid = i32::try_from(pid).unwrap_or(SPAWNING);
        self.0.0.store(pid, Ordering::SeqCst);
    }
}

impl Drop for SpawnGuard<'_> {
    fn drop(&mut self) {
        self.0.0.store(NO_CHILD, Ordering::SeqCst);
    }
}

/// Errors starting the reaper.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error("failed to make the drainer a child subreaper")]
    Subreaper(#[source] Errno),
    /// The SIGCHLD handler could not be installed.
    #[error("failed to listen for SIGCHLD")]
    Signal(#[source] std::io::Error),
}

impl ReaperError {
    /// A short category for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Subreaper(_) => "Subreaper",
            Self::Signal(_) => "SigChld",
        }
    }
}

/// The running reaper task; dropping it stops the task.
#[derive(Debug)]
pub struct Reaper {
    task: JoinHandle<()>,
}

impl Reaper {
    /// Makes this process a child subreaper and starts reaping exited children other than the
    /// one `hook` names, on every SIGCHLD and every [`TICK`]. Needs a tokio runtime.
    pub fn start(hook: ChildPid) -> Result<Self, ReaperError> {
        nix::sys::prctl::set_child_subreaper(true).map_err(ReaperError::Subreaper)?;
        let mut sigchld = signal(SignalKind::child()).map_err(ReaperError::Signal)?;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tick.tick() => {}
                }
                reap_orphans(&hook);
            }
        });
        tracing::debug!("reaping orphaned processes as a child subreaper");
        Ok(Self { task })
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reaps every exited child that `hook` does not protect, oldest first, stopping at the first
/// protected one; returns how many were reaped.
pub fn reap_orphans(hook: &ChildPid) -> usize {
    let mut reaped = 0;
    loop {
        let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let pid = match waitid(Id::All, peek) {
            Ok(status) => match status.pid() {
                Some(pid) => pid,
                // `StillAlive`: children, but none has exited.
                None => break,
            },
            Err(Errno::EINTR) => continue,
            // No children at all.
            Err(Errno::ECHILD) => break,
            Err(e) => {
                tracing::debug!(error = %e, "failed to look for exited children");
                break;
            }
        };
        if hook.protects(pid) {
            break;
        }
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => break,
            Ok(status) => {
                reaped += 1;
                tracing::debug!(pid = pid.as_raw(), ?status, "reaped orphaned process");
            }
            Err(Errno::EINTR | Errno::ECHILD) => {} // retry, or its own waiter took it
            Err(e) => {
                tracing::debug!(pid = pid.as_raw(), error = %e, "failed to reap orphaned process");
                break;
            }
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protects_the_hook_and_everything_while_spawning() {
        let hook = ChildPid::default();
        let other = Pid::from_raw(4242);
        assert!(!hook.protects(other), "nothing running");
        {
            let guard = hook.spawning();
            assert!(hook.protects(other), "pid unknown while spawning");
            guard.set(77);
            assert!(hook.protects(Pid::from_raw(77)));
            assert!(!hook.protects(other));
        }
        assert!(!hook.protects(Pid::from_raw(77)), "guard dropped");
    }
}
