//! The controller installed in the cluster from an overlay, as a guard that removes it again,
//! and what the tests ask of it: its pods, logs, admin port and permissions.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
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

/// The chart, `artifacts/chart/statefulset-drain`.
pub fn chart_dir() -> PathBuf {
    repo_root().join("artifacts/chart/statefulset-drain")
}

/// The `helm` the harness builds (`tests/cluster/helm`: once, then cached by version).
fn helm_binary() -> Result<PathBuf> {
    let out = e2e::harness("tests/cluster/helm")?;
    let path = out
        .lines()
        .last()
        .context("tests/cluster/helm printed no path")?;
    Ok(PathBuf::from(path.trim()))
}

/// The chart's previous release: the chart as it was before its version last changed, and the
/// image of the controller built from the same commit (`tests/cluster/previous-release`).
pub struct PreviousRelease {
    /// Its chart version.
    pub version: String,
    /// Its chart's directory.
    pub chart: PathBuf,
    /// Its controller image, `repository:tag`.
    pub image: String,
}

impl PreviousRelease {
    /// Runs `tests/cluster/previous-release` (builds the previous controller once, then cached;
    /// imports its image into the node).
    pub fn get() -> Result<Self> {
        let text = e2e::harness("tests/cluster/previous-release")?;
        let field = |key: &str| -> Result<String> {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(str::to_owned)
                .with_context(|| format!("tests/cluster/previous-release printed no {key}: {text}"))
        };
        Ok(Self {
            version: field("version")?,
            chart: PathBuf::from(field("chart")?),
            image: field("image")?,
        })
    }

    /// The tag of its controller image.
    pub fn tag(&self) -> &str {
        self.image.rsplit_once(':').map_or("", |(_, t)| t)
    }
}

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

/// How an install was made, and so how it is removed.
enum Source {
    /// `kubectl apply -k` of this kustomization.
    Kustomize(PathBuf),
    /// `helm install` of the chart as this release.
    Helm { release: String },
}

