//! The fault suite's witness of finished drains (issue 21): a TCP listener the test process
//! runs on the cluster's bridge address, to which each drain script reports its completion as
//! its very last step; the independent checker judges I1 from these reports
//! ([`checker::Witness::Reports`]).
//!
//! A report is one line, the completion record the controller handed the drain pod
//! (`$DRAIN_COMPLETION_RECORD`, naming its claims by name and UID). The witness notes the
//! [`std::time::Instant`] the line arrived (the clock of the checker's history), and only then
//! answers `ok`; anything that is not a completion record is answered `rejected` and kept to
//! be shown. The script goes on to write its completion record only if the answer was `ok`
//! ([`Witness::script`]), so a drain whose report was not delivered is a failed attempt, never
//! a deleted claim without a report. A script stopped early (a SIGTERM it answers with
//! `exit 0`, a probe's kill) never reports.
//!
//! It listens on [`BRIDGE_IP`] only (the address the pods reach the host at, on the cluster's
//! own bridge; no other network), on a port the system picks; the port is written into the
//! drain scripts ([`Witness::report_step`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use checker::Report;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The host's address on the pods' bridge (`BRIDGE_IP` of `tests/cluster/lib/common.sh`).
pub const BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

/// The longest report line read (a completion record names a few claims).
const MAX_LINE: u64 = 64 * 1024;

/// How long a connection may take to send its line.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the witness received.
#[derive(Default)]
struct Received {
    reports: Vec<Report>,
    rejected: Vec<String>,
}

/// The witness: listening until dropped.
pub struct Witness {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl Witness {
    /// Listens on [`BRIDGE_IP`], on a port the system picks (the local cluster must be up).
    pub async fn start() -> Result<Self> {
        Self::start_on(IpAddr::V4(BRIDGE_IP)).await
    }

