//! `kubectl drain-status` (binary `kubectl-drain_status`): shows the drain status the
//! statefulset-drain controller reports on StatefulSets, one line per ordinal. Reads what
//! `kubectl get` could read: the sets, their namespace's claims and drain pods; writes nothing.
//!
//! This file parses the arguments, reads from the cluster and prints; [`view`] decides what is
//! shown.

mod view;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use drain_api::{annotations, labels, retained};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::view::SetSnapshot;

/// Shows the drain status of StatefulSets, one line per ordinal.
///
/// For each ordinal the statefulset-drain controller reports (annotation
/// statefulsets.kubernetes.io/drain-status): its state, attempt, age, progress, last failure and
/// claims; then the set's problem and failed actions, if any. Reads only, like kubectl get. The
/// cluster is found as kubectl finds it: KUBECONFIG or ~/.kube/config (or in-cluster config).
#[derive(Debug, Parser)]
#[command(bin_name = "kubectl drain-status", version)]
struct Args {
    /// The StatefulSet to show (default: every set with a drain status).
    #[arg(conflicts_with = "all_namespaces")]
    set: Option<String>,
    /// The namespace to look in (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Look in every namespace (overrides --namespace).
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// List the volumes kept after their drained claims were deleted
    /// (drain-retain-volume-for), with how to restore each, instead of the drain status.
    #[arg(long)]
    volumes: bool,
    /// Log filter (tracing EnvFilter syntax, e.g. debug); logs go to stderr. Off by default:
    /// errors are reported once, as the last line.
    #[arg(long, env = "RUST_LOG", default_value = "off")]
    log_filter: String,
}

/// Errors reading from the cluster.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// No kubeconfig (or in-cluster config) could be loaded.
    #[error("failed to configure the Kubernetes client")]
    Client(#[source] KubeError),
    /// The StatefulSet asked for does not exist.
    #[error("statefulset {name} not found in namespace {namespace}")]
    SetNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// Reading the StatefulSet asked for failed.
    #[error("failed to get statefulset {name} in namespace {namespace}")]
    GetStatefulSet {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The cause.
        #[source]
        source: KubeError,
    },
    /// Listing StatefulSets failed.
    #[error("failed to list statefulsets in {scope}")]
    ListStatefulSets {
        /// `namespace NS` or `all namespaces`.
        scope: String,
        /// The cause.
        #[source]
        source: KubeError,
    },
    /// Listing PersistentVolumeClaims failed.
    #[error("failed to list persistentvolumeclaims in {scope}")]
    ListClaims {
        /// `namespace NS` or `all namespaces`.
        scope: String,
        /// The cause.
        #[source]
        source: KubeError,
    },
    /// Listing PersistentVolumes failed.
    #[error("failed to list retained persistentvolumes")]
    ListVolumes(#[source] KubeError),
    /// Listing drain pods failed.
    #[error("failed to list drain pods in {scope}")]
    ListDrainPods {
        /// `namespace NS` or `all namespaces`.
        scope: String,
        /// The cause.
        #[source]
        source: KubeError,
    },
}

/// A client error, told as kubectl tells it: an API error as `Reason: message`, without the debug
/// dump of kube's own text.
#[derive(Debug)]
struct KubeError(kube::Error);

impl std::fmt::Display for KubeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            kube::Error::Api(status) if status.reason.is_empty() => f.write_str(&status.message),
            kube::Error::Api(status) => write!(f, "{}: {}", status.reason, status.message),
            other => write!(f, "{other}"),
        }
    }
}

impl std::error::Error for KubeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            kube::Error::Api(_) => None,
            other => other.source(),
        }
    }
}

/// Where to look: one namespace or all of them.
enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace.
    All,
}

