//! Hook mode: real commands (`sh` scripts) run through `hook::run`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use drain_api::exit_codes;
use drainer::hook::{self, Hook, HookError, RetryPolicy};
use drainer::peers::{Peer, PeerSet, StaticPeers, Unavailable};
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
    }
}

fn no_peers() -> Unavailable {
    Unavailable {
        reason: "test".to_owned(),
    }
}

fn runs(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
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
    let code = hook::run(&hook(sh(script), &env, 10), &no_peers())
        .await
        .unwrap();
    assert_eq!(code, exit_codes::SUCCESS);
    assert_eq!(runs(&log), 2);
}

#[tokio::test]
async fn other_codes_are_returned_without_retry() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let env = [("LOG", log.to_str().unwrap())];
    let code = hook::run(
        &hook(sh(r#"echo run >> "$LOG"; exit 3"#), &env, 10),
        &no_peers(),
    )
    .await
    .unwrap();
    assert_eq!(code, 3);
    assert_eq!(runs(&log), 1);

    let code = hook::run(&hook(sh("exit 0"), &[], 10), &no_peers())
        .await
        .unwrap();
    assert_eq!(code, 0);
}

#[tokio::test]
async fn retries_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs");
    let env = [("LOG", log.to_str().unwrap())];
    let err = hook::run(
        &hook(sh(r#"echo run >> "$LOG"; exit 75"#), &env, 2),
        &no_peers(),
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
    let code = hook::run(&hook(sh("kill -KILL $$"), &[], 0), &no_peers())
        .await
        .unwrap();
    assert_eq!(code, 128 + 9);
}

#[tokio::test]
async fn missing_program_is_a_spawn_error() {
    let command = vec![OsString::from("/nonexistent/drainer-test-hook")];
    let err = hook::run(&hook(command, &[], 0), &no_peers())
        .await
        .unwrap_err();
    assert!(matches!(err, HookError::Spawn { .. }), "{err}");
}

fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test]
async fn context_and_peers_are_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let peer = |ordinal: i32, port: u16| {
        Peer::new(
            ordinal,
            format!("ds-{ordinal}"),
            Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap(),
        )
    };
    let mut set = PeerSet::all_ready([peer(2, 9002), peer(0, 9000)]);
    set.members = vec![0, 1, 2];
    let env = [
        ("OUT", out.to_str().unwrap()),
        ("DRAIN_STATEFULSET", "ds"),
        ("DRAIN_ORDINAL", "3"),
        ("DRAIN_DATA_DIR", "/data"),
    ];
    let code = hook::run(&hook(sh(r#"env > "$OUT""#), &env, 0), &StaticPeers(set))
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
    assert_eq!(seen["DRAIN_HOOK_ATTEMPT"], "1");
}

#[tokio::test]
async fn failed_discovery_runs_the_hook_with_empty_peers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env");
    let env = [("OUT", out.to_str().unwrap())];
    let code = hook::run(&hook(sh(r#"env > "$OUT""#), &env, 0), &no_peers())
        .await
        .unwrap();
    assert_eq!(code, 0);
    let seen = read_env(&out);
    assert_eq!(seen.get("DRAIN_PEERS").map(String::as_str), Some(""));
    assert_eq!(
        seen.get("DRAIN_PEER_ORDINALS").map(String::as_str),
        Some("")
    );
}

#[tokio::test]
async fn each_attempt_is_numbered() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("attempts");
    let env = [("LOG", log.to_str().unwrap())];
    let script =
        r#"echo "$DRAIN_HOOK_ATTEMPT" >> "$LOG"; [ "$DRAIN_HOOK_ATTEMPT" = 3 ] || exit 75"#;
    let code = hook::run(&hook(sh(script), &env, 5), &no_peers())
        .await
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "1\n2\n3\n");
}
