//! Fixtures for the end-to-end tests: the real local cluster of `tests/cluster`, a namespace per
//! test that is removed afterwards, object builders and polling helpers.
//!
//! The cluster comes from `STSD_KUBECONFIG` when set (the test command sets it after
//! `tests/cluster/up`); otherwise the first test of a binary runs `tests/cluster/up` itself, which
//! is idempotent. A test never skips: no cluster is a loud failure.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub mod faults;
pub mod kruise;
pub mod nodes;
pub mod objects;
pub mod ops;
pub mod redis;
pub mod stats;
pub mod suite;
pub mod witness;

/// Runs the harness script `script` (a path from the repository's root, e.g.
/// `tests/cluster/helm`), its own output on this program's stderr; its stdout, or an error if
/// it fails. The harness's build-once scripts print what they built on their last lines.
pub fn harness(script: &str) -> Result<String> {
    let out = std::process::Command::new(repo_root().join(script))
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("run {script}"))?;
    if !out.status.success() {
        bail!("{script} failed ({}; its output is above)", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Root of the repository.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// Path of the admin kubeconfig of the local cluster, bringing the cluster up if needed.
pub fn kubeconfig_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Ok(p) = std::env::var("STSD_KUBECONFIG") {
            return PathBuf::from(p);
        }
        let up = repo_root().join("tests/cluster/up");
        let out = std::process::Command::new(&up)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", up.display()));
        assert!(
            out.status.success(),
            "tests/cluster/up failed ({}): the end-to-end tests need the local cluster",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        PathBuf::from(
            stdout
                .lines()
                .last()
                .expect("up printed the kubeconfig path")
                .trim(),
        )
    })
    .clone()
}

/// A client for the local cluster, as its admin.
pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kc = Kubeconfig::read_from(&path).expect("read kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(cfg).expect("client");
    refuse_other_controllers(&client).await;
    client
}

/// The pods (`namespace/name`) of controllers installed in the cluster (label
/// `app.kubernetes.io/name=statefulset-drain-controller`) that are running, not terminating.
pub async fn installed_controllers(client: &Client) -> kube::Result<Vec<String>> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client.clone());
    let lp = kube::api::ListParams::default()
        .labels("app.kubernetes.io/name=statefulset-drain-controller");
    Ok(pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.unwrap_or_default(),
                p.metadata.name.unwrap_or_default()
            )
        })
        .collect())
}

/// Panics if a controller installed in the cluster (example/up's) is running: it would act on the
/// test namespaces next to the controller each test starts, and tests would see two actors.
/// `tests/run` pauses such controllers for the duration of the tests and restores them after.
async fn refuse_other_controllers(client: &Client) {
    static CHECKED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CHECKED
        .get_or_init(|| async {
            let running = installed_controllers(client)
                .await
                .expect("list pods of installed controllers");
            assert!(
                running.is_empty(),
                "an installed statefulset-drain controller is running in the test cluster \
                 ({running:?}) and would act on the test namespaces too: run the tests with \
                 tests/run (it pauses it and restores it afterwards), or scale it to 0"
            );
        })
        .await;
}

/// The `kubectl` the harness built, for tests that show what a user types.
pub fn kubectl() -> std::process::Command {
    let root = repo_root();
    let version = std::fs::read_to_string(root.join("tests/cluster/go/kubernetes/go.mod"))
        .expect("go.mod")
        .lines()
        .find_map(|l| {
            l.strip_prefix("require k8s.io/kubernetes ")
                .map(str::to_owned)
        })
        .expect("kubernetes version");
    let cache = std::env::var("STSD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/statefulset-drain")
        });
    let mut cmd =
        std::process::Command::new(cache.join(format!("bin/kubernetes-{version}/kubectl")));
    cmd.arg("--kubeconfig").arg(kubeconfig_path());
    cmd
}

/// A namespace of its own for one test; deleted (with everything in it) when dropped.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `e2e-<prefix>-<random>`.
    pub async fn new(client: &Client, prefix: &str) -> Result<Self> {
        let suffix = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
                & 0xffffff
        );
        let name = format!("e2e-{prefix}-{suffix}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"statefulset-drain/e2e": "true"}}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        // Pods need the namespace's default service account.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_for(
            Duration::from_secs(30),
            "default service account",
            || async { Ok(sa.get_opt("default").await?.is_some()) },
        )
        .await?;
        Ok(Self {
            name,
            client: client.clone(),
        })
    }

    /// The client the namespace was made with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A namespaced API in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        let path = kubeconfig_path();
        // Drop may run inside a runtime: delete from a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let kc = Kubeconfig::read_from(&path)?;
                let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
                let client = Client::try_from(cfg)?;
                Api::<Namespace>::all(client)
                    .delete(&name, &DeleteParams::background())
                    .await?;
                anyhow::Ok(())
            })
        })
        .join();
    }
}

/// Polls `check` every 100 ms until it returns true; fails after `timeout`, naming `what`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > timeout {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Directory of the release binaries (`cargo build --release` puts them there; the test command
/// builds them first).
pub fn release_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target"))
        .join("release")
}

