//! Built-in redistribution against real datastore servers on 127.0.0.1, with fixed peer sets in
//! place of Kubernetes discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::IntoResponse;
use drain_api::record::{OWNER_HEADER, VERSION_HEADER};
use drainer::peers::{Peer, PeerSet, StaticPeers, Unavailable};
use drainer::placement;
use drainer::redistribute::{Options, RedistributeError, redistribute};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use url::Url;

/// A datastore server on an ephemeral port over its own temporary directory; stops when dropped.
struct Datastore {
    ordinal: i32,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    _stop: oneshot::Sender<()>,
}

impl Datastore {
    async fn start(ordinal: i32) -> Self {
        Self::start_with(ordinal, datastore::http::Limits::default()).await
    }

    async fn start_with(ordinal: i32, limits: datastore::http::Limits) -> Self {
        Self::start_as(ordinal, &format!("datastore-{ordinal}"), None, limits).await
    }

    /// A server that is the pod `name` with `uid` (serving as ordinal `ordinal` in the test).
    async fn start_as(
        ordinal: i32,
        name: &str,
        uid: Option<&str>,
        limits: datastore::http::Limits,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = datastore::Store::open_pod(dir.path(), name, uid).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(datastore::http::serve_with(
            listener,
            store,
            limits,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            ordinal,
            addr,
            dir,
            _stop: stop,
        }
    }

    fn peer(&self) -> Peer {
        peer_at(self.ordinal, self.addr)
    }

    /// Every record the server holds, read through its API.
    async fn records(&self) -> BTreeMap<String, Vec<u8>> {
        let client = datastore::Client::new(&format!("http://{}", self.addr)).unwrap();
        let mut records = BTreeMap::new();
        for key in client.list().await.unwrap() {
            let value = client.get(&key).await.unwrap().unwrap();
            records.insert(key, value);
        }
        records
    }
}

fn peer_at(ordinal: i32, addr: SocketAddr) -> Peer {
    Peer::new(
        ordinal,
        format!("datastore-{ordinal}"),
        Url::parse(&format!("http://{addr}/")).unwrap(),
    )
}

/// Serves `app` on an ephemeral port of 127.0.0.1 until the test ends.
async fn serve(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A peer that answers every request with `status` and counts them.
async fn fixed_status_peer(ordinal: i32, status: StatusCode) -> (Peer, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
            let counter = Arc::clone(&counter);
            // It is the pod meant (it names itself), but answers nothing else of the contract.
            let owner = headers.get(OWNER_HEADER).cloned();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut answer = (status, "no thanks").into_response();
                if let Some(owner) = owner {
                    answer.headers_mut().insert(OWNER_HEADER, owner);
                }
                answer
            }
        },
    );
    let addr = serve(app).await;
    (peer_at(ordinal, addr), hits)
}

/// A peer that acknowledges every `PUT` with `204` and the version sent (storing nothing) and
/// notes when each arrived.
async fn recording_peer(ordinal: i32) -> (Peer, Arc<Mutex<Vec<Instant>>>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&arrivals);
    let app = axum::Router::new().route(
        "/records/{key}",
        // Reads the whole body before answering, as a peer must (answering first and closing
        // the connection would make the drainer see a broken upload and send it again).
        axum::routing::put(
            move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
                log.lock().unwrap().push(Instant::now());
                let version = headers[VERSION_HEADER].clone();
                let owner = headers[OWNER_HEADER].clone();
                async move {
                    (
                        StatusCode::NO_CONTENT,
                        [(VERSION_HEADER, version), (OWNER_HEADER, owner)],
                    )
                }
            },
        ),
    );
    let addr = serve(app).await;
    (peer_at(ordinal, addr), arrivals)
}

/// An address nothing listens on (connections are refused).
async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// Records of assorted sizes and contents, keyed like a real client's.
fn records(n: usize) -> BTreeMap<String, Vec<u8>> {
    (0..n)
        .map(|i| {
            let value = match i % 4 {
                0 => Vec::new(),
                1 => format!("value of record {i}").into_bytes(),
                2 => (0..=255u8).cycle().skip(i).take(3000).collect(),
                _ => vec![i as u8; 70_000],
            };
            (format!("user-{i:04}"), value)
        })
        .collect()
}

fn write_local(dir: &Path, records: &BTreeMap<String, Vec<u8>>) {
    for (key, value) in records {
        std::fs::write(dir.join(key), value).unwrap();
    }
}

fn local_records(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            let name = e.file_name().into_string().unwrap();
            let value = std::fs::read(e.path()).unwrap();
            (name, value)
        })
        .filter(|(name, _)| !name.starts_with('.'))
        .collect()
}

fn options(dir: &Path) -> Options {
    Options {
        put_retries: 2,
        put_retry_delay: Duration::from_millis(5),
        max_rounds: 2,
        round_delay: Duration::from_millis(10),
        idle_timeout: Duration::from_secs(10),
        progress_interval: Duration::from_millis(50),
        // A temporary directory is no mount point; the mount check has its own tests.
        allow_unmounted: true,
        ..Options::new(dir)
    }
}

/// The records each ordinal should hold.
fn expected_by_owner(
    records: &BTreeMap<String, Vec<u8>>,
    ordinals: &[i32],
) -> BTreeMap<i32, BTreeMap<String, Vec<u8>>> {
    let mut by_owner: BTreeMap<i32, BTreeMap<String, Vec<u8>>> =
        ordinals.iter().map(|&o| (o, BTreeMap::new())).collect();
    for (key, value) in records {
        by_owner
            .get_mut(&placement::owner(key, ordinals))
            .unwrap()
            .insert(key.clone(), value.clone());
    }
    by_owner
}