    /// Listens on `ip`, on a port the system picks.
    async fn start_on(ip: IpAddr) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .with_context(|| format!("the witness cannot listen on {ip}"))?;
        let addr = listener.local_addr().context("the witness's address")?;
        let received = Arc::new(Mutex::new(Received::default()));
        let task = tokio::spawn({
            let received = Arc::clone(&received);
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    tokio::spawn(receive(stream, Arc::clone(&received)));
                }
            }
        });
        Ok(Self {
            addr,
            received,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shell step that reports the drain's completion: it succeeds only if the witness
    /// acknowledged the report.
    pub fn report_step(&self) -> String {
        format!(
            r#"[ "$(printf '%s\n' "$DRAIN_COMPLETION_RECORD" | timeout 10 nc -w 3 {} {})" = ok ]"#,
            self.addr.ip(),
            self.addr.port()
        )
    }

    /// The shell step that reports, in place of the record handed to the container, the one
    /// claim of claim template `template` this container drained (`<template>-$DRAIN_POD_NAME`,
    /// its UID read from the record): the report names only what the script itself drained,
    /// whatever the record handed to it names, so the checker judges each claim by the
    /// container that drains it.
    pub fn claim_report_step(&self, template: &str) -> String {
        format!(
            r#"claim="{template}-$DRAIN_POD_NAME"; uid=$(printf '%s' "$DRAIN_COMPLETION_RECORD" | sed -n "s/.*\"$claim\":\"\([^\"]*\)\".*/\1/p"); [ "$(printf '{{"drainCompleted":{{"claims":{{"%s":"%s"}}}}}}\n' "$claim" "$uid" | timeout 10 nc -w 3 {} {})" = ok ]"#,
            self.addr.ip(),
            self.addr.port()
        )
    }

    /// As [`Witness::script`], reporting only the claim of `template` ([`Witness::claim_report_step`]).
    pub fn claim_script(&self, drain: &str, template: &str) -> String {
        format!("{drain}\n{}", self.claim_report_step(template))
    }

    /// A drain script that runs `drain` and then, as its last step, reports to the witness: its
    /// status is the report's (0 only if delivered), so a drain template that writes the
    /// completion record after a script that succeeded (`e2e::objects::drain_template`) writes
    /// it only after a delivered report. A `drain` that leaves early with `exit` never reports.
    pub fn script(&self, drain: &str) -> String {
        format!("{drain}\n{}", self.report_step())
    }

    /// The reports received so far, in arrival order.
    pub fn reports(&self) -> Vec<Report> {
        self.received.lock().expect("witness").reports.clone()
    }

    /// The lines received that were not completion records.
    pub fn rejected(&self) -> Vec<String> {
        self.received.lock().expect("witness").rejected.clone()
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one line from a drain script, notes it, then answers `ok` (a report) or `rejected`.
/// A connection that closes or times out before a whole line is not an answer to anything.
async fn receive(stream: TcpStream, received: Arc<Mutex<Received>>) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let read = tokio::time::timeout(
        READ_TIMEOUT,
        (&mut stream).take(MAX_LINE).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) || !line.ends_with('\n') {
        return;
    }
    let at = Instant::now();
    let answer = {
        let mut received = received.lock().expect("witness");
        match Report::parse(&line, at) {
            Some(report) => {
                received.reports.push(report);
                "ok\n"
            }
            None => {
                received.rejected.push(line.trim_end().to_owned());
                "rejected\n"
            }
        }
    };
    let stream = stream.get_mut();
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    //! The report step run by the host's busybox (the one the test image is made of, a
    //! dependency of `tests/cluster/up`), against a witness on the loopback address.

    use super::*;

    const RECORD: &str = r#"{"drainCompleted":{"claims":{"data-web-2":"u-2"}}}"#;

    /// Runs `script` in busybox's `sh` with `$DRAIN_COMPLETION_RECORD` set to `record`; its
    /// exit status.
    async fn run(script: &str, record: &str) -> i32 {
        tokio::process::Command::new("busybox")
            .args(["sh", "-c", script])
            .env("DRAIN_COMPLETION_RECORD", record)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .expect("run busybox (installed by tests/cluster/up)")
            .code()
            .unwrap_or(-1)
    }

    /// The shell command of `drain_template(script)`, its termination log at `log`.
    fn template_command(script: &str, log: &std::path::Path) -> String {
        let template = crate::objects::drain_template(script, &["data"], serde_json::json!({}));
        let template: serde_json::Value = serde_json::from_str(&template).expect("json");
        template["spec"]["containers"][0]["command"][2]
            .as_str()
            .expect("sh -c SCRIPT")
            .replace("/dev/termination-log", &log.display().to_string())
    }

    #[tokio::test]
    async fn a_drain_template_writes_its_record_only_after_a_delivered_report() {
        let witness = Witness::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .await
            .expect("listen");
        let log = std::env::temp_dir().join(format!("witness-test-{}", std::process::id()));
        let before = Instant::now();
        let drain = "trap 'exit 0' TERM; sleep 0.1 & wait";
        let command = template_command(&witness.script(drain), &log);
        assert_eq!(run(&command, RECORD).await, 0);
        let written = std::fs::read_to_string(&log).expect("the record was written");
        let _ = std::fs::remove_file(&log);
        assert_eq!(written, RECORD);
        let reports = witness.reports();
        assert_eq!(reports.len(), 1);
        assert!(reports[0].names("data-web-2", "u-2") && reports[0].at > before);
        // A drain stopped by SIGTERM, which it answers with `exit 0`, neither reports nor
        // writes the record.
        let stopped = witness.script("trap 'exit 0' TERM; sleep 3 & wait");
        let mut child = tokio::process::Command::new("busybox")
            .args(["sh", "-c", &template_command(&stopped, &log)])
            .env("DRAIN_COMPLETION_RECORD", RECORD)
            .spawn()
            .expect("run busybox");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pid = child.id().expect("running").to_string();
        let kill = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(kill.success());
        assert_eq!(child.wait().await.expect("wait").code(), Some(0));
        assert!(!log.exists());
        assert_eq!(witness.reports().len(), 1);
        assert!(witness.rejected().is_empty());
    }

    #[tokio::test]
    async fn a_claim_report_names_only_the_claim_its_container_drained() {
        let witness = Witness::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .await
            .expect("listen");
        let both = r#"{"drainCompleted":{"claims":{"data-web-2":"u-2","index-web-2":"u-3"}}}"#;
        let status = tokio::process::Command::new("busybox")
            .args(["sh", "-c", &witness.claim_script("true", "index")])
            .env("DRAIN_COMPLETION_RECORD", both)
            .env("DRAIN_POD_NAME", "web-2")
            .stdin(std::process::Stdio::null())
            .status()
            .await
            .expect("run busybox");
        assert!(status.success());
        let reports = witness.reports();
        assert_eq!(reports.len(), 1, "{:?}", witness.rejected());
        assert!(reports[0].names("index-web-2", "u-3"));
        assert!(!reports[0].names("data-web-2", "u-2"));
    }

    #[tokio::test]
    async fn a_report_that_is_not_a_record_or_that_nobody_hears_fails_the_step() {
        let witness = Witness::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .await
            .expect("listen");
        // Not a completion record (e.g. no record handed to the pod): answered, not counted.
        assert_ne!(run(&witness.script("true"), "").await, 0);
        assert_ne!(run(&witness.script("true"), "done").await, 0);
        assert_eq!(witness.rejected(), ["", "done"]);
        assert!(witness.reports().is_empty());
        // Nobody listening: the step fails.
        let step = witness.script("true");
        drop(witness);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_ne!(run(&step, RECORD).await, 0);
    }
}
