//! A datastore server on 127.0.0.1 with a temporary data directory, shared by the test binaries.

#![allow(dead_code)] // Each test binary uses a different part.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use datastore::http::Limits;
use datastore::{Client, Store};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A server on an ephemeral port; stops when dropped.
pub struct Server {
    pub addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl Server {
    /// A server over `dir` with the default limits.
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, Limits::default()).await
    }

    /// A server over `dir` with `limits`.
    pub async fn start_with(dir: &Path, limits: Limits) -> Self {
        Self::serve_with(Store::open_as(dir, "test-server").unwrap(), limits).await
    }

    /// A server of `store` with the default limits.
    pub async fn serve(store: Store) -> Self {
        Self::serve_with(store, Limits::default()).await
    }

    /// A server of `store` with `limits`.
    pub async fn serve_with(store: Store, limits: Limits) -> Self {
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
        Self { addr, _stop: stop }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url("")).unwrap()
    }
}

/// The names in `dir`, sorted, but for the clock's high-water mark (`.clock`).
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != datastore::store::clock::CLOCK_FILE)
        .collect();
    names.sort();
    names
}

/// Whether `dir` holds a temporary file of a write in progress.
pub fn has_temp_file(dir: &Path) -> bool {
    dir_entries(dir)
        .iter()
        .any(|name| name.starts_with(datastore::store::TEMP_PREFIX))
}

/// Polls `condition` every 10 ms for up to 10 s; whether it became true.
pub async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}
