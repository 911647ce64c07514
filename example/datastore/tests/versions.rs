//! The newest write wins on every path: random sequences of client writes and deletes on three
//! servers, with handovers between them in any order (a drain, a rebalance, a cancelled or
//! repeated one), end with every key holding its last write, on whichever server it is
//! gathered. Judged from the client's own sequence of operations, not from versions.

use std::collections::BTreeMap;

use datastore::Store;
use datastore::store::{Key, Released};
use drain_api::record::{Kind, acknowledges};
use proptest::prelude::*;

const SERVERS: usize = 3;
const KEYS: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    /// A client writes a new value of `key` on `server`.
    Put { server: usize, key: usize },
    /// A client deletes `key` on `server`.
    Delete { server: usize, key: usize },
    /// `from` hands its copy of `key` (if any) to `to`, and releases it once acknowledged.
    Handover { from: usize, to: usize, key: usize },
    /// `from` hands its copy over but the answer is lost: it keeps its copy.
    LostAnswer { from: usize, to: usize, key: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let server = 0..SERVERS;
    let key = 0..KEYS.len();
    prop_oneof![
        3 => (server.clone(), key.clone()).prop_map(|(server, key)| Op::Put { server, key }),
        1 => (server.clone(), key.clone()).prop_map(|(server, key)| Op::Delete { server, key }),
        3 => (server.clone(), server.clone(), key.clone())
            .prop_filter("two servers", |(f, t, _)| f != t)
            .prop_map(|(from, to, key)| Op::Handover { from, to, key }),
        1 => (server.clone(), server, key)
            .prop_filter("two servers", |(f, t, _)| f != t)
            .prop_map(|(from, to, key)| Op::LostAnswer { from, to, key }),
    ]
}

fn key(i: usize) -> Key {
    Key::parse(KEYS[i]).unwrap()
}

/// Hands `from`'s copy of `key` to `to`; releases it on `from` if `release` and acknowledged.
async fn hand_over(stores: &[Store], from: usize, to: usize, k: usize, release: bool) {
    let Some(header) = stores[from].header(key(k)).await.unwrap() else {
        return;
    };
    let value = match header.kind {
        Kind::Value => stores[from].get(key(k)).await.unwrap().unwrap(),
        Kind::Tombstone => Vec::new(),
    };
    let held = stores[to]
        .hand_over(key(k), header.kind, header.version.clone(), value)
        .await
        .unwrap();
    if release && acknowledges(&held.version, &header.version) {
        let released = stores[from].release(key(k), &header.version).await.unwrap();
        assert_eq!(released, Released::Released, "nothing else writes here");
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dirs: Vec<_> = (0..SERVERS).map(|_| tempfile::tempdir().unwrap()).collect();
    let stores: Vec<Store> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| Store::open_as(d.path(), &format!("server-{i}")).unwrap())
        .collect();
    // The client's view: the last acknowledged operation of each key.
    let mut last: BTreeMap<usize, Option<Vec<u8>>> = BTreeMap::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Put { server, key: k } => {
                let value = format!("{}-{n}", KEYS[k]).into_bytes();
                stores[server].put(key(k), value.clone()).await.unwrap();
                last.insert(k, Some(value));
            }
            Op::Delete { server, key: k } => {
                stores[server].delete(key(k)).await.unwrap();
                last.insert(k, None);
            }
            Op::Handover { from, to, key: k } => hand_over(&stores, from, to, k, true).await,
            Op::LostAnswer { from, to, key: k } => hand_over(&stores, from, to, k, false).await,
        }
        // A client's sequential writes are at least milliseconds apart; writes on servers that
        // exchanged nothing are ordered by their wall clocks (documented in store::clock).
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    // Gather every copy on server 0, as drains and rebalances do in the end.
    for from in 1..SERVERS {
        for k in 0..KEYS.len() {
            hand_over(&stores, from, 0, k, true).await;
        }
    }
    for (k, want) in last {
        let got = stores[0].get(key(k)).await.unwrap();
        prop_assert_eq!(
            got.as_deref(),
            want.as_deref(),
            "key {} after gathering",
            KEYS[k]
        );
        for store in &stores[1..] {
            prop_assert_eq!(store.header(key(k)).await.unwrap(), None);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_key_ends_at_its_last_write_whatever_the_handovers(
        ops in prop::collection::vec(op(), 1..30)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run(ops))?;
    }
}