async fn assert_peers_hold_exactly(
    servers: &[&Datastore],
    all: &BTreeMap<String, Vec<u8>>,
    ordinals: &[i32],
) {
    let expected = expected_by_owner(all, ordinals);
    for server in servers {
        let held = server.records().await;
        assert_eq!(
            held.keys().collect::<Vec<_>>(),
            expected[&server.ordinal].keys().collect::<Vec<_>>(),
            "keys on ordinal {}",
            server.ordinal
        );
        assert!(
            held == expected[&server.ordinal],
            "values on ordinal {}",
            server.ordinal
        );
        // Stored as one file per record, nothing left half-written.
        let on_disk: BTreeSet<String> = std::fs::read_dir(server.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name != datastore::store::clock::CLOCK_FILE)
            .collect();
        assert_eq!(on_disk, held.keys().cloned().collect::<BTreeSet<_>>());
    }
}

#[tokio::test]
async fn moves_every_record_to_its_owner_and_empties_the_directory() {
    let servers = [
        Datastore::start(0).await,
        Datastore::start(1).await,
        Datastore::start(3).await,
    ];
    let ordinals = [0, 1, 3];
    let peers = StaticPeers(PeerSet::all_ready(servers.iter().map(Datastore::peer)));
    let data = tempfile::tempdir().unwrap();
    let all = records(300);
    write_local(data.path(), &all);
    // Not records: an unfinished write and the filesystem's lost+found.
    std::fs::write(data.path().join(".tmp-unfinished"), b"partial").unwrap();
    std::fs::create_dir(data.path().join("lost+found")).unwrap();

    let summary = redistribute(&options(data.path()), &peers).await.unwrap();

    assert_eq!(summary.records, 300);
    assert_eq!(
        summary.bytes,
        all.values().map(|v| v.len() as u64).sum::<u64>()
    );
    assert_eq!(summary.rounds, 1);
    assert_eq!(summary.newer_there, 0);
    assert_eq!(
        summary.skipped,
        [".tmp-unfinished", "lost+found"],
        "skips are reported"
    );
    assert!(local_records(data.path()).is_empty());
    assert!(data.path().join(".tmp-unfinished").exists());
    assert!(data.path().join("lost+found").is_dir());
    let refs: Vec<&Datastore> = servers.iter().collect();
    assert_peers_hold_exactly(&refs, &all, &ordinals).await;
    // Each server got a fair part, not everything.
    for server in &servers {
        assert!(
            server.records().await.len() > 50,
            "ordinal {}",
            server.ordinal
        );
    }
}

