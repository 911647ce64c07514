//! The controller installed in the cluster from an overlay, as a guard that removes it again,
//! and what the tests ask of it: its pods, logs, admin port and permissions.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use e2e::ops::{T, running_ready};
use e2e::{kubeconfig_path, kubectl, release_dir, repo_root, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::kustomize::{NAME, Scratch, kubectl_ok, overlay_dir, relocated, unique, watching};

/// The label of the controller's pods.
pub const POD_LABEL: &str = "app.kubernetes.io/name=statefulset-drain-controller";

/// Held by an in-cluster install from its start until it is removed.
static ONE_INSTALL_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A client for the local cluster, as its admin. Not `e2e::client()`: that one refuses to run
/// next to an installed controller, which is what these tests run.
pub async fn admin_client() -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig_path())?;
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// Fails if a controller installed in the cluster is running: it would act on the test's
/// namespaces too (`tests/run` pauses `example/up`'s).
async fn refuse_running_installs(client: &Client) -> Result<()> {
    let running = e2e::installed_controllers(client).await?;
    ensure!(
        running.is_empty(),
        "an installed statefulset-drain controller is running ({running:?}): run the tests with \
         tests/run (it pauses it), or scale it to 0"
    );
    Ok(())
}

/// Fails unless the controller image in the node is newer than every source file of the
/// controller: the install must run this source (`tests/run` builds the binaries and imports
/// them with `tests/cluster/images` before the tests). Modification times of the sources (unit
/// tests left out), not the binary's: `cargo test` may relink the binary with other dependency
/// features.
fn assert_image_fresh() -> Result<()> {
    let image = kubeconfig_path()
        .parent()
        .context("cluster directory")?
        .join("images/controller.tar");
    let built = std::fs::metadata(&image)
        .and_then(|m| m.modified())
        .with_context(|| format!("{} (run tests/cluster/images)", image.display()))?;
    let root = repo_root();
    let mut newest = (SystemTime::UNIX_EPOCH, PathBuf::new());
    let mut todo: Vec<PathBuf> = ["Cargo.toml".to_owned(), "Cargo.lock".to_owned()]
        .into_iter()
        .chain(
            ["controller", "drain-api", "drain-logging"]
                .into_iter()
                .flat_map(|c| [format!("crates/{c}/src"), format!("crates/{c}/Cargo.toml")]),
        )
        .map(|p| root.join(p))
        .collect();
    while let Some(path) = todo.pop() {
        let meta = std::fs::metadata(&path).with_context(|| path.display().to_string())?;
        // Unit tests are not in the binary.
        if path
            .file_name()
            .is_some_and(|n| n == "tests" || n == "tests.rs")
        {
            continue;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                todo.push(entry?.path());
            }
        } else if meta.modified()? > newest.0 {
            newest = (meta.modified()?, path);
        }
    }
    ensure!(
        built >= newest.0,
        "the controller image {} is older than {}: run cargo build --release --workspace --bins \
         and tests/cluster/images",
        image.display(),
        newest.1.display()
    );
    Ok(())
}

/// The controller installed in the cluster from an overlay, into a namespace of its own. Removed
/// (`kubectl delete -k`, then waiting until its pods are gone) when dropped.
pub struct Install {
    overlay: &'static str,
    /// The controller's namespace.
    pub namespace: String,
    /// The suffix of every name.
    pub suffix: String,
    /// The kustomization applied.
    dir: PathBuf,
    /// An admin client.
    pub client: Client,
    _scratch: Scratch,
    // Last: released after the removal in `drop`.
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

impl Install {
    /// `kubectl apply -k` of the overlay, relocated into a namespace of its own, and for
    /// single-namespace watching `watched` (the overlay docs/install.md shows).
    pub async fn apply(overlay: &'static str, watched: Option<&str>) -> Result<Self> {
        let lock = ONE_INSTALL_AT_A_TIME.lock().await;
        let client = admin_client().await?;
        refuse_running_installs(&client).await?;
        assert_image_fresh()?;
        let id = unique();
        let short = match overlay {
            "cluster-wide" => "cw",
            "single-namespace" => "sn",
            _ => overlay,
        };
        let namespace = format!("e2e-sys-{short}-{id}");
        let suffix = format!("-e2e-{id}");
        let scratch = Scratch::new(&format!("install-{short}"))?;
        let relocated_dir = scratch.0.join("install");
        relocated(&relocated_dir, &overlay_dir(overlay), &namespace, &suffix)?;
        let dir = match watched {
            Some(w) => {
                let dir = scratch.0.join("watching");
                watching(&dir, &relocated_dir, w)?;
                dir
            }
            None => relocated_dir,
        };
        let install = Self {
            overlay,
            namespace,
            suffix,
            dir,
            client,
            _scratch: scratch,
            _one_at_a_time: lock,
        };
        eprintln!(
            "installing {overlay} into {} (kubectl apply -k {})",
            install.namespace,
            install.dir.display()
        );
        kubectl_ok(&["apply", "-k", &install.dir.display().to_string()], None)?;
        Ok(install)
    }

    /// `system:serviceaccount:<namespace>:<name>`, the controller's identity.
    pub fn service_account(&self) -> String {
        format!(
            "system:serviceaccount:{}:{NAME}{}",
            self.namespace, self.suffix
        )
    }

