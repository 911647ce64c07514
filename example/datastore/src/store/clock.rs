//! The server's hybrid logical clock: the versions it gives writes.
//!
//! A reading is `(millis, counter)`: the wall clock's milliseconds while the wall clock moves
//! forward, and a counter that orders writes within one millisecond or that must follow a
//! higher reading seen from elsewhere. Each new version is higher than every version this
//! server gave or saw before (the previous reading, the key's current copy, every copy handed
//! to it), so on one server versions never go back, whatever the wall clock does. Between
//! servers that exchanged nothing, the order of two writes is the wall clocks' (skew larger
//! than the time between two writes of one key on two servers can order them the other way).
//!
//! Restarts: the clock keeps a *high-water mark* in the data directory (`.clock`, a decimal
//! millisecond count), always ahead of every reading given out. The mark is moved
//! [`LEASE_MILLIS`] ahead at a time, so it is written (and flushed) at most twice a second
//! under steady writes, not once per write. On start the clock waits until the wall clock has
//! passed the mark (at most [`MAX_START_WAIT_MILLIS`]) so that its readings are the wall
//! clock's again: starting *at* the mark would stamp the writes after a restart up to a lease
//! ahead of the other servers, and a restarted server's writes would beat later writes made
//! elsewhere. If the wall clock is further behind the mark (it was set back), the clock starts
//! at the mark and runs ahead of it, with a warning, until the wall clock catches up.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use drain_api::record::Version;

/// The high-water mark's file name in the data directory (a dot file: never a record).
pub const CLOCK_FILE: &str = drain_api::record::CLOCK_FILE;

/// How far ahead of the readings the persisted high-water mark is moved each time.
pub const LEASE_MILLIS: u64 = 500;

/// Longest wait at start for the wall clock to pass the mark.
pub const MAX_START_WAIT_MILLIS: u64 = 2_000;

/// A reading: milliseconds, then a counter.
type Reading = (u64, u32);

/// The hybrid logical clock of one server.
#[derive(Debug)]
pub struct Clock {
    node: String,
    dir: PathBuf,
    now: fn() -> u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last: Reading,
    /// The persisted high-water mark: every reading given out is below it.
    mark: u64,
}

impl Clock {
    /// The clock of the server `node` keeping its mark in `dir`, starting after the mark a
    /// previous run left there (waiting for the wall clock to pass it: see the module doc).
    pub fn open(dir: &Path, node: &str) -> io::Result<Self> {
        Self::open_with(dir, node, wall_millis)
    }

    /// [`Clock::open`] with another wall clock (tests).
    pub fn open_with(dir: &Path, node: &str, now: fn() -> u64) -> io::Result<Self> {
        let mark = read_mark(dir)?;
        let behind = mark.saturating_sub(now());
        if behind > MAX_START_WAIT_MILLIS {
            tracing::warn!(
                behind_ms = behind,
                "the wall clock is behind the versions this server gave before (it was set back): versions run ahead of it until it catches up"
            );
        } else if behind > 0 {
            std::thread::sleep(std::time::Duration::from_millis(behind));
        }
        Ok(Self {
            node: node.to_owned(),
            dir: dir.to_path_buf(),
            now,
            state: Mutex::new(State {
                last: (mark, 0),
                mark,
            }),
        })
    }

    /// The server's node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// A new version, higher than every reading before and than `floor` (the key's copy here).
    pub fn next_after(&self, floor: Option<&Version>) -> io::Result<Version> {
        let mut state = self.state.lock().expect("clock lock poisoned");
        let mut reading = ((self.now)(), 0).max(succ(state.last));
        if let Some(floor) = floor {
            reading = reading.max(succ((floor.millis, floor.counter)));
        }
        self.advance(&mut state, reading)?;
        Ok(Version {
            millis: reading.0,
            counter: reading.1,
            node: self.node.clone(),
        })
    }

    /// Takes note of a version seen from elsewhere (a copy handed over): later versions of this
    /// server are higher.
    pub fn observe(&self, seen: &Version) -> io::Result<()> {
        let mut state = self.state.lock().expect("clock lock poisoned");
        let reading = (seen.millis, seen.counter);
        if reading > state.last {
            self.advance(&mut state, reading)?;
        }
        Ok(())
    }

