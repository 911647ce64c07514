//! The datastore's HTTP API against a real server on 127.0.0.1 with a temporary data directory.

mod common;

use common::{Server, dir_entries};
use drain_api::record::{
    HEADER_LEN, Header, Kind, OWNER_HEADER, OWNER_UID_HEADER, TOMBSTONE_HEADER, VERSION_HEADER,
    Version,
};
use reqwest::StatusCode;

#[tokio::test]
async fn put_get_list_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let client = server.client();

    assert!(client.healthy().await);
    assert_eq!(client.list().await.unwrap(), Vec::<String>::new());
    client.put("b-2", b"two".to_vec()).await.unwrap();
    client.put("a.1", vec![0u8, 255, 10]).await.unwrap();
    client.put("c_3", Vec::new()).await.unwrap();

    assert_eq!(
        client.get("b-2").await.unwrap().as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(
        client.get("a.1").await.unwrap().as_deref(),
        Some(&[0u8, 255, 10][..])
    );
    assert_eq!(client.get("c_3").await.unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(client.get("missing").await.unwrap(), None);
    assert_eq!(client.list().await.unwrap(), ["a.1", "b-2", "c_3"]);

    // Same key overwrites.
    client.put("b-2", b"TWO".to_vec()).await.unwrap();
    assert_eq!(
        client.get("b-2").await.unwrap().as_deref(),
        Some(&b"TWO"[..])
    );
    assert_eq!(client.list().await.unwrap(), ["a.1", "b-2", "c_3"]);

    // Each record is one file named after its key, holding its header and then its value.
    assert_eq!(dir_entries(dir.path()), ["a.1", "b-2", "c_3"]);
    let file = std::fs::read(dir.path().join("b-2")).unwrap();
    let header = Header::parse(&file).expect("a versioned record");
    assert_eq!(header.kind, Kind::Value);
    assert_eq!(&file[HEADER_LEN..], b"TWO");
}

#[tokio::test]
async fn raw_status_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();

    let put = http
        .put(server.url("/records/k"))
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::NO_CONTENT);
    let get = http.get(server.url("/records/k")).send().await.unwrap();
    assert_eq!(get.status(), StatusCode::OK);
    assert_eq!(get.bytes().await.unwrap(), "v");
    let missing = http.get(server.url("/records/nope")).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let health = http.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(health.text().await.unwrap(), "ok");
    let list = http.get(server.url("/records")).send().await.unwrap();
    assert_eq!(list.status(), StatusCode::OK);
    assert_eq!(list.json::<Vec<String>>().await.unwrap(), ["k"]);
}

#[tokio::test]
async fn bad_keys_are_rejected_with_400() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let long = "x".repeat(201);
    for key in [".hidden", ".tmp-1", "a%20b", "a+b", "%C3%A9", long.as_str()] {
        let url = server.url(&format!("/records/{key}"));
        let put = http.put(&url).body("v").send().await.unwrap();
        assert_eq!(put.status(), StatusCode::BAD_REQUEST, "PUT {key}");
        let get = http.get(&url).send().await.unwrap();
        assert_eq!(get.status(), StatusCode::BAD_REQUEST, "GET {key}");
    }
    // Through the client too, which percent-encodes.
    let err = server.client().put("a b", b"v".to_vec()).await.unwrap_err();
    assert!(
        matches!(err, datastore::client::ClientError::Status { status, .. } if status == StatusCode::BAD_REQUEST),
        "{err}"
    );
    assert!(dir_entries(dir.path()).is_empty());
}

#[tokio::test]
async fn atomic_writes_leave_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let client = server.client();
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..50u8 {
        let client = client.clone();
        // Several writers on few keys, overwrites racing each other.
        writes.spawn(async move {
            client
                .put(&format!("k{}", i % 5), vec![i; 4096])
                .await
                .unwrap();
        });
    }
    while let Some(done) = writes.join_next().await {
        done.unwrap();
    }
    assert_eq!(dir_entries(dir.path()), ["k0", "k1", "k2", "k3", "k4"]);
    for key in ["k0", "k1", "k2", "k3", "k4"] {
        let file = std::fs::read(dir.path().join(key)).unwrap();
        let value = &file[HEADER_LEN..];
        assert_eq!(value.len(), 4096);
        assert!(value.iter().all(|b| *b == value[0]), "torn write in {key}");
    }
}

#[tokio::test]
async fn list_ignores_temporary_files_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    std::fs::write(dir.path().join(".tmp-leftover"), b"partial").unwrap();
    std::fs::create_dir(dir.path().join("lost+found")).unwrap();
    std::fs::write(dir.path().join("r1"), b"1").unwrap();
    assert_eq!(server.client().list().await.unwrap(), ["r1"]);
}