/// A `statefulset-drain-controller` process run against the local cluster; killed when dropped.
pub struct ControllerProcess {
    child: std::process::Child,
    /// Where its log goes.
    pub log: PathBuf,
    /// How long the log was when this process started (earlier runs' lines come before).
    log_start: usize,
    /// Whether the test killed it ([`kill`](Self::kill)).
    killed: bool,
}

impl ControllerProcess {
    /// Starts the controller watching only `namespace`, with short retry delays, logging with the
    /// filter in `STSD_E2E_CONTROLLER_LOG` (default `info,kube=warn`).
    pub fn start(namespace: &str, extra: &[&str]) -> Self {
        let filter =
            std::env::var("STSD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Self::start_with_log(namespace, extra, &filter)
    }

    /// Like [`start`](Self::start), logging to `controller-<namespace>-<name>.log`: for several
    /// controllers in one namespace.
    pub fn start_named(namespace: &str, name: &str, extra: &[&str]) -> Self {
        let filter =
            std::env::var("STSD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Self::spawn(namespace, &format!("{namespace}-{name}"), extra, &filter)
    }

    /// A replica named `name` electing through a Lease in `namespace` with short durations
    /// (4 s lease, 3 s renew deadline, 1 s retry period), logging like
    /// [`start_named`](Self::start_named).
    pub fn start_replica(namespace: &str, name: &str) -> Self {
        Self::start_replica_with(namespace, name, &[])
    }

    /// Like [`start_replica`](Self::start_replica), with these arguments too.
    pub fn start_replica_with(namespace: &str, name: &str, extra: &[&str]) -> Self {
        let election = [
            "--leader-elect",
            "--leader-elect-namespace",
            namespace,
            "--leader-elect-identity",
            name,
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "1s",
        ];
        Self::start_named(namespace, name, &[&election[..], extra].concat())
    }

    /// Like [`start`](Self::start), logging with this `RUST_LOG` filter.
    pub fn start_with_log(namespace: &str, extra: &[&str], filter: &str) -> Self {
        Self::spawn(namespace, namespace, extra, filter)
    }

    /// Like [`start`](Self::start), talking to the cluster with this kubeconfig (another
    /// identity than the admin's, e.g. [`faults::ControllerIdentity`]).
    pub fn start_with_kubeconfig(namespace: &str, kubeconfig: &Path, extra: &[&str]) -> Self {
        let filter =
            std::env::var("STSD_E2E_CONTROLLER_LOG").unwrap_or_else(|_| "info,kube=warn".into());
        Self::spawn_with(namespace, namespace, extra, &filter, kubeconfig)
    }

    fn spawn(namespace: &str, log_name: &str, extra: &[&str], filter: &str) -> Self {
        Self::spawn_with(namespace, log_name, extra, filter, &kubeconfig_path())
    }

    fn spawn_with(
        namespace: &str,
        log_name: &str,
        extra: &[&str],
        filter: &str,
        kubeconfig: &Path,
    ) -> Self {
        let bin = release_dir().join("statefulset-drain-controller");
        assert!(
            bin.exists(),
            "{} not found: run `cargo build --release` (tests/run does) first",
            bin.display()
        );
        let logs = release_dir().join("e2e-logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let log = logs.join(format!("controller-{log_name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let log_start = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let child = std::process::Command::new(bin)
            .args([
                "--namespace",
                namespace,
                "--retry-base-delay",
                "500ms",
                "--retry-max-delay",
                "2s",
                // Tests run several controllers at once: each on a free admin port (logged).
                "--admin-address",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", filter)
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start the controller");
        Self {
            child,
            log,
            log_start,
            killed: false,
        }
    }

    /// The base URL of its admin server (`http://127.0.0.1:<port>`), read from its log.
    pub fn admin_url(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read(&self.log).unwrap_or_default();
            // This process's start (the log is appended to across runs).
            let own = String::from_utf8_lossy(text.get(self.log_start..).unwrap_or_default());
            if let Some(line) = own
                .lines()
                .rev()
                .find(|l| l.contains("admin server listening"))
                && let Some(addr) = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("address="))
            {
                return format!("http://{}", addr.trim_matches('"'));
            }
            assert!(
                Instant::now() < deadline,
                "no admin address in {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends it a signal (`STOP`, `CONT`, `TERM`, ...), by `kill -<sig>`.
    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Waits up to `timeout` for it to exit; its exit code (`None`: killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.killed = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    /// Kills it, and shows how it ended and the end of its log: libtest shows a test's output
    /// only when the test fails, so a failure in CI comes with the controller's side of it.
    fn drop(&mut self) {
        let ended = (!self.killed)
            .then(|| self.child.try_wait().ok().flatten())
            .flatten();
        self.kill();
        if let Some(status) = ended {
            eprintln!(
                "controller {} had exited before the end of the test: {status}",
                self.child.id()
            );
        }
        let text = std::fs::read(&self.log).unwrap_or_default();
        let own = String::from_utf8_lossy(text.get(self.log_start..).unwrap_or_default());
        let lines: Vec<&str> = own.lines().collect();
        const TAIL: usize = 40;
        eprintln!(
            "--- the last {} lines of controller {} ({}):",
            lines.len().min(TAIL),
            self.child.id(),
            self.log.display()
        );
        for line in &lines[lines.len().saturating_sub(TAIL)..] {
            eprintln!("{}", line.chars().take(400).collect::<String>());
        }
    }
}