#[tokio::test]
async fn entries_that_are_not_records_fail_the_drain_by_name_after_the_records_moved() {
    let servers = [Datastore::start(0).await, Datastore::start(1).await];
    let peers = StaticPeers(PeerSet::all_ready(servers.iter().map(Datastore::peer)));
    let data = tempfile::tempdir().unwrap();
    let all = records(40);
    write_local(data.path(), &all);
    // What an operator or a tool may leave on a volume, next to the datastore's own files.
    std::fs::write(
        data.path().join(".operator-notes"),
        b"restore from s3://b/x",
    )
    .unwrap();
    std::fs::create_dir(data.path().join("lost+found")).unwrap();
    std::fs::write(data.path().join("lost+found/#4711"), b"recovered").unwrap();
    std::fs::write(data.path().join(".tmp-unfinished"), b"partial").unwrap();

    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();

    let message = drainer::error_chain(&err);
    eprintln!("{message}");
    assert!(
        matches!(&err, RedistributeError::NotRecords { entries, .. } if entries.len() == 2),
        "{message}"
    );
    assert!(
        message.contains(r#"".operator-notes" (a dot file"#),
        "{message}"
    );
    assert!(
        message.contains(r#""lost+found" (a lost+found holding files fsck recovered)"#),
        "{message}"
    );
    assert!(
        !message.contains(".tmp-unfinished"),
        "the datastore's own file is no problem"
    );
    // The records moved; the entries stay where they were.
    assert!(local_records(data.path()).is_empty());
    let refs: Vec<&Datastore> = servers.iter().collect();
    assert_peers_hold_exactly(&refs, &all, &[0, 1]).await;
    assert!(data.path().join(".operator-notes").exists());
    assert!(data.path().join("lost+found/#4711").exists());

    // A rerun fails the same way at once, and named with --leave-behind they may go.
    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();
    assert!(matches!(err, RedistributeError::NotRecords { .. }));
    let leave = Options {
        leave_behind: vec![".operator-*".into(), "lost+found".into()],
        ..options(data.path())
    };
    let summary = redistribute(&leave, &peers).await.unwrap();
    assert_eq!(
        summary.skipped,
        [".operator-notes", ".tmp-unfinished", "lost+found"]
    );
}

#[tokio::test]
async fn an_endless_error_answer_is_read_only_up_to_its_bound() {
    // A peer that refuses with a body that never ends: the drainer reads at most
    // MAX_ERROR_BODY bytes of it and fails at once, keeping the file.
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&sent);
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let counter = Arc::clone(&counter);
        let owner = headers.get(OWNER_HEADER).cloned();
        async move {
            let chunk = axum::body::Bytes::from(vec![b'x'; 8192]);
            let endless = futures::stream::repeat_with(move || {
                counter.fetch_add(chunk.len(), Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(chunk.clone())
            });
            let mut answer = (
                StatusCode::BAD_REQUEST,
                axum::body::Body::from_stream(endless),
            )
                .into_response();
            if let Some(owner) = owner {
                answer.headers_mut().insert(OWNER_HEADER, owner);
            }
            answer
        }
    });
    let addr = serve(app).await;
    let peers = StaticPeers(PeerSet::all_ready([peer_at(0, addr)]));
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("k"), b"v").unwrap();

    let err = tokio::time::timeout(
        Duration::from_secs(10),
        redistribute(&options(data.path()), &peers),
    )
    .await
    .expect("the drainer kept reading an endless error answer")
    .unwrap_err();

    let RedistributeError::PeerRefused {
        source: drainer::redistribute::PutError::Status { status, body },
        ..
    } = &err
    else {
        panic!("{}", drainer::error_chain(&err));
    };
    assert_eq!(*status, StatusCode::BAD_REQUEST);
    assert!(body.len() <= 200 && body.starts_with("xxx"), "{body:?}");
    assert!(data.path().join("k").exists());
    eprintln!(
        "the peer produced {} bytes before the drainer hung up",
        sent.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn empty_directory_succeeds_without_discovery() {
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir(data.path().join("lost+found")).unwrap();
    let no_peers = Unavailable {
        reason: "not needed".to_owned(),
    };
    let summary = redistribute(&options(data.path()), &no_peers)
        .await
        .unwrap();
    assert_eq!(summary.records, 0);
    assert_eq!(summary.rounds, 0);
}

#[tokio::test]
async fn bad_data_directories_fail_clearly() {
    let parent = tempfile::tempdir().unwrap();
    let peers = StaticPeers(PeerSet::default());
    let err = redistribute(&options(&parent.path().join("nope")), &peers)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedistributeError::DataDirMissing { .. }),
        "{err}"
    );
    let file = parent.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let err = redistribute(&options(&file), &peers).await.unwrap_err();
    assert!(
        matches!(err, RedistributeError::DataDirNotADirectory { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn refusing_peer_fails_and_every_file_stays() {
    let (peer, hits) = fixed_status_peer(0, StatusCode::BAD_REQUEST).await;
    let peers = StaticPeers(PeerSet::all_ready([peer]));
    let data = tempfile::tempdir().unwrap();
    let all = records(40);
    write_local(data.path(), &all);

    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();

    let RedistributeError::PeerRefused {
        ref source,
        ref peer,
        ..
    } = err
    else {
        panic!("want PeerRefused, got {err}");
    };
    assert_eq!(peer, "datastore-0");
    assert!(
        drainer::error_chain(&err).contains("400"),
        "{}",
        drainer::error_chain(&err)
    );
    assert!(!source.is_transient());
    assert!(local_records(data.path()) == all, "local files changed");
    // A refusal is not retried.
    assert!(hits.load(Ordering::SeqCst) <= options(data.path()).concurrency);
}

#[tokio::test]
async fn refusal_keeps_every_unacknowledged_file() {
    // One good peer and one refusing one: whatever the good peer acknowledged may be gone
    // locally, everything else is still there, and nothing is lost.
    let good = Datastore::start(0).await;
    let (refusing, _) = fixed_status_peer(1, StatusCode::FORBIDDEN).await;
    let peers = StaticPeers(PeerSet::all_ready([good.peer(), refusing]));
    let data = tempfile::tempdir().unwrap();
    let all = records(60);
    write_local(data.path(), &all);

    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedistributeError::PeerRefused { .. }),
        "{err}"
    );

    let local = local_records(data.path());
    let remote = good.records().await;
    for (key, value) in &all {
        let owner = placement::owner(key, &[0, 1]);
        if owner == 1 {
            assert_eq!(
                local.get(key),
                Some(value),
                "refused record {key} must stay"
            );
        }
        match (local.get(key), remote.get(key)) {
            (Some(v), _) | (None, Some(v)) => assert_eq!(v, value, "record {key}"),
            (None, None) => panic!("record {key} lost"),
        }
    }
}

#[tokio::test]
async fn no_ready_peers_fails_and_every_file_stays() {
    let data = tempfile::tempdir().unwrap();
    let all = records(10);
    write_local(data.path(), &all);

    let not_ready = StaticPeers(PeerSet {
        members: vec![0, 1],
        ..PeerSet::default()
    });
    let err = redistribute(&options(data.path()), &not_ready)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedistributeError::NoReadyPeers { ref members } if members == &[0, 1]),
        "{err}"
    );

    let none = StaticPeers(PeerSet::default());
    let err = redistribute(&options(data.path()), &none)
        .await
        .unwrap_err();
    assert!(matches!(err, RedistributeError::NoPeers), "{err}");
    assert!(local_records(data.path()) == all);
}

#[tokio::test]
async fn records_of_a_member_that_is_not_ready_wait_for_it() {
    // Placement is over all members, so records owned by a member that is not Ready are not
    // sent elsewhere (clients would not find them there): they stay, and the drain fails.
    let server = Datastore::start(0).await;
    let mut set = PeerSet::all_ready([server.peer()]);
    set.members = vec![0, 1];
    let data = tempfile::tempdir().unwrap();
    let all = records(50);
    write_local(data.path(), &all);

    let err = redistribute(&options(data.path()), &StaticPeers(set))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedistributeError::OwnerNotReady { ordinal: 1 }),
        "{err}"
    );

    let expected = expected_by_owner(&all, &[0, 1]);
    assert!(server.records().await == expected[&0]);
    assert!(local_records(data.path()) == expected[&1]);
}