fn version_of(response: &reqwest::Response) -> Version {
    response
        .headers()
        .get(VERSION_HEADER)
        .expect("x-record-version")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn writes_and_deletes_answer_their_versions_and_a_deleted_key_reads_404() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");
    let first = http.put(&url).body("one").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::NO_CONTENT);
    let second = http.put(&url).body("two").send().await.unwrap();
    assert!(version_of(&second) > version_of(&first));
    let get = http.get(&url).send().await.unwrap();
    assert_eq!(version_of(&get), version_of(&second));
    let deleted = http.delete(&url).send().await.unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    assert!(version_of(&deleted) > version_of(&second));
    assert_eq!(
        http.get(&url).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    assert!(server.client().list().await.unwrap().is_empty());
    // The tombstone stays on disk, a header alone.
    let file = std::fs::read(dir.path().join("k")).unwrap();
    assert_eq!(file.len(), HEADER_LEN);
    assert_eq!(Header::parse(&file).unwrap().kind, Kind::Tombstone);
}

#[tokio::test]
async fn a_handover_keeps_the_higher_version_and_answers_the_one_held() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");
    let here = version_of(&http.put(&url).body("newer").send().await.unwrap());

    let older = Version {
        millis: 1,
        counter: 0,
        node: "peer".into(),
    };
    let answer = http
        .put(&url)
        .header(VERSION_HEADER, older.to_string())
        .body("older")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    assert_eq!(version_of(&answer), here, "the newer copy here stays");
    assert_eq!(server.client().get("k").await.unwrap().unwrap(), b"newer");

    // A newer tombstone handed over replaces the value.
    let newer = Version {
        millis: here.millis + 1,
        counter: 0,
        node: "peer".into(),
    };
    let answer = http
        .put(&url)
        .header(VERSION_HEADER, newer.to_string())
        .header(TOMBSTONE_HEADER, "1")
        .send()
        .await
        .unwrap();
    assert_eq!(version_of(&answer), newer);
    assert_eq!(answer.headers()[TOMBSTONE_HEADER], "1");
    assert_eq!(server.client().get("k").await.unwrap(), None);
}

#[tokio::test]
async fn bad_handovers_and_releases_get_400() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");
    for (version, tombstone, body) in [
        ("not-a-version", false, ""),
        ("1.0.peer", true, "a tombstone with a body"),
    ] {
        let mut request = http.put(&url).header(VERSION_HEADER, version).body(body);
        if tombstone {
            request = request.header(TOMBSTONE_HEADER, "1");
        }
        let status = request.send().await.unwrap().status();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{version} {body}");
    }
    let release = http
        .post(server.url("/records/k/release"))
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), StatusCode::BAD_REQUEST);
    assert!(dir_entries(dir.path()).is_empty());
}

#[tokio::test]
async fn a_release_removes_only_the_version_named() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");
    let first = version_of(&http.put(&url).body("one").send().await.unwrap());
    let second = version_of(&http.put(&url).body("two").send().await.unwrap());
    let release = |v: Version| {
        http.post(server.url("/records/k/release"))
            .header(VERSION_HEADER, v.to_string())
            .send()
    };
    let refused = release(first).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(version_of(&refused), second);
    assert_eq!(server.client().get("k").await.unwrap().unwrap(), b"two");
    let released = release(second.clone()).await.unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    assert!(dir_entries(dir.path()).is_empty());
    assert_eq!(
        release(second).await.unwrap().status(),
        StatusCode::NO_CONTENT,
        "gone already is fine"
    );
}

#[tokio::test]
async fn a_handover_meant_for_another_pod_is_refused_with_421() {
    let dir = tempfile::tempdir().unwrap();
    let store = datastore::Store::open_pod(dir.path(), "datastore-1", Some("uid-1")).unwrap();
    let server = Server::serve(store).await;
    let http = reqwest::Client::new();
    let url = server.url("/records/k");
    let send = |owner: &'static str, uid: &'static str| {
        http.put(&url)
            .header(VERSION_HEADER, "5.0.datastore-2")
            .header(OWNER_HEADER, owner)
            .header(OWNER_UID_HEADER, uid)
            .body("v")
            .send()
    };
    for (owner, uid) in [("datastore-0", "uid-1"), ("datastore-1", "uid-0")] {
        let answer = send(owner, uid).await.unwrap();
        assert_eq!(
            answer.status(),
            StatusCode::MISDIRECTED_REQUEST,
            "{owner} {uid}"
        );
    }
    assert!(dir_entries(dir.path()).is_empty(), "nothing stored");
    let answer = send("datastore-1", "uid-1").await.unwrap();
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    assert_eq!(answer.headers()[OWNER_HEADER], "datastore-1");
    assert_eq!(answer.headers()[OWNER_UID_HEADER], "uid-1");
    assert_eq!(server.client().get("k").await.unwrap().unwrap(), b"v");
}
