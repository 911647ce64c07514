//! The `drainer` binary as a drain pod runs it: exit codes, environment, signal forwarding.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The drainer with a clean environment: no Kubernetes configuration anywhere.
fn drainer(home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_drainer"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("RUST_LOG", "debug")
        .env("DRAIN_STATEFULSET", "datastore")
        .env("DRAIN_NAMESPACE", "test")
        .env("DRAIN_ORDINAL", "2")
        .env("DRAIN_REPLICAS", "2")
        .env("DRAIN_ORDINALS_START", "0")
        .env("DRAIN_POD_NAME", "datastore-2")
        // A temporary directory is no mount point; the tests of that check remove these.
        .env("DRAINER_DATA_DIR", home)
        .env("DRAINER_ALLOW_UNMOUNTED_DATA_DIR", "true")
        .env("DRAIN_TERMINATION_LOG", home.join("termination-log"))
        .stdin(Stdio::null());
    command
}

const RECORD: &str = r#"{"drainCompleted":{"claims":{"data-datastore-2":"u-2"}}}"#;

/// Whether the termination message at `log` holds no completion record: absent, or the
/// failure the drainer wrote there.
fn holds_no_record(log: &Path) -> bool {
    match std::fs::read_to_string(log) {
        Err(_) => true,
        Ok(text) => {
            drain_api::completion::CompletionRecord::parse(&text).is_none()
                && text.starts_with("drain failed: ")
        }
    }
}