#[tokio::test]
async fn retries_transient_failures() {
    // A peer that answers 503 to the first requests, then stores records.
    let server = Datastore::start(0).await;
    let failures = Arc::new(AtomicUsize::new(3));
    let backend = format!("http://{}", server.addr);
    let app = axum::Router::new().route(
        "/records/{key}",
        axum::routing::put({
            let failures = Arc::clone(&failures);
            move |axum::extract::Path(key): axum::extract::Path<String>,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let failures = Arc::clone(&failures);
                let backend = backend.clone();
                async move {
                    if failures
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            axum::http::HeaderMap::new(),
                        );
                    }
                    // Passes the handover through to the real server, answer and all.
                    let answer = reqwest::Client::new()
                        .put(format!("{backend}/records/{key}"))
                        .header(VERSION_HEADER, headers[VERSION_HEADER].as_bytes())
                        .header(OWNER_HEADER, headers[OWNER_HEADER].as_bytes())
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    let mut out = axum::http::HeaderMap::new();
                    for name in [VERSION_HEADER, OWNER_HEADER] {
                        out.insert(name, answer.headers()[name].clone());
                    }
                    (answer.status(), out)
                }
            }
        }),
    );
    let addr = serve(app).await;

    let data = tempfile::tempdir().unwrap();
    let all = records(5);
    write_local(data.path(), &all);
    let peers = StaticPeers(PeerSet::all_ready([peer_at(0, addr)]));
    let opts = Options {
        concurrency: 1,
        ..options(data.path())
    };
    let summary = redistribute(&opts, &peers).await.unwrap();
    assert_eq!(summary.records, 5);
    assert!(server.records().await == all);
    assert!(local_records(data.path()).is_empty());
}

#[tokio::test]
async fn rerun_after_partial_progress_gives_the_same_result() {
    let servers = [Datastore::start(0).await, Datastore::start(1).await];
    let ordinals = [0, 1];
    let data = tempfile::tempdir().unwrap();
    let all = records(120);
    write_local(data.path(), &all);

    // A previous run that died midway: some records were acknowledged and deleted locally,
    // some acknowledged but not yet deleted.
    for (i, (key, value)) in all.iter().enumerate().take(60) {
        let owner = placement::owner(key, &ordinals);
        let server = servers.iter().find(|s| s.ordinal == owner).unwrap();
        datastore::Client::new(&format!("http://{}", server.addr))
            .unwrap()
            .put(key, value.clone())
            .await
            .unwrap();
        if i % 2 == 0 {
            std::fs::remove_file(data.path().join(key)).unwrap();
        }
    }

    let peers = StaticPeers(PeerSet::all_ready(servers.iter().map(Datastore::peer)));
    let summary = redistribute(&options(data.path()), &peers).await.unwrap();
    assert_eq!(summary.records, 90);
    assert!(local_records(data.path()).is_empty());
    let refs: Vec<&Datastore> = servers.iter().collect();
    assert_peers_hold_exactly(&refs, &all, &ordinals).await;
}

#[tokio::test]
async fn rerun_after_a_peer_was_down_finishes_the_drain() {
    // First run: ordinal 1 does not answer. Its records stay; ordinal 0's are moved.
    let server0 = Datastore::start(0).await;
    let dead = dead_addr().await;
    let data = tempfile::tempdir().unwrap();
    let all = records(80);
    write_local(data.path(), &all);
    let ordinals = [0, 1];
    let expected = expected_by_owner(&all, &ordinals);

    let down = StaticPeers(PeerSet::all_ready([server0.peer(), peer_at(1, dead)]));
    let err = redistribute(&options(data.path()), &down)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RedistributeError::PeerUnavailable { ref peer, .. } if peer == "datastore-1"),
        "{err}"
    );
    assert!(local_records(data.path()) == expected[&1]);
    assert!(server0.records().await == expected[&0]);

    // Second run (the controller's retry), ordinal 1 back: the rest moves, nothing twice.
    let server1 = Datastore::start(1).await;
    let up = StaticPeers(PeerSet::all_ready([server0.peer(), server1.peer()]));
    let summary = redistribute(&options(data.path()), &up).await.unwrap();
    assert_eq!(summary.records, expected[&1].len() as u64);
    assert!(local_records(data.path()).is_empty());
    assert_peers_hold_exactly(&[&server0, &server1], &all, &ordinals).await;
}

#[tokio::test]
async fn a_later_round_uses_fresh_peers() {
    // Discovery that reports a dead address for ordinal 1 at the round's start and again when
    // asked mid-round (the API has not caught up yet), then the real one.
    struct Flapping {
        calls: AtomicUsize,
        first: PeerSet,
        then: PeerSet,
    }
    impl drainer::peers::PeerSource for Flapping {
        async fn discover(&self) -> Result<PeerSet, drainer::peers::PeersError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(if call < 2 { &self.first } else { &self.then }.clone())
        }
    }

    let servers = [Datastore::start(0).await, Datastore::start(1).await];
    let dead = dead_addr().await;
    let source = Flapping {
        calls: AtomicUsize::new(0),
        first: PeerSet::all_ready([servers[0].peer(), peer_at(1, dead)]),
        then: PeerSet::all_ready(servers.iter().map(Datastore::peer)),
    };
    let data = tempfile::tempdir().unwrap();
    let all = records(40);
    write_local(data.path(), &all);

    let summary = redistribute(&options(data.path()), &source).await.unwrap();
    assert_eq!(summary.records, 40);
    assert_eq!(summary.rounds, 2);
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        3,
        "each round's start, and once mid-round"
    );
    assert!(local_records(data.path()).is_empty());
    assert_peers_hold_exactly(&[&servers[0], &servers[1]], &all, &[0, 1]).await;
}

