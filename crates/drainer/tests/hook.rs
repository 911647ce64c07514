//! Hook mode: real commands (`sh` scripts) run through `hook::run` with fake peer sources and
//! signals from a channel, and the `drainer exec` binary for what needs a process of its own
//! (its signal handlers, orphan reaping, the Kubernetes client).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use drain_api::exit_codes;
use drainer::hook::{self, Discovery, Hook, HookError, RetryPolicy, Signals};
use drainer::peers::{Peer, PeerSet, PeerSource, PeersError, StaticPeers};
use drainer::reaper::ChildPid;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use url::Url;

fn sh(script: &str) -> Vec<OsString> {
    ["sh", "-c", script].iter().map(OsString::from).collect()
}

fn hook(command: Vec<OsString>, env: &[(&str, &str)], max_retries: usize) -> Hook {
    Hook {
        command,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        retry: RetryPolicy {
            max_retries,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        },
        run_without_ready_peers: false,
        processes_timeout: Duration::from_secs(10),
    }
}

/// `--no-peers`.
fn disabled() -> Discovery<StaticPeers> {
    Discovery::Disabled
}

/// Runs `hook` with signals that never come.
async fn run<P: PeerSource>(hook: &Hook, discovery: &Discovery<P>) -> Result<i32, HookError> {
    let (_never, mut signals) = Signals::channel();
    hook::run(hook, discovery, &mut signals, &ChildPid::default()).await
}

/// A source whose first `failures` discoveries fail, then returns `set`.
struct Flaky {
    failures: usize,
    set: PeerSet,
    calls: AtomicUsize,
}

impl Flaky {
    fn new(failures: usize, set: PeerSet) -> Self {
        Self {
            failures,
            set,
            calls: AtomicUsize::new(0),
        }
    }