impl Scope {
    /// An API for `K` in this scope.
    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match self {
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
            Scope::All => Api::all(client.clone()),
        }
    }

    /// `namespace NS` or `all namespaces`, for messages.
    fn describe(&self) -> String {
        match self {
            Scope::Namespace(ns) => format!("namespace {ns}"),
            Scope::All => "all namespaces".to_owned(),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = drain_logging::init(&args.log_filter, false) {
        eprintln!("error: {}", drain_logging::error_chain(&e));
        return ExitCode::FAILURE;
    }
    if args.volumes {
        return match fetch_volumes(&args).await {
            Ok(found) if found.is_empty() => {
                eprintln!("No retained volumes found.");
                ExitCode::SUCCESS
            }
            Ok(found) => write_out(&volumes::render(&found, Timestamp::now())),
            Err(e) => {
                eprintln!("error: {}", drain_logging::error_chain(&e));
                ExitCode::FAILURE
            }
        };
    }
    let sets = match fetch(&args).await {
        Ok(sets) => sets,
        Err(e) => {
            eprintln!("error: {}", drain_logging::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let report = view::report(&sets, args.all_namespaces, Timestamp::now());
    if report.rows.is_empty() && report.notes.is_empty() {
        eprintln!("No drain status found.");
        return ExitCode::SUCCESS;
    }
    let mut out = view::render_table(&report.rows, args.all_namespaces);
    if !report.rows.is_empty() && !report.notes.is_empty() {
        out.push('\n');
    }
    for note in &report.notes {
        out.push_str(note);
        out.push('\n');
    }
    write_out(&out)
}

/// Writes `out` to stdout.
fn write_out(out: &str) -> ExitCode {
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("error: failed to write the table: {e}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Reads the sets in scope that carry a drain status, with their namespaces' claims and drain
/// pods.
async fn fetch(args: &Args) -> Result<Vec<SetSnapshot>, FetchError> {
    let client = Client::try_default()
        .await
        .map_err(|e| FetchError::Client(KubeError(e)))?;
    let scope = if args.all_namespaces {
        Scope::All
    } else {
        Scope::Namespace(
            args.namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned()),
        )
    };

    let sets: Vec<StatefulSet> = match (&scope, &args.set) {
        (Scope::Namespace(ns), Some(name)) => {
            let set = scope
                .api::<StatefulSet>(&client)
                .get_opt(name)
                .await
                .map_err(|e| FetchError::GetStatefulSet {
                    namespace: ns.clone(),
                    name: name.clone(),
                    source: KubeError(e),
                })?
                .ok_or_else(|| FetchError::SetNotFound {
                    namespace: ns.clone(),
                    name: name.clone(),
                })?;
            vec![set]
        }
        _ => {
            scope
                .api::<StatefulSet>(&client)
                .list(&ListParams::default())
                .await
                .map_err(|e| FetchError::ListStatefulSets {
                    scope: scope.describe(),
                    source: KubeError(e),
                })?
                .items
        }
    };
    let sets: Vec<StatefulSet> = sets
        .into_iter()
        .filter(|s| s.annotations().contains_key(annotations::STATUS))
        .collect();
    tracing::debug!(sets = sets.len(), "read statefulsets with a drain status");
    if sets.is_empty() {
        return Ok(Vec::new());
    }

    // One list of each kind for the whole scope: metadata only, grouped by namespace.
    let claims = scope
        .api::<PersistentVolumeClaim>(&client)
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| FetchError::ListClaims {
            scope: scope.describe(),
            source: KubeError(e),
        })?;
    let mut claims_by_ns: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for claim in claims.items {
        let (ns, name) = namespace_and_name(&claim.metadata);
        claims_by_ns.entry(ns).or_default().insert(name);
    }

    let pods = scope
        .api::<Pod>(&client)
        .list_metadata(&ListParams::default().labels(labels::DRAIN_POD))
        .await
        .map_err(|e| FetchError::ListDrainPods {
            scope: scope.describe(),
            source: KubeError(e),
        })?;
    let mut pods_by_ns: BTreeMap<String, BTreeMap<String, Timestamp>> = BTreeMap::new();
    for pod in pods.items {
        let Some(created) = pod.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
            continue;
        };
        let (ns, name) = namespace_and_name(&pod.metadata);
        pods_by_ns.entry(ns).or_default().insert(name, created);
    }

    Ok(sets
        .iter()
        .map(|set| {
            let namespace = set.namespace().unwrap_or_default();
            SetSnapshot {
                name: set.name_any(),
                status: set
                    .annotations()
                    .get(annotations::STATUS)
                    .cloned()
                    .unwrap_or_default(),
                claim_templates: set
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.volume_claim_templates.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.metadata.name.clone())
                    .collect(),
                claims: claims_by_ns.get(&namespace).cloned().unwrap_or_default(),
                drain_pods: pods_by_ns.get(&namespace).cloned().unwrap_or_default(),
                namespace,
            }
        })
        .collect())
}

/// The retained volumes in scope (of `args.set` only, if given), by claim namespace and name.
async fn fetch_volumes(args: &Args) -> Result<Vec<volumes::RetainedVolume>, FetchError> {
    let client = Client::try_default()
        .await
        .map_err(|e| FetchError::Client(KubeError(e)))?;
    let namespace = (!args.all_namespaces).then(|| {
        args.namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned())
    });
    let listed = Api::<PersistentVolume>::all(client)
        .list(&ListParams::default().labels(&format!("{}=true", retained::LABEL)))
        .await
        .map_err(|e| FetchError::ListVolumes(KubeError(e)))?;
    let mut found: Vec<volumes::RetainedVolume> = listed
        .items
        .iter()
        .filter_map(volumes::RetainedVolume::of)
        .filter(|v| namespace.as_ref().is_none_or(|ns| *ns == v.namespace))
        .filter(|v| args.set.as_ref().is_none_or(|s| *s == v.set))
        .collect();
    found.sort_by(|a, b| (&a.namespace, &a.claim).cmp(&(&b.namespace, &b.claim)));
    Ok(found)
}

/// An object's namespace and name (empty if unset).
fn namespace_and_name(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn args_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn args_parse_like_kubectl() {
        let a = Args::try_parse_from(["x", "-n", "demo", "web"]).unwrap();
        assert_eq!(
            (a.namespace.as_deref(), a.set.as_deref(), a.all_namespaces),
            (Some("demo"), Some("web"), false)
        );
        let a = Args::try_parse_from(["x", "-A"]).unwrap();
        assert!(a.all_namespaces && a.set.is_none() && a.namespace.is_none());
        let a = Args::try_parse_from(["x", "--all-namespaces", "--namespace", "demo"]).unwrap();
        assert!(a.all_namespaces);
        assert!(Args::try_parse_from(["x", "-A", "web"]).is_err());
        assert!(Args::try_parse_from(["x", "web", "db"]).is_err());
    }

    #[test]
    fn api_errors_read_like_kubectl() {
        let status = kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message:
                r#"statefulsets.apps is forbidden: User "u" cannot list resource "statefulsets""#
                    .into(),
            ..Default::default()
        };
        let e = FetchError::ListStatefulSets {
            scope: Scope::Namespace("demo".into()).describe(),
            source: KubeError(kube::Error::Api(Box::new(status))),
        };
        assert_eq!(
            drain_logging::error_chain(&e),
            r#"failed to list statefulsets in namespace demo: Forbidden: statefulsets.apps is forbidden: User "u" cannot list resource "statefulsets""#
        );
        let e = FetchError::SetNotFound {
            namespace: "demo".into(),
            name: "web".into(),
        };
        assert_eq!(e.to_string(), "statefulset web not found in namespace demo");
    }
}