#[tokio::test]
async fn max_rate_caps_records_per_second_across_concurrent_puts() {
    // 20 records, all allowed in flight at once: without a limit they go out together; at
    // 40 a second, the 20th may start no sooner than 19/40 = 0.475s after the first.
    async fn drain(max_rate: u32) -> (Duration, Vec<Instant>) {
        let (peer, arrivals) = recording_peer(0).await;
        let peers = StaticPeers(PeerSet::all_ready([peer]));
        let data = tempfile::tempdir().unwrap();
        write_local(data.path(), &records(20));
        let opts = Options {
            concurrency: 20,
            max_rate,
            ..options(data.path())
        };
        let started = Instant::now();
        let summary = redistribute(&opts, &peers).await.unwrap();
        let elapsed = started.elapsed();
        assert_eq!(summary.records, 20);
        assert!(local_records(data.path()).is_empty());
        let arrivals = arrivals.lock().unwrap().clone();
        assert_eq!(arrivals.len(), 20, "one PUT per record");
        (elapsed, arrivals)
    }
    let span = |arrivals: &[Instant]| {
        let first = arrivals.iter().min().unwrap();
        let last = arrivals.iter().max().unwrap();
        *last - *first
    };

    let (unlimited, unlimited_arrivals) = drain(0).await;
    let (limited, limited_arrivals) = drain(40).await;
    eprintln!(
        "unlimited: {unlimited:?} (PUTs over {:?}); --max-rate 40: {limited:?} (PUTs over {:?})",
        span(&unlimited_arrivals),
        span(&limited_arrivals)
    );

    // Timers never fire early, so a working limit cannot finish sooner than 0.475s.
    assert!(
        limited >= Duration::from_millis(450),
        "20 records at 40/s took only {limited:?}"
    );
    // The peer saw them spread out too (slack for a slow first connection).
    assert!(
        span(&limited_arrivals) >= Duration::from_millis(350),
        "PUTs arrived within {:?}",
        span(&limited_arrivals)
    );
    // It is the limit that takes the time: without it the same drain is quicker...
    assert!(
        unlimited < Duration::from_millis(450) && unlimited < limited,
        "unlimited drain took {unlimited:?}, limited {limited:?}"
    );
    // ...and the limit only spaces records out, it does not stall them.
    assert!(
        limited < Duration::from_secs(5),
        "limited drain took {limited:?}"
    );
}

#[tokio::test]
async fn a_large_record_under_a_byte_cap_shows_bytes_on_the_wire_before_it_is_handed_over() {
    // 384 KiB at 128 KiB/s: six 64 KiB chunks, the first at once, the last 2.5 s later. The
    // idle timeout (200 ms) is shorter than the wait for one chunk's turn: waiting for the cap
    // is not idleness.
    let owner = Datastore::start(0).await;
    let data = tempfile::tempdir().unwrap();
    let value: Vec<u8> = (0..384 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(data.path().join("big"), &value).unwrap();
    let wire = drainer::redistribute::transfer::Wire::new(128 * 1024);
    let http = drainer::redistribute::transfer::client(Duration::from_millis(200)).unwrap();
    let peer = owner.peer();
    let url = drainer::redistribute::record_url(&peer.url, "big");
    let path = data.path().join("big");
    let started = Instant::now();
    let put = drainer::redistribute::transfer::put_record(
        &http,
        url,
        &path,
        Duration::from_millis(200),
        Some(drainer::redistribute::transfer::Owner::of(&peer)),
        &wire,
    );
    tokio::pin!(put);
    // Mid-transfer, the bytes sent grow though no record is done.
    let mut seen = Vec::new();
    let handed = loop {
        tokio::select! {
            done = &mut put => break done.unwrap().unwrap(),
            () = tokio::time::sleep(Duration::from_millis(400)) => seen.push(wire.sent()),
        }
    };
    let elapsed = started.elapsed();
    eprintln!("bytes sent, every 400 ms: {seen:?}; handed over after {elapsed:?}");
    assert_eq!(handed.delivered, drainer::redistribute::Delivered::Stored);
    assert_eq!(wire.sent(), value.len() as u64);
    assert!(
        elapsed >= Duration::from_millis(2_400),
        "the cap was not applied: {elapsed:?}"
    );
    let partial: Vec<&u64> = seen
        .iter()
        .filter(|&&b| b > 0 && b < value.len() as u64)
        .collect();
    assert!(
        partial.len() >= 3,
        "bytes on the wire grew mid-record: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(owner.records().await["big"], value);
}

#[tokio::test]
async fn a_newer_write_on_the_owner_is_never_overwritten() {
    // After the scale-down clients write some keys to their new owner at once; the drain must
    // not put the old values over them. The same happens after a restart between an
    // acknowledged PUT and the local delete.
    let server = Datastore::start(0).await;
    let client = datastore::Client::new(&format!("http://{}", server.addr)).unwrap();
    let peers = StaticPeers(PeerSet::all_ready([server.peer()]));
    let data = tempfile::tempdir().unwrap();
    let mut all = records(20);
    write_local(data.path(), &all);
    for key in ["user-0003", "user-0010"] {
        client
            .put(key, format!("newer value of {key}"))
            .await
            .unwrap();
        all.insert(key.to_owned(), format!("newer value of {key}").into_bytes());
    }

    let summary = redistribute(&options(data.path()), &peers).await.unwrap();

    assert_eq!(summary.records, 20);
    assert_eq!(summary.newer_there, 2);
    assert!(local_records(data.path()).is_empty());
    assert_eq!(server.records().await, all, "the newer values are kept");
}

#[tokio::test]
async fn an_older_copy_on_the_owner_is_replaced_and_a_delete_is_carried_over() {
    // The owner holds old copies (written before the drained pod took newer writes of the same
    // keys: an earlier scale-down whose drain was cancelled, then a rebalance): the drain's
    // newer values and its tombstones replace them. The 412 rule kept the old copies and
    // deleted the newer ones.
    let server = Datastore::start(0).await;
    let owner = datastore::Client::new(&format!("http://{}", server.addr)).unwrap();
    let peers = StaticPeers(PeerSet::all_ready([server.peer()]));
    let data = tempfile::tempdir().unwrap();
    let drained = datastore::Store::open_as(data.path(), "datastore-1").unwrap();
    let key = |k: &str| datastore::Key::parse(k).unwrap();
    let mut want = BTreeMap::new();
    for k in ["a", "b", "c", "gone"] {
        owner.put(k, format!("old {k}")).await.unwrap();
    }
    // Later writes on the drained pod (its clock's readings come after the owner's).
    tokio::time::sleep(Duration::from_millis(5)).await;
    for k in ["a", "b"] {
        drained
            .put(key(k), format!("new {k}").into_bytes())
            .await
            .unwrap();
        want.insert(k.to_owned(), format!("new {k}").into_bytes());
    }
    drained.delete(key("gone")).await.unwrap();
    want.insert("c".to_owned(), b"old c".to_vec());
    drop(drained);

    let summary = redistribute(&options(data.path()), &peers).await.unwrap();

    assert_eq!(summary.records, 3, "two values and one tombstone");
    assert_eq!(summary.newer_there, 0);
    assert!(local_records(data.path()).is_empty());
    assert_eq!(server.records().await, want);
    assert_eq!(
        owner.get("gone").await.unwrap(),
        None,
        "the delete is carried over"
    );
}

/// A source that answers `sets` in turn, then the last one again; counts its calls.
struct Sequence {
    sets: Vec<PeerSet>,
    calls: AtomicUsize,
}

impl drainer::peers::PeerSource for Sequence {
    async fn discover(&self) -> Result<PeerSet, drainer::peers::PeersError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.sets[call.min(self.sets.len() - 1)].clone())
    }
}