    fn always_failing() -> Self {
        Self::new(usize::MAX, PeerSet::default())
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl PeerSource for Flaky {
    async fn discover(&self) -> Result<PeerSet, PeersError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.failures {
            return Err(PeersError::Unavailable {
                reason: "statefulsets is forbidden".to_owned(),
            });
        }
        Ok(self.set.clone())
    }
}

/// A source whose discovery never finishes (an API server that does not answer).
struct Hanging;

impl PeerSource for Hanging {
    async fn discover(&self) -> Result<PeerSet, PeersError> {
        std::future::pending().await
    }
}

fn runs(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn peer(ordinal: i32, port: u16) -> Peer {
    Peer::new(
        ordinal,
        format!("ds-{ordinal}"),
        Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap(),
    )
}

#[tokio::test]
async fn retry_code_reruns_until_success() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let log = dir.path().join("runs");
    // Exits 75 the first time (no state yet), 0 the next.
    let script =
        r#"echo run >> "$LOG"; if [ -f "$STATE" ]; then exit 0; fi; touch "$STATE"; exit 75"#;
    let env = [
        ("STATE", state.to_str().unwrap()),
        ("LOG", log.to_str().unwrap()),
    ];
    let code = run(&hook(sh(script), &env, 10), &disabled()).await.unwrap();
    assert_eq!(code, exit_codes::SUCCESS);
    assert_eq!(runs(&log), 2);
}

#[tokio::test]
async fn other_codes_are_returned_without_retry() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let env = [("LOG", log.to_str().unwrap())];
    let code = run(
        &hook(sh(r#"echo run >> "$LOG"; exit 3"#), &env, 10),
        &disabled(),
    )
    .await
    .unwrap();
    assert_eq!(code, 3);
    assert_eq!(runs(&log), 1);

    let code = run(&hook(sh("exit 0"), &[], 10), &disabled())
        .await
        .unwrap();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn retries_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let env = [("LOG", log.to_str().unwrap())];
    let err = run(
        &hook(sh(r#"echo run >> "$LOG"; exit 75"#), &env, 2),
        &disabled(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, HookError::RetriesExhausted { attempts: 3 }),
        "{err}"
    );
    assert_eq!(runs(&log), 3);
}

#[tokio::test]
async fn killed_by_a_signal_reports_128_plus_signal() {
    let code = run(&hook(sh("kill -KILL $$"), &[], 0), &disabled())
        .await
        .unwrap();
    assert_eq!(code, 128 + 9);
}

#[tokio::test]
async fn missing_program_is_a_spawn_error() {
    let command = vec![OsString::from("/nonexistent/drainer-test-hook")];
    let err = run(&hook(command, &[], 0), &disabled()).await.unwrap_err();
    assert!(matches!(err, HookError::Spawn { .. }), "{err}");
}

#[tokio::test]
async fn context_and_peers_are_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let mut set = PeerSet::all_ready([peer(2, 9002), peer(0, 9000)]);
    set.members = vec![0, 1, 2];
    let env = [
        ("OUT", out.to_str().unwrap()),
        ("DRAIN_STATEFULSET", "ds"),
        ("DRAIN_ORDINAL", "3"),
        ("DRAIN_DATA_DIR", "/data"),
    ];
    let discovery = Discovery::Source(StaticPeers(set));
    let code = run(&hook(sh(r#"env > "$OUT""#), &env, 0), &discovery)
        .await
        .unwrap();
    assert_eq!(code, 0);
    let seen = read_env(&out);
    assert_eq!(seen["DRAIN_STATEFULSET"], "ds");
    assert_eq!(seen["DRAIN_ORDINAL"], "3");
    assert_eq!(seen["DRAIN_DATA_DIR"], "/data");
    assert_eq!(
        seen["DRAIN_PEERS"],
        "http://127.0.0.1:9000,http://127.0.0.1:9002"
    );
    assert_eq!(seen["DRAIN_PEER_ORDINALS"], "0,2");
    assert_eq!(seen["DRAIN_MEMBER_ORDINALS"], "0,1,2");
    assert_eq!(seen["DRAIN_PEERS_STATUS"], "found");
    assert_eq!(seen["DRAIN_HOOK_ATTEMPT"], "1");
}

#[tokio::test]
async fn without_a_ready_peer_a_naive_hook_is_not_run_and_the_drain_fails() {
    // A script that copies to each of $DRAIN_PEERS and exits 0 would move nothing with an
    // empty list. Scaled to zero (no other members) or with no member Ready, it is not run.
    let not_ready = PeerSet {
        members: vec![0, 1],
        ..PeerSet::default()
    };
    for (set, status) in [(PeerSet::default(), "none"), (not_ready, "not-ready")] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runs");
        let env = [("LOG", log.to_str().unwrap())];
        let script =
            r#"for p in $(echo "$DRAIN_PEERS" | tr , ' '); do :; done; echo run >> "$LOG""#;
        let discovery = Discovery::Source(StaticPeers(set));
        let err = run(&hook(sh(script), &env, 2), &discovery)
            .await
            .unwrap_err();
        assert!(
            matches!(err, HookError::NoReadyPeers { attempts: 3, status: s } if s.as_str() == status),
            "{err:?}"
        );
        assert!(drainer::error_chain(&err).contains(&format!("DRAIN_PEERS_STATUS={status}")));
        assert_eq!(runs(&log), 0, "[{status}] the hook never ran");
    }
}

#[tokio::test]
async fn a_hook_that_opts_in_runs_without_ready_peers_and_is_told_so() {
    let not_ready = PeerSet {
        members: vec![0, 1],
        ..PeerSet::default()
    };
    for (set, status, members) in [
        (PeerSet::default(), "none", ""),
        (not_ready, "not-ready", "0,1"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let env = [("OUT", out.to_str().unwrap())];
        let discovery = Discovery::Source(StaticPeers(set));
        let opted_in = Hook {
            run_without_ready_peers: true,
            ..hook(sh(r#"env > "$OUT""#), &env, 0)
        };
        assert_eq!(run(&opted_in, &discovery).await.unwrap(), 0);
        let seen = read_env(&out);
        assert_eq!(seen["DRAIN_PEERS_STATUS"], status);
        assert_eq!(seen["DRAIN_PEERS"], "");
        assert_eq!(seen["DRAIN_MEMBER_ORDINALS"], members);
    }
}

#[tokio::test]
async fn a_hook_that_exits_0_is_done_only_once_the_processes_it_started_have_exited() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("copied");
    let env = [("MARKER", marker.to_str().unwrap())];
    // The copy runs in the background; the script itself exits 0 at once.
    let script = r#"(sleep 1.5; touch "$MARKER") & exit 0"#;
    let started = Instant::now();
    let code = run(&hook(sh(script), &env, 0), &disabled()).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        marker.exists(),
        "the drain finished before the background copy did ({:?})",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_hook_that_leaves_a_process_running_is_no_finished_drain_and_the_process_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let env = [("PIDFILE", pidfile.to_str().unwrap())];
    // A daemon the script forgot to stop.
    let script = r#"sleep 1000 & echo $! > "$PIDFILE"; exit 0"#;
    let impatient = Hook {
        processes_timeout: Duration::from_millis(500),
        ..hook(sh(script), &env, 0)
    };
    let err = run(&impatient, &disabled()).await.unwrap_err();
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let HookError::LeftRunning { processes, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(processes.len(), 1, "{processes:?}");
    assert_eq!(processes[0].pid, pid);
    assert_eq!(processes[0].command, "sleep 1000");
    let message = drainer::error_chain(&err);
    assert!(message.contains("sleep 1000"), "{message}");
    // Stopped: gone, or a zombie waiting for whoever adopted it.
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| drainer::group::parse_stat(&stat).map(|(_, state, _)| state != 'Z'))
        .unwrap_or(false);
    assert!(!alive, "the leftover process still runs");
}

#[tokio::test]
async fn no_peers_runs_the_hook_with_status_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let env = [("OUT", out.to_str().unwrap())];
    let code = run(&hook(sh(r#"env > "$OUT""#), &env, 0), &disabled())
        .await
        .unwrap();
    assert_eq!(code, 0);
    let seen = read_env(&out);
    assert_eq!(seen["DRAIN_PEERS_STATUS"], "disabled");
    assert_eq!(seen["DRAIN_PEERS"], "");
    assert_eq!(seen["DRAIN_PEER_ORDINALS"], "");
    assert_eq!(seen["DRAIN_MEMBER_ORDINALS"], "");
}

#[tokio::test]
async fn failed_discovery_never_runs_the_hook_and_fails_after_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let env = [("MARKER", marker.to_str().unwrap())];
    let source = Flaky::always_failing();
    let discovery = Discovery::Source(source);
    let err = run(&hook(sh(r#"touch "$MARKER""#), &env, 2), &discovery)
        .await
        .unwrap_err();
    assert!(
        matches!(err, HookError::DiscoveryFailed { attempts: 3, .. }),
        "{err}"
    );
    let chain = drainer::error_chain(&err);
    assert!(chain.contains("--no-peers"), "{chain}");
    assert!(chain.contains("statefulsets is forbidden"), "{chain}");
    let Discovery::Source(source) = &discovery else {
        unreachable!()
    };
    assert_eq!(source.calls(), 3, "one discovery per attempt");
    assert!(!marker.exists(), "the hook ran without peers");
}

#[tokio::test]
async fn discovery_that_recovers_runs_the_hook_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let log = dir.path().join("runs");
    let env = [
        ("OUT", out.to_str().unwrap()),
        ("LOG", log.to_str().unwrap()),
    ];
    let discovery = Discovery::Source(Flaky::new(2, PeerSet::all_ready([peer(0, 9000)])));
    let script = r#"echo run >> "$LOG"; env > "$OUT""#;
    let code = run(&hook(sh(script), &env, 2), &discovery).await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(runs(&log), 1);
    let seen = read_env(&out);
    assert_eq!(seen["DRAIN_PEERS_STATUS"], "found");
    assert_eq!(seen["DRAIN_PEERS"], "http://127.0.0.1:9000");
    assert_eq!(
        seen["DRAIN_HOOK_ATTEMPT"], "1",
        "counts runs of the command"
    );
}

#[tokio::test]
async fn sigterm_during_discovery_stops_at_once_without_running_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let env = [("MARKER", marker.to_str().unwrap())];
    let hook = hook(sh(r#"touch "$MARKER""#), &env, 10);
    let (sender, mut signals) = Signals::channel();
    let running = ChildPid::default();
    let started = Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sender.send(Signal::SIGTERM).unwrap();
        // Keep the channel open: a closed one would look like "no more signals".
        std::future::pending::<()>().await;
    });
    let code = tokio::time::timeout(
        Duration::from_secs(2),
        hook::run(&hook, &Discovery::Source(Hanging), &mut signals, &running),
    )
    .await
    .expect("still waiting for discovery 2s later")
    .unwrap();
    assert_eq!(code, 143);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!marker.exists(), "the hook ran");
}

#[tokio::test]
async fn a_signal_during_the_backoff_stops_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let env = [("MARKER", marker.to_str().unwrap())];
    let mut hook = hook(sh(r#"touch "$MARKER""#), &env, 10);
    hook.retry.base_delay = Duration::from_secs(60);
    hook.retry.max_delay = Duration::from_secs(60);
    let (sender, mut signals) = Signals::channel();
    let discovery = Discovery::Source(Flaky::always_failing());
    let Discovery::Source(source) = &discovery else {
        unreachable!()
    };
    let running = ChildPid::default();
    let run = hook::run(&hook, &discovery, &mut signals, &running);
    // Signal once the first discovery failed, so the drainer is in its 60s backoff.
    let signal = async {
        while source.calls() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sender.send(Signal::SIGINT).unwrap();
    };
    let (code, ()) =
        tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(run, signal) })
            .await
            .expect("still in the backoff 2s later");
    assert_eq!(code.unwrap(), 130);
    assert_eq!(source.calls(), 1);
    assert!(!marker.exists());
}

#[tokio::test]
async fn a_signal_while_the_hook_runs_is_forwarded_and_ends_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let log = dir.path().join("runs");
    let env = [
        ("READY", ready.to_str().unwrap()),
        ("LOG", log.to_str().unwrap()),
    ];
    // Asks for a retry when terminated; the drainer must not run it again.
    let script = r#"exec 2>/dev/null; echo run >> "$LOG"; trap 'exit 75' TERM; touch "$READY"; while :; do sleep 0.05; done"#;
    let hook = hook(sh(script), &env, 10);
    let (sender, mut signals) = Signals::channel();
    let waiter = async {
        while !ready.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sender.send(Signal::SIGTERM).unwrap();
        std::future::pending::<()>().await;
    };
    let (discovery, running) = (disabled(), ChildPid::default());
    let code = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            code = hook::run(&hook, &discovery, &mut signals, &running) => code,
            () = waiter => unreachable!(),
        }
    })
    .await
    .expect("the hook did not stop")
    .unwrap();
    assert_eq!(code, exit_codes::RETRY);
    assert_eq!(runs(&log), 1);
}

#[tokio::test]
async fn each_attempt_is_numbered() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("attempts");
    let env = [("LOG", log.to_str().unwrap())];
    let script =
        r#"echo "$DRAIN_HOOK_ATTEMPT" >> "$LOG"; [ "$DRAIN_HOOK_ATTEMPT" = 3 ] || exit 75"#;
    let code = run(&hook(sh(script), &env, 5), &disabled()).await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "1\n2\n3\n");
}

// The `drainer exec` binary.

/// The drainer with the drain context and a clean environment: no Kubernetes configuration.
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
        .env("DRAIN_POD_NAME", "datastore-2")
        // A temporary directory is no mount point (the check has its own tests in cli.rs).
        .env("DRAINER_DATA_DIR", home)
        .env("DRAINER_ALLOW_UNMOUNTED_DATA_DIR", "true")
        .stdin(Stdio::null());
    command
}