/// The controller installed in the cluster from an overlay or the chart, into a namespace of its
/// own. Removed (`kubectl delete -k` or `helm uninstall`, then waiting until its pods are gone)
/// when dropped.
pub struct Install {
    overlay: &'static str,
    /// The controller's namespace.
    pub namespace: String,
    /// The suffix of every name.
    pub suffix: String,
    source: Source,
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
        eprintln!(
            "installing {overlay} into {namespace} (kubectl apply -k {})",
            dir.display()
        );
        let install = Self {
            overlay,
            namespace,
            suffix,
            source: Source::Kustomize(dir.clone()),
            client,
            _scratch: scratch,
            _one_at_a_time: lock,
        };
        kubectl_ok(&["apply", "-k", &dir.display().to_string()], None)?;
        Ok(install)
    }

    /// `helm install --wait` of the chart (`artifacts/chart/statefulset-drain`) with its
    /// `ci/<values>-values.yaml` and `extra` (`helm` arguments), into a namespace of its own,
    /// its names suffixed as [`Install::apply`]'s are (`fullnameOverride`), its image the one
    /// `tests/cluster/images` built, `helm test`'s image busybox from the node.
    pub async fn helm(values: &'static str, extra: &[&str]) -> Result<Self> {
        assert_image_fresh()?;
        Self::helm_chart(&chart_dir(), values, extra).await
    }

    /// As [`Install::helm`], of the chart in `chart` (the previous release's, for one) with its
    /// own `ci/<values>-values.yaml`; its image is the values' unless `extra` sets another.
    pub async fn helm_chart(chart: &Path, values: &'static str, extra: &[&str]) -> Result<Self> {
        let lock = ONE_INSTALL_AT_A_TIME.lock().await;
        let client = admin_client().await?;
        refuse_running_installs(&client).await?;
        let id = unique();
        let namespace = format!("e2e-sys-helm-{id}");
        let suffix = format!("-e2e-{id}");
        let release = format!("stsd-e2e-{id}");
        let install = Self {
            overlay: values,
            namespace,
            suffix,
            source: Source::Helm {
                release: release.clone(),
            },
            client,
            _scratch: Scratch::new("helm")?,
            _one_at_a_time: lock,
        };
        eprintln!(
            "installing the chart {} ({values}) into {} as {release}",
            chart.display(),
            install.namespace
        );
        let mut args = vec![
            "install".to_owned(),
            release,
            chart.display().to_string(),
            "--namespace".to_owned(),
            install.namespace.clone(),
            "--create-namespace".to_owned(),
        ];
        args.extend(install.helm_values(chart, values));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        install.helm_ok(&args)?;
        Ok(install)
    }

    /// `helm upgrade --wait` of the release to the chart in `chart` with its own
    /// `ci/<values>-values.yaml` and the settings of [`Install::helm_chart`], and `extra`.
    pub fn helm_upgrade(&self, chart: &Path, values: &str, extra: &[&str]) -> Result<String> {
        let release = self.release().context("not a Helm install")?;
        let mut args = vec![
            "upgrade".to_owned(),
            release.to_owned(),
            chart.display().to_string(),
            "--namespace".to_owned(),
            self.namespace.clone(),
        ];
        args.extend(self.helm_values(chart, values));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        self.helm_ok(&args)
    }

    /// The arguments an install and an upgrade share: wait, the values file, the names
    /// suffixed, the node's images.
    fn helm_values(&self, chart: &Path, values: &str) -> Vec<String> {
        let values_file = chart.join(format!("ci/{values}-values.yaml"));
        let mut args: Vec<String> = [
            "--wait",
            "--timeout",
            "3m",
            "--values",
            &values_file.display().to_string(),
        ]
        .map(str::to_owned)
        .into();
        for set in [
            format!("fullnameOverride={NAME}{}", self.suffix),
            "image.pullPolicy=Never".to_owned(),
            "test.image.repository=statefulset-drain.local/drainer-hook".to_owned(),
            "test.image.tag=test".to_owned(),
            "test.image.pullPolicy=Never".to_owned(),
        ] {
            args.extend(["--set".to_owned(), set]);
        }
        args
    }

    /// The images of the controller pods' containers.
    pub async fn images(&self) -> Result<BTreeSet<String>> {
        Ok(self
            .pods()
            .await?
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
            .filter_map(|c| c.image.clone())
            .collect())
    }

    /// The release's name (`None` for a kustomize install).
    pub fn release(&self) -> Option<&str> {
        match &self.source {
            Source::Helm { release } => Some(release),
            Source::Kustomize(_) => None,
        }
    }

    /// Runs `helm ARGS` against the local cluster; its stdout, or an error with its output.
    pub fn helm_ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        let out = std::process::Command::new(helm_binary()?)
            .args(args)
            .env("KUBECONFIG", kubeconfig_path())
            .output()
            .context("run helm")?;
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.as_ref().to_string_lossy().into_owned())
            .collect();
        ensure!(
            out.status.success(),
            "helm {}: {}{}",
            shown.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm COMMAND... RELEASE --namespace NAMESPACE ARGS...` of this release (`get
    /// manifest`, `history`): its stdout.
    pub fn helm_of_release(&self, command: &[&str], args: &[&str]) -> Result<String> {
        let release = self.release().context("not a Helm install")?;
        let mut all: Vec<&str> = command.to_vec();
        all.extend([release, "--namespace", &self.namespace]);
        all.extend(args);
        self.helm_ok(&all)
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
        match &self.source {
            Source::Kustomize(dir) => {
                let dir = dir.display().to_string();
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
            }
            Source::Helm { release } => {
                // A test may have uninstalled it already; the namespace goes either way (helm
                // does not delete the namespace it created, nor a failed test pod).
                let args = [
                    "uninstall",
                    release.as_str(),
                    "--namespace",
                    &self.namespace,
                    "--ignore-not-found",
                ];
                if let Err(e) = self.helm_ok(&args) {
                    eprintln!("{e:#}");
                }
                let _ = kubectl()
                    .args(["delete", "namespace", &self.namespace, "--wait=false"])
                    .output();
            }
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
