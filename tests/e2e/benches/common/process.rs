//! A process's memory, as the benchmarks read it from `/proc`.

use anyhow::{Context, Result};

/// A process's memory, in MiB (`/proc/<pid>/status`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// `VmRSS`.
    pub rss: f64,
    /// `VmHWM`: the peak RSS.
    pub hwm: f64,
    /// `RssAnon`: the heap and other anonymous memory.
    pub anon: f64,
    /// `RssFile`: mapped files, mostly the binary.
    pub file: f64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB (anon {:.1}, file {:.1}), peak {:.1} MiB",
            self.rss, self.anon, self.file, self.hwm
        )
    }
}

/// The memory of the process `pid` now.
pub fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(key))
            .with_context(|| format!("{key} in /proc/{pid}/status"))?;
        let n: f64 = line
            .split_whitespace()
            .nth(1)
            .context("a number")?
            .parse()?;
        Ok(n / 1024.0)
    };
    Ok(Memory {
        rss: kib("VmRSS:")?,
        hwm: kib("VmHWM:")?,
        anon: kib("RssAnon:")?,
        file: kib("RssFile:")?,
    })
}