fn output(command: &mut Command) -> (Option<i32>, String) {
    let Output { status, stderr, .. } = command.output().unwrap();
    (status.code(), String::from_utf8_lossy(&stderr).into_owned())
}

#[test]
fn binary_without_a_kubernetes_api_fails_after_the_retries_without_running_the_hook() {
    let home = tempfile::tempdir().unwrap();
    let marker = home.path().join("ran");
    let (code, stderr) = output(drainer(home.path()).env("MARKER", &marker).args([
        "exec",
        "--max-retries",
        "2",
        "--retry-base-delay",
        "10ms",
        "--",
        "sh",
        "-c",
        r#"touch "$MARKER""#,
    ]));
    assert_eq!(code, Some(exit_codes::FAILURE), "{stderr}");
    assert!(!marker.exists(), "the hook ran without peers:\n{stderr}");
    assert_eq!(
        stderr
            .matches("peer discovery failed, not running the hook")
            .count(),
        2,
        "a warning per retry:\n{stderr}"
    );
    assert!(
        stderr.contains("peer discovery failed on attempt 3"),
        "{stderr}"
    );
    assert!(
        stderr.contains("failed to configure the kubernetes client"),
        "{stderr}"
    );
    assert!(stderr.contains("--no-peers"), "{stderr}");
}

