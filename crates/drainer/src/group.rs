//! The hook's process group: which of its processes still run, and stopping them.
//!
//! The hook runs in a process group of its own (its pid is the group's id). Processes it starts
//! stay in that group unless they leave it on purpose (`setsid`, `setpgid`), so the group is
//! what "the processes the hook started" means here. A process counts as running unless it is a
//! zombie (exited, waiting to be collected by its parent or the [reaper](crate::reaper)).

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A process of the group, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    /// Its pid.
    pub pid: i32,
    /// Its command line (or its name in brackets when it has none).
    pub command: String,
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.pid, self.command)
    }
}

/// The processes of group `pgid` that have not exited, read from `/proc`. Without a readable
/// `/proc`, asks the kernel whether the group has any process left (zombies included) and names
/// none.
pub fn running(pgid: i32) -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return match killpg(Pid::from_raw(pgid), None) {
            Ok(()) => vec![Process {
                pid: pgid,
                command: "[process group still has members]".to_owned(),
            }],
            Err(_) => Vec::new(),
        };
    };
    let mut found: Vec<Process> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (name, state, group) = parse_stat(&stat)?;
            (group == pgid && state != 'Z' && state != 'X').then(|| Process {
                pid,
                command: command_line(pid).unwrap_or_else(|| format!("[{name}]")),
            })
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// Name, state and process group from a `/proc/<pid>/stat` line
/// (`pid (name) state ppid pgrp ...`; the name may hold spaces and parentheses).
pub fn parse_stat(stat: &str) -> Option<(&str, char, i32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?;
    let mut fields = stat.get(close + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((name, state, group))
}

fn command_line(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// Sends `signal` to group `pgid`; a group with no process left is no error.
pub fn signal(pgid: i32, signal: Signal) {
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(pgid, %signal, error = %e, "failed to signal the hook's process group")
        }
    }
}

/// Stops what is left of group `pgid`: `SIGTERM`, then `SIGKILL` to what still runs after
/// `grace`. Answers what was still running when it started.
pub async fn stop(pgid: i32, grace: Duration) -> Vec<Process> {
    let left = running(pgid);
    if left.is_empty() {
        return left;
    }
    signal(pgid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline && !running(pgid).is_empty() {
        tokio::time::sleep(POLL).await;
    }
    if !running(pgid).is_empty() {
        signal(pgid, Signal::SIGKILL);
    }
    left
}

/// How often the group is looked at while waiting for it.
pub const POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_with_odd_names() {
        assert_eq!(
            parse_stat("42 (sleep) S 1 40 40 0 -1 4194304"),
            Some(("sleep", 'S', 40))
        );
        assert_eq!(
            parse_stat("7 (a (b) c) Z 1 7 7 0"),
            Some(("a (b) c", 'Z', 7))
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[tokio::test]
    async fn a_group_is_seen_until_its_processes_exit_and_can_be_stopped() {
        let mut child = tokio::process::Command::new("sleep")
            .arg("1000")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pgid = i32::try_from(child.id().unwrap()).unwrap();
        // Until the child has exec'd, /proc shows the parent's command line in it.
        let started = std::time::Instant::now();
        let seen = loop {
            let seen = running(pgid);
            if seen.first().is_some_and(|p| p.command == "sleep 1000")
                || started.elapsed() > Duration::from_secs(5)
            {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].command, "sleep 1000");
        let stopped = stop(pgid, Duration::from_secs(5)).await;
        assert_eq!(stopped, seen);
        let _ = child.wait().await;
        assert!(running(pgid).is_empty());
    }
}