#[rstest::rstest]
#[case::nothing_listens_there(false)]
#[case::another_pod_answers_there(true)]
#[tokio::test]
async fn an_owner_whose_address_changes_mid_round_gets_its_records_in_that_round(
    #[case] reused: bool,
) {
    // The round starts with datastore-0 at an old address; its pod was replaced meanwhile and
    // the API has the new one. With one round only, the records arrive only if the address is
    // refreshed within the round.
    let owner = Datastore::start_as(0, "datastore-0", Some("uid-new"), Default::default()).await;
    let _other;
    let old_addr = if reused {
        let other = Datastore::start_as(0, "datastore-9", Some("uid-9"), Default::default()).await;
        let addr = other.addr;
        _other = Some(other);
        addr
    } else {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        _other = None;
        addr
    };
    let old = peer_at(0, old_addr).with_uid(Some("uid-old".to_owned()));
    let new = owner.peer().with_uid(Some("uid-new".to_owned()));
    let source = Sequence {
        sets: vec![PeerSet::all_ready([old]), PeerSet::all_ready([new])],
        calls: AtomicUsize::new(0),
    };
    let data = tempfile::tempdir().unwrap();
    let all = records(12);
    write_local(data.path(), &all);
    let once = Options {
        max_rounds: 1,
        put_retries: 1,
        ..options(data.path())
    };

    let summary = redistribute(&once, &source).await.unwrap();

    assert_eq!(summary.records, 12);
    assert_eq!(summary.rounds, 1);
    assert!(local_records(data.path()).is_empty());
    assert_eq!(owner.records().await, all);
    assert!(
        source.calls.load(Ordering::SeqCst) <= 3,
        "addresses are looked up again once for the round, not per record: {} discoveries",
        source.calls.load(Ordering::SeqCst)
    );
}

#[rstest::rstest]
#[case::another_pod("datastore-7", "uid-0")]
#[case::the_same_name_recreated("datastore-0", "uid-of-the-new-pod")]
#[tokio::test]
async fn an_address_that_answers_as_another_pod_gets_nothing_and_every_file_stays(
    #[case] answering: &str,
    #[case] uid: &str,
) {
    // The API said datastore-0 (UID uid-0) is at this address, but the address now belongs to
    // another pod: a reused IP. Nothing may be handed to it, and the drain must not finish.
    let server = Datastore::start_as(0, answering, Some(uid), Default::default()).await;
    let peer = server.peer().with_uid(Some("uid-0".to_owned()));
    let peers = StaticPeers(PeerSet::all_ready([peer]));
    let data = tempfile::tempdir().unwrap();
    let all = records(6);
    write_local(data.path(), &all);

    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();

    assert!(
        matches!(err, RedistributeError::PeerUnavailable { .. }),
        "{}",
        drainer::error_chain(&err)
    );
    assert!(
        drainer::error_chain(&err).contains("answered as another pod"),
        "{}",
        drainer::error_chain(&err)
    );
    assert!(local_records(data.path()) == all, "every file stays");
    assert!(
        server.records().await.is_empty(),
        "the other pod got nothing"
    );
}