#[test]
fn binary_without_the_drain_context_fails_at_once_without_running_the_hook() {
    let home = tempfile::tempdir().unwrap();
    let marker = home.path().join("ran");
    let started = Instant::now();
    let (code, stderr) = output(
        drainer(home.path())
            .env_remove("DRAIN_ORDINAL")
            .env("MARKER", &marker)
            .args(["exec", "--", "sh", "-c", r#"touch "$MARKER""#]),
    );
    assert_eq!(code, Some(exit_codes::FAILURE), "{stderr}");
    assert!(!marker.exists(), "the hook ran without peers:\n{stderr}");
    assert!(stderr.contains("DRAIN_ORDINAL"), "{stderr}");
    assert!(stderr.contains("--no-peers"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no retries (the first backoff is 1s, the next ones longer)"
    );
}

#[test]
fn binary_no_peers_runs_the_hook_with_status_disabled_even_without_context() {
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("env");
    let (code, stderr) = output(
        drainer(home.path())
            .env_remove("DRAIN_ORDINAL")
            .env("OUT", &out)
            .args(["exec", "--no-peers", "--", "sh", "-c", r#"env > "$OUT""#]),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let seen = read_env(&out);
    assert_eq!(seen["DRAIN_PEERS_STATUS"], "disabled");
    assert_eq!(seen["DRAIN_PEERS"], "");
}

/// A kubeconfig pointing at `server`, with no credentials.
fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn binary_stops_on_sigterm_while_discovery_hangs() {
    let home = tempfile::tempdir().unwrap();
    let marker = home.path().join("ran");
    // An API server that accepts connections and never answers.
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let server = format!("http://{}", api.local_addr().unwrap());
    let mut child = drainer(home.path())
        .env("KUBECONFIG", kubeconfig(home.path(), &server))
        .env("MARKER", &marker)
        .args(["exec", "--", "sh", "-c", r#"touch "$MARKER""#])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let _connection = loop {
        match api.accept() {
            Ok((connection, _)) => break connection,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "the drainer never asked for peers"
                );
                assert!(child.try_wait().unwrap().is_none(), "the drainer exited");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    let sent = Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "stops promptly:\n{stderr}"
    );
    assert_eq!(output.status.code(), Some(143), "{stderr}");
    assert!(!marker.exists(), "the hook ran:\n{stderr}");
}

/// The state letter and parent pid of `pid` from `/proc/<pid>/stat`, if it exists.
fn proc_state(pid: i32) -> Option<(String, i32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.to_owned();
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid, stat))
}

#[test]
fn binary_reaps_the_orphans_the_hook_leaves() {
    let home = tempfile::tempdir().unwrap();
    let pid_file = home.path().join("orphan.pid");
    let second = home.path().join("second");
    // The first run leaves a background process behind, outside its process group (which the
    // drainer would stop), and asks for a retry; the second keeps the drainer busy while the
    // orphan exits.
    let script = r#"
        if [ "$DRAIN_HOOK_ATTEMPT" = 1 ]; then
            setsid sh -c 'echo $$ > "$PID_FILE.tmp" && mv "$PID_FILE.tmp" "$PID_FILE" && exec sleep 2' \
                >/dev/null 2>&1 &
            # Exit only once the orphan has left the group: the drainer stops what is left of
            # the group after a failed run, and would kill a child still about to call setsid.
            while [ ! -e "$PID_FILE" ]; do sleep 0.01; done
            exit 75
        fi
        touch "$SECOND"
        sleep 5
    "#;
    let mut child = drainer(home.path())
        .env("PID_FILE", &pid_file)
        .env("SECOND", &second)
        .args([
            "exec",
            "--no-peers",
            "--retry-base-delay",
            "100ms",
            "--",
            "sh",
            "-c",
            script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drainer_pid = child.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pid_file.exists() {
        assert!(Instant::now() < deadline, "the hook wrote no pid file");
        assert!(child.try_wait().unwrap().is_none(), "the drainer exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    let written = Instant::now();
    let orphan: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Adopted by the drainer (a child subreaper) once the first run's shell exited.
    loop {
        match proc_state(orphan) {
            Some((_, ppid, _)) if ppid == drainer_pid => break,
            Some((_, _, stat)) => {
                assert!(
                    written.elapsed() < Duration::from_millis(1800),
                    "not adopted by the drainer: {stat}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            None => panic!("orphan {orphan} gone before it was adopted"),
        }
    }
    // It exits 2s after it started; reaped on SIGCHLD, or by the next tick at the latest.
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(written.elapsed()));
    assert!(second.exists(), "the second run started");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the drainer is still running its second attempt"
    );
    if let Some((state, ppid, stat)) = proc_state(orphan) {
        assert!(
            ppid != drainer_pid && state != "Z",
            "orphan not reaped: {stat}"
        );
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reaped orphaned process"), "{stderr}");
}
