//! Big records stream: moving records far larger than the memory the drainer may use, against
//! a real datastore server. In its own test binary so no other test's memory is counted.

use std::io::Write;
use std::net::SocketAddr;

use drainer::peers::{Peer, PeerSet, StaticPeers};
use drainer::redistribute::{Options, redistribute};
use tokio::net::TcpListener;
use url::Url;

const RECORD: u64 = 200 << 20;

/// Peak resident memory of this process so far, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn write_big(path: &std::path::Path, seed: u8) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i as u8).wrapping_mul(seed)).collect();
    for _ in 0..RECORD >> 20 {
        file.write_all(&chunk).unwrap();
    }
    file.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_bigger_than_the_memory_budget_stream_through() {
    let store_dir = tempfile::tempdir().unwrap();
    let store = datastore::Store::open_as(store_dir.path(), "datastore-0").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(datastore::http::serve(
        listener,
        store,
        std::future::pending(),
    ));
    let peer = Peer::new(
        0,
        "datastore-0",
        Url::parse(&format!("http://{addr}/")).unwrap(),
    );
    let peers = StaticPeers(PeerSet::all_ready([peer]));

    let data = tempfile::tempdir().unwrap();
    write_big(&data.path().join("big-a"), 3);
    write_big(&data.path().join("big-b"), 7);
    let before = peak_rss();

    let options = Options {
        allow_unmounted: true,
        ..Options::new(data.path())
    };
    let summary = redistribute(&options, &peers).await.unwrap();

    let grew = peak_rss().saturating_sub(before);
    assert_eq!(summary.records, 2);
    assert_eq!(summary.bytes, 2 * RECORD);
    for (key, seed) in [("big-a", 3u8), ("big-b", 7u8)] {
        let file = std::fs::read(store_dir.path().join(key)).unwrap();
        // The owner stores a versioned record: its header, then the value.
        let stored = &file[drain_api::record::HEADER_LEN..];
        assert_eq!(stored.len() as u64, RECORD, "{key}");
        assert!(
            stored
                .iter()
                .enumerate()
                .step_by(4099)
                .all(|(i, b)| *b == ((i % (1 << 20)) as u8).wrapping_mul(seed)),
            "{key}: bytes differ"
        );
    }
    println!(
        "peak RSS grew by {} KiB moving 2 records of {} MiB",
        grew / 1024,
        RECORD >> 20
    );
    assert!(
        grew < 64 << 20,
        "memory grew by {} MiB: records are not streamed",
        grew >> 20
    );
}