#[test]
fn a_finished_drain_writes_the_completion_record_and_nothing_else_does() {
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("termination-log");
    for hook in ["exit 3", "exit 75"] {
        let (code, stderr) = run(drainer(home.path())
            .env("DRAIN_COMPLETION_RECORD", RECORD)
            .args([
                "exec",
                "--no-peers",
                "--max-retries",
                "0",
                "--",
                "sh",
                "-c",
                hook,
            ]));
        assert_ne!(code, Some(0), "{hook}: {stderr}");
        assert!(holds_no_record(&log), "{hook} wrote the record: {stderr}");
    }
    let (code, stderr) = run(drainer(home.path())
        .env("DRAIN_COMPLETION_RECORD", RECORD)
        .args(["exec", "--no-peers", "--", "true"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), RECORD);
}

#[test]
fn a_hook_that_exits_0_when_told_to_stop_is_no_finished_drain() {
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("termination-log");
    let ready = home.path().join("ready");
    let mut child = drainer(home.path())
        .env("DRAIN_COMPLETION_RECORD", RECORD)
        .env("READY", &ready)
        .args(["exec", "--no-peers", "--", "sh", "-c"])
        .arg(r#"trap 'exit 0' TERM; touch "$READY"; while :; do sleep 0.05; done"#)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the hook never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert!(
        !log.exists(),
        "a stopped hook's exit 0 wrote the completion record"
    );
}

/// Runs `command` to completion, capturing its output (the drainer logs to stderr).
fn run(command: &mut Command) -> (Option<i32>, String) {
    let Output { status, stderr, .. } = command.output().unwrap();
    (status.code(), String::from_utf8_lossy(&stderr).into_owned())
}

#[test]
fn exec_exit_codes_pass_through() {
    let home = tempfile::tempdir().unwrap();
    let (code, stderr) =
        run(drainer(home.path()).args(["exec", "--no-peers", "--", "sh", "-c", "exit 3"]));
    assert_eq!(code, Some(3), "{stderr}");
    let (code, stderr) = run(drainer(home.path()).args(["exec", "--no-peers", "--", "true"]));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn exec_with_no_peers_runs_the_hook_with_the_context_and_no_cluster() {
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("env");
    let claim = home.path().join("claim");
    std::fs::create_dir(&claim).unwrap();
    let (code, stderr) = run(drainer(home.path())
        .env("OUT", &out)
        .args(["exec", "--no-peers", "--data-dir"])
        .arg(&claim)
        .args(["--", "sh", "-c", r#"env > "$OUT""#]));
    assert_eq!(code, Some(0), "{stderr}");
    let env = std::fs::read_to_string(&out).unwrap();
    for line in [
        "DRAIN_STATEFULSET=datastore",
        "DRAIN_NAMESPACE=test",
        "DRAIN_ORDINAL=2",
        "DRAIN_REPLICAS=2",
        "DRAIN_ORDINALS_START=0",
        "DRAIN_POD_NAME=datastore-2",
        &format!("DRAIN_DATA_DIR={}", claim.display()),
        "DRAIN_PEERS=",
        "DRAIN_PEERS_STATUS=disabled",
    ] {
        assert!(env.lines().any(|l| l == line), "{line} missing in:\n{env}");
    }
}

#[test]
fn exec_forwards_sigterm_to_the_hook() {
    let home = tempfile::tempdir().unwrap();
    let ready = home.path().join("ready");
    let out = home.path().join("out");
    let script = r#"trap 'echo terminated > "$OUT"; exit 7' TERM; touch "$READY"; while :; do sleep 0.05; done"#;
    let child = drainer(home.path())
        .env("READY", &ready)
        .env("OUT", &out)
        .args(["exec", "--no-peers", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "hook did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("forwarded signal to hook"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "terminated\n");
}

#[test]
fn redistribute_empty_directory_succeeds_without_a_cluster() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (code, stderr) = run(drainer(home.path())
        .args(["redistribute", "--allow-unmounted-data-dir", "--data-dir"])
        .arg(data.path()));
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn without_credentials_the_claim_check_fails_closed_and_nothing_is_recorded() {
    // `/proc` is a mount point, so only the API check can tell that it is not the claim; with
    // no credentials it used to be skipped with a warning, and a hook that found nothing to do
    // exited 0 with the completion record: the claim would have been deleted.
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("termination-log");
    for mode in [
        &["exec", "--no-peers", "--data-dir", "/proc", "--", "true"][..],
        &["redistribute", "--data-dir", "/proc"][..],
    ] {
        let (code, stderr) = run(drainer(home.path())
            .env_remove("DRAINER_ALLOW_UNMOUNTED_DATA_DIR")
            .env_remove("DRAINER_DATA_DIR")
            .env("DRAIN_COMPLETION_RECORD", RECORD)
            .args(mode));
        assert_eq!(code, Some(1), "{mode:?}: {stderr}");
        assert!(
            stderr.contains("cannot prove that the data directory is the drained claim")
                && stderr.contains("Kubernetes credentials"),
            "{mode:?}: {stderr}"
        );
        assert!(holds_no_record(&log), "{mode:?} wrote the record: {stderr}");
        // The failure is in the termination message, where the controller's event quotes it.
        let told = std::fs::read_to_string(&log).unwrap();
        assert!(
            told.contains("cannot prove that the data directory is the drained claim"),
            "{told}"
        );
        std::fs::remove_file(&log).unwrap();
    }
    // Outside a drain pod (no context) the same.
    let (code, stderr) = run(drainer(home.path())
        .env_remove("DRAINER_ALLOW_UNMOUNTED_DATA_DIR")
        .env_remove("DRAIN_POD_NAME")
        .args(["exec", "--no-peers", "--data-dir", "/proc", "--", "true"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("the drain context"), "{stderr}");
}

#[test]
fn redistribute_refuses_a_directory_that_is_not_the_mounted_claim() {
    // An empty directory that is not a mount point: exiting 0 would get the claim deleted.
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (code, stderr) = run(drainer(home.path())
        .env_remove("DRAINER_ALLOW_UNMOUNTED_DATA_DIR")
        .args(["redistribute", "--data-dir"])
        .arg(data.path()));
    assert_eq!(code, Some(drain_api::exit_codes::FAILURE), "{stderr}");
    assert!(stderr.contains("is not a mount point"), "{stderr}");

    // Hook mode too: the hook is not run.
    let marker = home.path().join("ran");
    let (code, stderr) = run(drainer(home.path())
        .env_remove("DRAINER_ALLOW_UNMOUNTED_DATA_DIR")
        .env("MARKER", &marker)
        .args(["exec", "--no-peers", "--data-dir"])
        .arg(data.path())
        .args(["--", "sh", "-c", r#"touch "$MARKER""#]));
    assert_eq!(code, Some(drain_api::exit_codes::FAILURE), "{stderr}");
    assert!(stderr.contains("is not a mount point"), "{stderr}");
    assert!(!marker.exists(), "the hook ran");
}

#[test]
fn redistribute_failures_exit_1_and_keep_the_data() {
    let home = tempfile::tempdir().unwrap();
    let (code, stderr) = run(drainer(home.path())
        .args(["redistribute", "--data-dir"])
        .arg(home.path().join("missing")));
    assert_eq!(code, Some(drain_api::exit_codes::FAILURE), "{stderr}");

    // Records but no Kubernetes API to find peers: fails at once, nothing deleted.
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("k1"), b"v1").unwrap();
    let output = drainer(home.path())
        .args([
            "redistribute",
            "--round-delay",
            "10ms",
            "--allow-unmounted-data-dir",
            "--data-dir",
        ])
        .arg(data.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(drain_api::exit_codes::FAILURE));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("failed to discover peers"), "{stderr}");
    assert_eq!(std::fs::read(data.path().join("k1")).unwrap(), b"v1");
}

#[test]
fn redistribute_needs_the_drain_context() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let output = drainer(home.path())
        .env_remove("DRAIN_ORDINAL")
        .args(["redistribute", "--data-dir"])
        .arg(data.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(drain_api::exit_codes::FAILURE));
    assert!(String::from_utf8_lossy(&output.stderr).contains("DRAIN_ORDINAL"));
}

#[test]
fn help_lists_both_modes() {
    let home = tempfile::tempdir().unwrap();
    let output = drainer(home.path()).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("redistribute") && help.contains("exec"),
        "{help}"
    );
}

#[test]
fn redistribute_stops_on_sigterm_and_keeps_unmoved_records() {
    let home = tempfile::tempdir().unwrap();
    // An API server that refuses connections: discovery keeps retrying in rounds.
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("k1"), b"v1").unwrap();
    let mut child = drainer(home.path())
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "redistribute",
            "--round-delay",
            "30s",
            "--allow-unmounted-data-dir",
            "--data-dir",
        ])
        .arg(data.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "still retrying discovery"
    );
    let sent = Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "stops promptly, not after the grace period"
    );
    assert_eq!(
        output.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read(data.path().join("k1")).unwrap(),
        b"v1",
        "record kept"
    );
}

#[test]
fn peer_traffic_ignores_the_proxy_from_the_environment() {
    // `HTTP_PROXY` and `ALL_PROXY` point at a listener that counts connections and answers
    // 502. The drainer's first request of a rebalance pass (handing an earlier version's
    // claimed file back to its own server) must reach the server directly.
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let through_proxy = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&through_proxy);
    std::thread::spawn(move || {
        for stream in proxy.incoming() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Ok(mut stream) = stream {
                use std::io::Write;
                let _ = stream.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
            }
        }
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let store = datastore::Store::open_pod(store_dir.path(), "datastore-2", None).unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(datastore::http::serve_with(
        listener,
        store,
        Default::default(),
        std::future::pending(),
    ));
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join(".rebalance-k"), b"value").unwrap();

    let (_, stderr) = run(drainer(home.path())
        .env("HTTP_PROXY", &proxy_url)
        .env("http_proxy", &proxy_url)
        .env("ALL_PROXY", &proxy_url)
        .env("all_proxy", &proxy_url)
        .args(["rebalance", "--interval", "0", "--data-dir"])
        .arg(&data)
        .args(["--local-url", &format!("http://{addr}")]));

    assert_eq!(
        through_proxy.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "peer traffic went through the proxy:\n{stderr}"
    );
    assert!(
        !data.join(".rebalance-k").exists(),
        "the claimed file was not handed back:\n{stderr}"
    );
    let client = datastore::Client::new(&format!("http://{addr}")).unwrap();
    assert_eq!(
        runtime.block_on(client.get("k")).unwrap().as_deref(),
        Some(&b"value"[..])
    );
}

#[test]
fn redistribute_refuses_a_record_naming_a_claim_it_does_not_drain() {
    // A container that mounts a second claim (to satisfy the template check) while it drains
    // one directory: its record names both, and writing it would prove the second drained.
    let home = tempfile::tempdir().unwrap();
    let log = home.path().join("termination-log");
    let two =
        r#"{"drainCompleted":{"claims":{"data-datastore-2":"u-2","index-datastore-2":"u-3"}}}"#;
    let (code, stderr) = run(drainer(home.path())
        .env("DRAIN_COMPLETION_RECORD", two)
        .args(["redistribute"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "names claims data-datastore-2, index-datastore-2, but it drains only one directory"
        ),
        "{stderr}"
    );
    assert!(holds_no_record(&log), "the record was written: {stderr}");
}

#[test]
fn a_record_may_name_only_the_claim_the_drain_verified() {
    use drainer::{Error, check_record_names_only, cli::DrainContext};
    let context = |record: &str| DrainContext {
        completion_record: Some(record.to_owned()),
        ..DrainContext::default()
    };
    let two =
        r#"{"drainCompleted":{"claims":{"data-datastore-2":"u-2","index-datastore-2":"u-3"}}}"#;
    assert!(check_record_names_only(&context(RECORD), Some("data-datastore-2")).is_ok());
    assert!(check_record_names_only(&context(RECORD), None).is_ok());
    for (record, drained) in [
        (RECORD, Some("index-datastore-2")),
        (two, Some("data-datastore-2")),
        (two, None),
    ] {
        assert!(
            matches!(
                check_record_names_only(&context(record), drained),
                Err(Error::RecordNamesUndrained { .. })
            ),
            "{record} {drained:?}"
        );
    }
}