#[rstest::rstest]
#[case::accepted(StatusCode::ACCEPTED)]
#[case::non_authoritative(StatusCode::NON_AUTHORITATIVE_INFORMATION)]
#[case::reset_content(StatusCode::RESET_CONTENT)]
#[case::redirect(StatusCode::TEMPORARY_REDIRECT)]
#[case::old_create_only_contract(StatusCode::PRECONDITION_FAILED)]
#[case::no_version_held(StatusCode::NO_CONTENT)]
#[case::no_version_held_200(StatusCode::OK)]
#[tokio::test]
async fn only_a_2xx_naming_a_version_at_least_the_one_sent_counts_as_handed_over(
    #[case] status: StatusCode,
) {
    let (peer, _) = fixed_status_peer(0, status).await;
    let peers = StaticPeers(PeerSet::all_ready([peer]));
    let data = tempfile::tempdir().unwrap();
    let all = records(8);
    write_local(data.path(), &all);

    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();

    assert!(
        matches!(err, RedistributeError::PeerRefused { .. }),
        "{status}: {err}"
    );
    assert!(
        local_records(data.path()) == all,
        "{status}: local files changed"
    );
}

#[tokio::test]
async fn a_record_too_large_for_the_peer_is_a_clear_final_error() {
    let limits = datastore::http::Limits {
        max_record_bytes: 1000,
        ..datastore::http::Limits::default()
    };
    let server = Datastore::start_with(0, limits).await;
    let peers = StaticPeers(PeerSet::all_ready([server.peer()]));
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("small"), vec![1u8; 10]).unwrap();
    std::fs::write(data.path().join("big"), vec![2u8; 5000]).unwrap();

    let started = Instant::now();
    let err = redistribute(&options(data.path()), &peers)
        .await
        .unwrap_err();

    let RedistributeError::RecordTooLarge { ref key, bytes, .. } = err else {
        panic!("want RecordTooLarge, got {err}");
    };
    assert_eq!((key.as_str(), bytes), ("big", 5000));
    assert!(
        drainer::error_chain(&err).contains("too large"),
        "{}",
        drainer::error_chain(&err)
    );
    assert!(data.path().join("big").exists(), "the record stays");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not retried round after round"
    );
}

#[tokio::test]
async fn a_peer_that_stops_reading_fails_on_the_idle_timeout_and_files_stay() {
    // Accepts connections, never reads or answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            keep.lock().unwrap().push(stream);
        }
    });
    let peers = StaticPeers(PeerSet::all_ready([peer_at(0, addr)]));
    let data = tempfile::tempdir().unwrap();
    // Bigger than the socket buffers, so the upload itself stalls.
    std::fs::write(data.path().join("big"), vec![7u8; 32 << 20]).unwrap();
    std::fs::write(data.path().join("small"), b"x").unwrap();
    let options = Options {
        idle_timeout: Duration::from_millis(300),
        put_retries: 1,
        max_rounds: 1,
        ..options(data.path())
    };

    let err = redistribute(&options, &peers).await.unwrap_err();

    assert!(
        drainer::error_chain(&err).contains("idle timeout"),
        "{}",
        drainer::error_chain(&err)
    );
    assert_eq!(local_records(data.path()).len(), 2);
}

