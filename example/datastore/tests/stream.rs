//! A 200 MiB record streamed in and out without the server holding it in memory. Its own test
//! binary, so the peak memory measured is this test's alone.

mod common;

use std::io::Read;

use common::{Server, dir_entries};
use futures::StreamExt;
use reqwest::StatusCode;

const RECORD_BYTES: u64 = 200 << 20;
const CHUNK_BYTES: u64 = 1 << 20;

/// The record's byte at `position`: a cheap pattern that differs between chunks and within them.
fn byte_at(position: u64) -> u8 {
    (position.wrapping_mul(0x9E37_79B9) >> 11) as u8 ^ (position >> 20) as u8
}

fn chunk_at(start: u64, len: u64) -> Vec<u8> {
    (start..start + len).map(byte_at).collect()
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_200_mib_record_streams_in_and_out() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let peak_before = peak_rss_kib();

    // Generated chunk by chunk as it is sent, with no Content-Length.
    let body = futures::stream::iter(
        (0..RECORD_BYTES / CHUNK_BYTES)
            .map(|i| Ok::<_, std::io::Error>(chunk_at(i * CHUNK_BYTES, CHUNK_BYTES))),
    );
    let put = reqwest::Client::new()
        .put(server.url("/records/big"))
        .header(reqwest::header::IF_NONE_MATCH, "*")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::NO_CONTENT);
    assert_eq!(dir_entries(dir.path()), ["big"]);

    // On disk: the size and every byte.
    let path = dir.path().join("big");
    let header = drain_api::record::HEADER_LEN as u64;
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        header + RECORD_BYTES
    );
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(path).unwrap();
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(header)).unwrap();
        let mut buf = vec![0u8; CHUNK_BYTES as usize];
        for i in 0..RECORD_BYTES / CHUNK_BYTES {
            file.read_exact(&mut buf).unwrap();
            assert!(
                buf == chunk_at(i * CHUNK_BYTES, CHUNK_BYTES),
                "chunk {i} differs"
            );
        }
    })
    .await
    .unwrap();

    // Streamed back out, with its length announced.
    let get = reqwest::get(server.url("/records/big")).await.unwrap();
    assert_eq!(get.status(), StatusCode::OK);
    assert_eq!(get.content_length(), Some(RECORD_BYTES));
    let mut position = 0u64;
    let mut chunks = get.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.unwrap();
        assert!(
            chunk.iter().zip(position..).all(|(b, p)| *b == byte_at(p)),
            "bytes differ near {position}"
        );
        position += chunk.len() as u64;
    }
    assert_eq!(position, RECORD_BYTES);

    // Neither direction held the record: the peak grew by far less than its size.
    let grown_mib = (peak_rss_kib() - peak_before) / 1024;
    assert!(grown_mib < 64, "peak memory grew by {grown_mib} MiB");
}