    /// Moves the clock to `reading`, first moving the persisted mark past it if needed.
    fn advance(&self, state: &mut State, reading: Reading) -> io::Result<()> {
        if reading.0 >= state.mark {
            let mark = reading.0.saturating_add(LEASE_MILLIS);
            write_mark(&self.dir, mark)?;
            state.mark = mark;
        }
        state.last = reading;
        Ok(())
    }
}

/// The next reading after `r`.
fn succ((millis, counter): Reading) -> Reading {
    match counter.checked_add(1) {
        Some(counter) => (millis, counter),
        None => (millis.saturating_add(1), 0),
    }
}

fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn read_mark(dir: &Path) -> io::Result<u64> {
    match fs::read_to_string(dir.join(CLOCK_FILE)) {
        Ok(text) => text.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{CLOCK_FILE} holds no millisecond count: {text:?}"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Writes the mark durably: a temporary file, flushed, renamed over the old one, directory
/// flushed.
fn write_mark(dir: &Path, mark: u64) -> io::Result<()> {
    let tmp = dir.join(format!("{CLOCK_FILE}.tmp"));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(mark.to_string().as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(CLOCK_FILE))?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(millis: u64, counter: u32, node: &str) -> Version {
        Version::new(millis, counter, node)
    }

    #[test]
    fn versions_increase_within_a_millisecond_and_follow_the_wall_clock() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::open_with(dir.path(), "n", || 1_000).unwrap();
        let a = clock.next_after(None).unwrap();
        let b = clock.next_after(None).unwrap();
        assert_eq!(a, v(1_000, 0, "n"));
        assert_eq!(b, v(1_000, 1, "n"));
    }

    #[test]
    fn a_version_follows_the_keys_copy_and_what_was_seen() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::open_with(dir.path(), "a", || 1_000).unwrap();
        // A copy from a server whose clock runs ahead.
        let ahead = v(5_000, 3, "z");
        assert!(clock.next_after(Some(&ahead)).unwrap() > ahead);
        clock.observe(&v(9_000, 0, "z")).unwrap();
        assert!(clock.next_after(None).unwrap() > v(9_000, 0, "z"));
    }

    #[test]
    fn versions_keep_increasing_across_a_restart_with_the_wall_clock_gone_back() {
        let dir = tempfile::tempdir().unwrap();
        let before = {
            let clock = Clock::open_with(dir.path(), "n", || 50_000).unwrap();
            clock.next_after(None).unwrap()
        };
        let clock = Clock::open_with(dir.path(), "n", || 10).unwrap();
        let after = clock.next_after(None).unwrap();
        assert!(after > before, "{after} after {before}");
    }

    static NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn now() -> u64 {
        NOW.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn after_a_restart_versions_follow_the_wall_clock_not_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        NOW.store(1_000, std::sync::atomic::Ordering::SeqCst);
        let before = Clock::open_with(dir.path(), "n", now)
            .unwrap()
            .next_after(None)
            .unwrap();
        // Restarted a moment later, within the lease: it waits for the mark, and its next
        // write carries the wall clock's reading, not one a lease ahead (which would beat the
        // later writes of servers that did not restart).
        NOW.store(1_100, std::sync::atomic::Ordering::SeqCst);
        let clock = Clock::open_with(dir.path(), "n", now).unwrap();
        NOW.store(
            1_000 + LEASE_MILLIS + 7,
            std::sync::atomic::Ordering::SeqCst,
        );
        let after = clock.next_after(None).unwrap();
        assert_eq!(after, v(1_000 + LEASE_MILLIS + 7, 0, "n"));
        assert!(after > before);
    }

    #[test]
    fn the_mark_is_written_once_per_lease_not_per_write() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::open_with(dir.path(), "n", || 1_000).unwrap();
        clock.next_after(None).unwrap();
        let mark = read_mark(dir.path()).unwrap();
        assert_eq!(mark, 1_000 + LEASE_MILLIS);
        for _ in 0..100 {
            clock.next_after(None).unwrap();
        }
        assert_eq!(read_mark(dir.path()).unwrap(), mark);
    }

    #[test]
    fn a_counter_at_its_limit_moves_to_the_next_millisecond() {
        assert_eq!(succ((7, u32::MAX)), (8, 0));
    }
}