    /// Pods in the controller's namespace.
    pub fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The controller's pods that are not being deleted.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        Ok(self
            .pods_api()
            .list(&ListParams::default().labels(POD_LABEL))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until the Deployment has `replicas` updated, Ready replicas and no others; their
    /// pod names.
    pub async fn wait_ready(&self, replicas: i32) -> Result<Vec<String>> {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        let deployment = format!("{NAME}{}", self.suffix);
        wait_for(
            T,
            &format!("{replicas} Ready replicas of {deployment}"),
            || async {
                let Some(d) = deployments.get_opt(&deployment).await? else {
                    return Ok(false);
                };
                let st = d.status.unwrap_or_default();
                let pods = self.pods().await?;
                Ok(st.observed_generation == d.metadata.generation
                    && st.updated_replicas == Some(replicas)
                    && st.ready_replicas == Some(replicas)
                    && st.replicas == Some(replicas)
                    && pods.len() == replicas as usize
                    && pods.iter().all(running_ready))
            },
        )
        .await
        .with_context(|| self.describe())?;
        Ok(self
            .pods()
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    /// The controller pods' state and recent logs, for a failure message.
    fn describe(&self) -> String {
        let pods = kubectl()
            .args(["-n", &self.namespace, "get", "pods", "-o", "wide"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        format!("{pods}\n{}", self.logs())
    }

    /// Every controller pod's log, each line prefixed with the pod's name.
    pub fn logs(&self) -> String {
        kubectl()
            .args(["-n", &self.namespace, "logs", "-l", POD_LABEL])
            .args([
                "--all-containers",
                "--prefix",
                "--tail=-1",
                "--max-log-requests=10",
            ])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }

    /// Appends the controller pods' logs to `e2e-logs/<namespace>.log` (a pod's log is gone with
    /// the pod: save it before deleting one); the file's path.
    pub fn save_logs(&self, when: &str) -> PathBuf {
        let dir = release_dir().join("e2e-logs");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{}.log", self.namespace));
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(file, "== logs before {when}\n{}", self.logs());
        }
        path
    }

    /// Fails if a controller's log shows a denied request: the shipped RBAC must be enough. A
    /// write refused because its namespace is being deleted (another test's, with a drain in
    /// flight: 403 with cause `NamespaceTerminating`) is no denial.
    pub fn assert_nothing_forbidden(&self) -> Result<()> {
        let logs = self.logs();
        let denied: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
            .filter(|l| !l.contains("NamespaceTerminating"))
            .collect();
        ensure!(denied.is_empty(), "requests denied:\n{}", denied.join("\n"));
        Ok(())
    }

    /// `/livez`, `/readyz` and `/metrics` of each pod answer on the admin port (the pods are
    /// reachable by IP from the node).
    pub async fn assert_admin_port(&self) -> Result<()> {
        for pod in self.pods().await? {
            let ip = pod
                .status
                .and_then(|s| s.pod_ip)
                .context("controller pod IP")?;
            for path in ["/livez", "/readyz", "/metrics"] {
                let url = format!("http://{ip}:8080{path}");
                let response = reqwest::get(&url).await.with_context(|| url.clone())?;
                ensure!(response.status() == 200, "{url}: {}", response.status());
                if path == "/metrics" {
                    ensure!(
                        response.text().await?.contains("statefulset_drain_"),
                        "{url}: no statefulset_drain_ metrics"
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether the controller's service account may (`kubectl auth can-i`).
    fn can_i(&self, args: &[&str]) -> Result<bool> {
        let sa = self.service_account();
        let out = kubectl()
            .args(["auth", "can-i", "--as", &sa])
            .args(args)
            .output()?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match answer.as_str() {
            "yes" => Ok(true),
            "no" => Ok(false),
            _ => bail!(
                "kubectl auth can-i {args:?}: {answer} {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// Fails unless the controller's service account may do each of `allowed` and none of
    /// `denied`.
    pub fn assert_permissions(&self, allowed: &[&[&str]], denied: &[&[&str]]) -> Result<()> {
        for args in allowed {
            ensure!(
                self.can_i(args)?,
                "{} cannot {args:?}",
                self.service_account()
            );
        }
        for args in denied {
            ensure!(
                !self.can_i(args)?,
                "{} can {args:?}",
                self.service_account()
            );
        }
        Ok(())
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        let log = self.save_logs("removal");
        eprintln!(
            "removing the {} install {} (its logs: {})",
            self.overlay,
            self.namespace,
            log.display()
        );
        let dir = self.dir.display().to_string();
        let deleted = kubectl()
            .args(["delete", "-k", &dir, "--ignore-not-found", "--wait=false"])
            .output();
        if let Ok(out) = &deleted
            && !out.status.success()
        {
            eprintln!(
                "kubectl delete -k {dir}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The next install, and the next test binary, must not find its controllers running.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let left = kubectl()
                .args([
                    "-n",
                    &self.namespace,
                    "get",
                    "pods",
                    "-l",
                    POD_LABEL,
                    "-o",
                    "name",
                ])
                .output()
                .map(|o| o.status.success() && o.stdout.is_empty());
            if matches!(left, Ok(true)) {
                break;
            }
            if std::time::Instant::now() > deadline {
                eprintln!("the controller pods in {} are not gone", self.namespace);
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}