#[tokio::test]
async fn the_data_directory_must_be_a_mount_point() {
    let peers = StaticPeers(PeerSet::default());
    let data = tempfile::tempdir().unwrap();
    let strict = Options {
        allow_unmounted: false,
        ..options(data.path())
    };
    // Empty: today this would "succeed" and the controller would delete the claim.
    let err = redistribute(&strict, &peers).await.unwrap_err();
    assert!(
        matches!(err, RedistributeError::DataDirNotMounted { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("--allow-unmounted-data-dir"),
        "{err}"
    );
    write_local(data.path(), &records(3));
    let err = redistribute(&strict, &peers).await.unwrap_err();
    assert!(matches!(err, RedistributeError::DataDirNotMounted { .. }));
    assert_eq!(local_records(data.path()).len(), 3);
}

// ---- rebalance ---------------------------------------------------------------------------

#[tokio::test]
async fn rebalance_moves_what_a_pod_does_not_own_to_its_owner_and_keeps_newer_values() {
    let servers = [
        Datastore::start(0).await,
        Datastore::start(1).await,
        Datastore::start(2).await,
    ];
    // Pod 0 holds everything, as after a scale to 1 and back to 3.
    let mut all = records(90);
    let zero = datastore::Client::new(&format!("http://{}", servers[0].addr)).unwrap();
    for (k, v) in &all {
        zero.put(k, v.clone()).await.unwrap();
    }
    // A client already wrote a newer value of one of pod 2's keys to pod 2.
    let of_2 = all
        .keys()
        .find(|k| placement::owner(k, &[0, 1, 2]) == 2)
        .unwrap()
        .clone();
    let two = datastore::Client::new(&format!("http://{}", servers[2].addr)).unwrap();
    two.put(&of_2, b"newer".to_vec()).await.unwrap();
    all.insert(of_2, b"newer".to_vec());

    let set = PeerSet {
        drained_in_range: true,
        ..PeerSet::all_ready([servers[1].peer(), servers[2].peer()])
    };
    let options = drainer::rebalance::Options {
        data_dir: servers[0].dir.path().to_path_buf(),
        local: Url::parse(&format!("http://{}", servers[0].addr)).unwrap(),
        concurrency: 4,
        max_rate: 0,
        max_bytes_per_second: 0,
        idle_timeout: Duration::from_secs(10),
    };
    let pass = drainer::rebalance::rebalance_once(&options, 0, &StaticPeers(set.clone()))
        .await
        .unwrap();

    assert!(pass.member);
    assert_eq!(pass.newer_there, 1);
    assert_eq!(pass.deferred, 0);
    let refs: Vec<&Datastore> = servers.iter().collect();
    assert_peers_hold_exactly(&refs, &all, &[0, 1, 2]).await;
    // A second pass has nothing to do.
    let again = drainer::rebalance::rebalance_once(&options, 0, &StaticPeers(set))
        .await
        .unwrap();
    assert_eq!(again.moved, 0);
}

#[tokio::test]
async fn after_a_cancelled_drain_the_interim_writes_and_deletes_replace_the_returning_owners_copies()
 {
    // The issue's scenario, in one process: pod 2 holds v1 of its keys (its drain never ran);
    // while it was gone clients wrote v2 of some keys and deleted others on their interim owner,
    // pod 0; pod 2 is back. Pod 0's rebalance must leave v2 on pod 2 and the deleted keys
    // deleted. The create-only rule got 412 and deleted v2.
    let servers = [Datastore::start(0).await, Datastore::start(2).await];
    let zero = datastore::Client::new(&format!("http://{}", servers[0].addr)).unwrap();
    let two = datastore::Client::new(&format!("http://{}", servers[1].addr)).unwrap();
    let keys: Vec<String> = records(60)
        .into_keys()
        .filter(|k| placement::owner(k, &[0, 2]) == 2)
        .collect();
    assert!(keys.len() > 10);
    for k in &keys {
        two.put(k, format!("v1 {k}")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut want = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        match i % 3 {
            0 => zero.delete(k).await.unwrap(),
            1 => {
                zero.put(k, format!("v2 {k}")).await.unwrap();
                want.insert(k.clone(), format!("v2 {k}").into_bytes());
            }
            _ => {
                want.insert(k.clone(), format!("v1 {k}").into_bytes());
            }
        }
    }
    let set = PeerSet {
        drained_in_range: true,
        ..PeerSet::all_ready([servers[1].peer()])
    };
    let options = drainer::rebalance::Options {
        data_dir: servers[0].dir.path().to_path_buf(),
        local: Url::parse(&format!("http://{}", servers[0].addr)).unwrap(),
        concurrency: 4,
        max_rate: 0,
        max_bytes_per_second: 0,
        idle_timeout: Duration::from_secs(10),
    };
    for _ in 0..2 {
        drainer::rebalance::rebalance_once(&options, 0, &StaticPeers(set.clone()))
            .await
            .unwrap();
    }
    assert_eq!(
        servers[1].records().await,
        want,
        "pod 2 holds the newest of each key"
    );
    assert!(servers[0].records().await.is_empty());
    let on_zero: Vec<_> = std::fs::read_dir(servers[0].dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != datastore::store::clock::CLOCK_FILE)
        .collect();
    assert!(on_zero.is_empty(), "tombstones moved too: {on_zero:?}");
}

#[tokio::test]
async fn rebalance_moves_nothing_from_a_pod_being_scaled_down_or_to_an_owner_not_ready() {
    let server = Datastore::start(0).await;
    let zero = datastore::Client::new(&format!("http://{}", server.addr)).unwrap();
    let all = records(30);
    for (k, v) in &all {
        zero.put(k, v.clone()).await.unwrap();
    }
    let options = drainer::rebalance::Options {
        data_dir: server.dir.path().to_path_buf(),
        local: Url::parse(&format!("http://{}", server.addr)).unwrap(),
        concurrency: 4,
        max_rate: 0,
        max_bytes_per_second: 0,
        idle_timeout: Duration::from_secs(10),
    };
    // Not a member any more: its drain moves the data, not the rebalance.
    let leaving = PeerSet {
        members: vec![1, 2],
        drained_in_range: false,
        ..PeerSet::default()
    };
    let pass = drainer::rebalance::rebalance_once(&options, 0, &StaticPeers(leaving))
        .await
        .unwrap();
    assert!(!pass.member);
    assert_eq!(server.records().await, all);
    // A member whose peers are not Ready: records wait, none is claimed or lost.
    let waiting = PeerSet {
        members: vec![1, 2],
        drained_in_range: true,
        ..PeerSet::default()
    };
    let pass = drainer::rebalance::rebalance_once(&options, 0, &StaticPeers(waiting))
        .await
        .unwrap();
    assert!(pass.deferred > 0 && pass.moved == 0, "{pass:?}");
    assert_eq!(server.records().await, all);
}

#[tokio::test]
async fn a_drain_puts_back_records_an_interrupted_rebalance_claimed() {
    let server = Datastore::start(0).await;
    let peers = StaticPeers(PeerSet::all_ready([server.peer()]));
    let data = tempfile::tempdir().unwrap();
    let all = records(5);
    write_local(data.path(), &all);
    // One record was claimed by a rebalance that died mid-transfer.
    let key = all.keys().next().unwrap();
    std::fs::rename(
        data.path().join(key),
        data.path()
            .join(format!("{}{key}", drainer::rebalance::CLAIM_PREFIX)),
    )
    .unwrap();

    let summary = redistribute(&options(data.path()), &peers).await.unwrap();

    assert_eq!(summary.records, 5, "the claimed record is a record");
    assert_eq!(server.records().await, all);
}
