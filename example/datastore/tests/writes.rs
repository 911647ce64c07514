//! Create-only writes, the size limit, broken bodies, error bodies and the concurrency limit,
//! against a real server on 127.0.0.1 with a temporary data directory.

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;

use common::{Server, dir_entries, eventually, has_temp_file};
use datastore::Created;
use datastore::http::Limits;
use reqwest::StatusCode;
use reqwest::header::IF_NONE_MATCH;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The value part of a record file (after its header).
fn value_on_disk(dir: &std::path::Path, key: &str) -> Vec<u8> {
    let file = std::fs::read(dir.join(key)).unwrap();
    file[drain_api::record::HEADER_LEN..].to_vec()
}

fn limits(max_record_bytes: u64, max_concurrent_requests: usize) -> Limits {
    Limits {
        max_record_bytes,
        max_concurrent_requests: NonZeroUsize::new(max_concurrent_requests).unwrap(),
    }
}

/// Sends the head of a `PUT /records/{key}` announcing `content_length` bytes, and `body`.
async fn partial_put(server: &Server, key: &str, content_length: u64, body: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "PUT /records/{key} HTTP/1.1\r\nhost: {}\r\ncontent-length: {content_length}\r\n\r\n",
        server.addr
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

#[tokio::test]
async fn create_only_answers_204_then_412_and_keeps_the_first_value() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");

    let first = http
        .put(&url)
        .header(IF_NONE_MATCH, "*")
        .body("first")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::NO_CONTENT);
    let second = http
        .put(&url)
        .header(IF_NONE_MATCH, "*")
        .body("second")
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(value_on_disk(dir.path(), "k"), b"first");

    // The client's `create` says the same; a plain PUT still overwrites.
    let client = server.client();
    assert_eq!(client.create("k", "third").await.unwrap(), Created::Exists);
    assert_eq!(client.create("n", "new").await.unwrap(), Created::Created);
    assert_eq!(client.get("k").await.unwrap().unwrap(), b"first");
    client.put("k", "put").await.unwrap();
    assert_eq!(client.get("k").await.unwrap().unwrap(), b"put");
    assert_eq!(dir_entries(dir.path()), ["k", "n"]);
}

#[tokio::test]
async fn concurrent_creates_of_one_key_have_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let client = server.client();
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..32u8 {
        let client = client.clone();
        creates.spawn(async move {
            let value = vec![i; 256 * 1024];
            (i, client.create("contested", value).await.unwrap())
        });
    }
    let mut winners = Vec::new();
    while let Some(done) = creates.join_next().await {
        let (i, created) = done.unwrap();
        if created == Created::Created {
            winners.push(i);
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let value = value_on_disk(dir.path(), "contested");
    assert_eq!(
        value,
        vec![winners[0]; 256 * 1024],
        "not the winner's value whole"
    );
    assert_eq!(dir_entries(dir.path()), ["contested"]);
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), limits(1024, 64)).await;
    let http = reqwest::Client::new();

    // Content-Length over the limit: refused before reading the body.
    let put = http
        .put(server.url("/records/big"))
        .body(vec![1u8; 1025])
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // No length announced: refused once the streamed bytes exceed the limit.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = (0..3).map(|_| Ok(vec![2u8; 400])).collect();
    let put = http
        .put(server.url("/records/streamed"))
        .header(IF_NONE_MATCH, "*")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        eventually(|| dir_entries(dir.path()).is_empty()).await,
        "{:?}",
        dir_entries(dir.path())
    );

    // Exactly the limit is fine.
    let put = http
        .put(server.url("/records/fits"))
        .body(vec![3u8; 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::NO_CONTENT);
    assert_eq!(dir_entries(dir.path()), ["fits"]);
}

#[tokio::test]
async fn a_client_gone_mid_body_leaves_no_record_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let stream = partial_put(&server, "k", 100 << 20, &vec![7u8; 256 * 1024]).await;
    assert!(
        eventually(|| has_temp_file(dir.path())).await,
        "the write never started"
    );
    drop(stream);
    assert!(
        eventually(|| dir_entries(dir.path()).is_empty()).await,
        "left behind: {:?}",
        dir_entries(dir.path())
    );
    assert_eq!(server.client().get("k").await.unwrap(), None);
}

#[tokio::test]
async fn a_500_names_no_path_or_os_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    // A directory where the record's file would go: the rename into place fails.
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d").join("inside"), b"x").unwrap();
    let http = reqwest::Client::new();
    for create_only in [false, true] {
        let mut put = http.put(server.url("/records/d")).body("v");
        if create_only {
            put = put.header(IF_NONE_MATCH, "*");
        }
        let answer = put.send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = answer.text().await.unwrap();
        assert_eq!(body, "internal error: failed to write record d");
        assert!(!body.contains(dir.path().to_str().unwrap()));
        assert!(!body.contains('/'), "{body}");
    }
    assert_eq!(dir_entries(dir.path()), ["d"]);
}

#[tokio::test]
async fn over_the_concurrency_limit_requests_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), limits(1 << 20, 1)).await;

    // The one slot: a PUT whose body is half sent.
    let mut slow = partial_put(&server, "slow", 10, b"01234").await;
    assert!(eventually(|| has_temp_file(dir.path())).await);

    // A second record request waits; the readiness probe does not.
    let client = server.client();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.list().await.unwrap() }
    });
    assert!(client.healthy().await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the second request did not wait");

    // Finishing the first frees the slot.
    slow.write_all(b"56789").await.unwrap();
    let mut answer = vec![0u8; 12];
    slow.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 204");
    let keys = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second request still waits")
        .unwrap();
    assert_eq!(keys, ["slow"]);
    assert_eq!(value_on_disk(dir.path(), "slow"), b"0123456789");
}
