//! Helpers for the unhappy-path tests: cleanups that run even when a test fails, `kubectl exec`,
//! the drain status annotation, events about a set or its pods, a held "nothing happens" check,
//! an admission policy that denies deleting one claim, and the example datastore.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use datastore::Client as Store;
use drain_api::annotations;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::ops::{T, events};
use crate::{TestNamespace, client, kubectl, repo_root, wait_for};

/// What a [`Finally`] runs: an async step with a client of its own.
type Cleanup = Box<dyn FnOnce(Client) -> BoxFuture<'static, Result<()>> + Send>;

/// A cleanup that runs when dropped, also when the test failed or panicked: with a client and a
/// runtime of its own (drop may run inside the test's runtime). Declare it after the
/// [`TestNamespace`] it cleans up in, so it runs before the namespace is deleted.
pub struct Finally {
    what: String,
    cleanup: Option<Cleanup>,
}

impl Finally {
    /// Runs `cleanup` (named `what` in its error message) on drop.
    pub fn new(
        what: &str,
        cleanup: impl FnOnce(Client) -> BoxFuture<'static, Result<()>> + Send + 'static,
    ) -> Self {
        Self {
            what: what.to_owned(),
            cleanup: Some(Box::new(cleanup)),
        }
    }
}

impl Drop for Finally {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        let what = self.what.clone();
        let outcome = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move { cleanup(client().await).await })
        })
        .join();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleanup {what} failed: {e:#}"),
            Err(_) => eprintln!("cleanup {what} panicked"),
        }
    }
}

/// `Ok` also when the object was already gone.
fn ok_if_gone<T>(r: Result<T, kube::Error>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every finalizer of the StatefulSet `set` when dropped (a set held by a test's
/// finalizer would keep its namespace from ever being deleted).
pub fn release_set_finalizers_on_drop(ns: &TestNamespace, set: &str) -> Finally {
    let (namespace, set) = (ns.name.clone(), set.to_owned());
    Finally::new(&format!("finalizers of statefulset {set}"), move |client| {
        Box::pin(async move {
            let sets: Api<StatefulSet> = Api::namespaced(client, &namespace);
            ok_if_gone(
                sets.patch(
                    &set,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await,
            )
        })
    })
}

/// Runs `sh -c script` in a container of a pod (`kubectl exec`); returns its stdout, or fails
/// with its stderr when it exits non-zero. Dropping the future kills the `kubectl`.
pub async fn exec(ns: &TestNamespace, pod: &str, container: &str, script: &str) -> Result<String> {
    let mut cmd = tokio::process::Command::from(kubectl());
    cmd.args([
        "-n", &ns.name, "exec", pod, "-c", container, "--", "sh", "-c",
    ])
    .arg(script)
    .stdin(std::process::Stdio::null())
    // A caller that gives up on it (a timeout) ends the `kubectl exec` too.
    .kill_on_drop(true);
    let out = cmd.output().await.context("run kubectl exec")?;
    ensure!(
        out.status.success(),
        "kubectl exec {pod} -c {container} -- {script:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Freezes (or thaws) every process of a pod, as a hung node or a stopped VM would: the pod's
/// cgroup in the kubelet's cgroup v1 freezer hierarchy (the local cluster's kubelet uses
/// cgroupfs). Sending `SIGSTOP` from inside the pod cannot do it: a container's main process is
/// PID 1 of its namespace, which ignores signals it has no handler for.
pub async fn freeze_pod(ns: &TestNamespace, pod: &str, frozen: bool) -> Result<()> {
    let uid = uid_of(&ns.api::<Pod>().get(pod).await?);
    ensure!(!uid.is_empty(), "pod {pod} has no UID");
    // The host node's pods are under kubepods, a worker's under its cgroup root (stsd-wK).
    let freezer = Path::new("/sys/fs/cgroup/freezer");
    let mut roots = vec![freezer.join("kubepods")];
    for entry in std::fs::read_dir(freezer)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("stsd-w"))
        {
            roots.push(path.join("kubepods"));
        }
    }
    let name = format!("pod{uid}");
    let dir = roots
        .iter()
        .flat_map(|r| [r.clone(), r.join("besteffort"), r.join("burstable")])
        .map(|d| d.join(&name))
        .find(|d| d.is_dir())
        .with_context(|| format!("no freezer cgroup {name} under {roots:?} for pod {pod}"))?;
    let state = if frozen { "FROZEN" } else { "THAWED" };
    std::fs::write(dir.join("freezer.state"), state)
        .with_context(|| format!("write {state} to {}", dir.display()))?;
    Ok(())
}

/// An object's UID ("" if none).
pub fn uid_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().uid.clone().unwrap_or_default()
}

/// The UID of the StatefulSet `set`.
pub async fn set_uid(ns: &TestNamespace, set: &str) -> Result<String> {
    Ok(uid_of(&ns.api::<StatefulSet>().get(set).await?))
}

/// Whether one of the pod's owner references names this UID.
pub fn owned_by(pod: &Pod, owner_uid: &str) -> bool {
    pod.metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.uid == owner_uid))
}

/// The drain status annotation among a set's `annotations`, parsed (`None` while there is none).
pub fn status_in(annotations: Option<&BTreeMap<String, String>>) -> Result<Option<Value>> {
    annotations
        .and_then(|a| a.get(annotations::STATUS))
        .map(|text| {
            serde_json::from_str(text).with_context(|| format!("status is not JSON: {text}"))
        })
        .transpose()
}

/// The set's drain status annotation, parsed (`None` while there is none).
pub async fn drain_status(ns: &TestNamespace, set: &str) -> Result<Option<Value>> {
    let set = ns.api::<StatefulSet>().get(set).await?;
    status_in(set.metadata.annotations.as_ref())
}

/// The `state` the status reports for an ordinal.
pub fn ordinal_state(status: &Value, ordinal: i32) -> Option<&str> {
    status["ordinals"][ordinal.to_string()]["state"].as_str()
}

/// Waits until the set's status reports `state` for the ordinal; returns the whole status.
pub async fn wait_ordinal_state(
    ns: &TestNamespace,
    set: &str,
    ordinal: i32,
    state: &str,
) -> Result<Value> {
    wait_status_state(set, ordinal, state, || drain_status(ns, set)).await
}

/// Waits until the status `read` returns reports `state` for the ordinal of the set `what`;
/// returns the whole status (the last one read in the error otherwise).
pub async fn wait_status_state<F, Fut>(
    what: &str,
    ordinal: i32,
    state: &str,
    read: F,
) -> Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<Value>>>,
{
    let last = std::sync::Mutex::new(None);
    let (last_ref, read) = (&last, &read);
    let waited = wait_for(
        T,
        &format!("status of {what} with ordinal {ordinal} {state:?}"),
        || async move {
            let status = read().await?;
            let found = status
                .as_ref()
                .is_some_and(|s| ordinal_state(s, ordinal) == Some(state));
            *last_ref.lock().expect("lock") = status;
            Ok(found)
        },
    )
    .await;
    let last = last.into_inner().expect("lock");
    waited.with_context(|| format!("last status: {last:?}"))?;
    last.context("status")
}

/// Waits for at least one Event with this reason about the StatefulSet `set` or one of its pods
/// (`<set>-<ordinal>`); returns their "object: message" lines.
pub async fn wait_set_event(ns: &TestNamespace, set: &str, reason: &str) -> Result<Vec<String>> {
    let about_set = |e: &String| {
        let object = e.split(": ").next().unwrap_or_default();
        object == set
            || object
                .strip_prefix(set)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|o| !o.is_empty() && o.chars().all(|c| c.is_ascii_digit()))
    };
    wait_for(
        T,
        &format!("a {reason} event on {set} or its pods"),
        || async { Ok(events(ns, reason).await?.iter().any(about_set)) },
    )
    .await?;
    Ok(events(ns, reason)
        .await?
        .into_iter()
        .filter(about_set)
        .collect())
}

/// Checks `check` every 200 ms for `hold` (at least 5 s in the tests): proves something does
/// not happen.
pub async fn hold<F, Fut>(hold: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let start = Instant::now();
    while start.elapsed() < hold {
        check()
            .await
            .with_context(|| format!("{what} (after {:?})", start.elapsed()))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Fails unless the claim exists with this UID, Bound and not being deleted.
pub async fn assert_claim_unchanged(ns: &TestNamespace, name: &str, uid: &str) -> Result<()> {
    let claim = ns.api::<PersistentVolumeClaim>().get_opt(name).await?;
    ensure!(
        claim.as_ref().is_some_and(|c| {
            c.metadata.uid.as_deref() == Some(uid)
                && c.metadata.deletion_timestamp.is_none()
                && crate::ops::bound(c)
        }),
        "claim {name} (uid {uid}) was touched: {:?}",
        claim.map(|c| (c.metadata.uid, c.metadata.deletion_timestamp, c.status))
    );
    Ok(())
}

/// Lines of a log file containing `needle` (0 if the file does not exist yet).
pub fn count_log_lines(path: &Path, needle: &str) -> Result<usize> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().filter(|l| l.contains(needle)).count()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// A ValidatingAdmissionPolicy and its binding that deny some requests in one namespace, as an
/// admission policy of a cluster's owner could. Both are deleted when this is dropped.
struct AdmissionDenial {
    name: String,
    client: Client,
    _cleanup: Finally,
}

/// Text in the denial's message, to tell it from other errors.
pub const DENIAL_MARKER: &str = "e2e-denied";

impl AdmissionDenial {
    /// Denies the requests `rules` matches (`matchConstraints.resourceRules`) in the namespace
    /// unless `expression` (CEL) holds, with `message` (which should contain [`DENIAL_MARKER`]).
    /// Named after the namespace and `what`, so tests running at once do not collide.
    async fn create(
        client: &Client,
        ns: &TestNamespace,
        what: &str,
        rules: Value,
        expression: String,
        message: String,
    ) -> Result<Self> {
        let name = format!("{}-deny-{what}", ns.name);
        let cleanup = {
            let name = name.clone();
            Finally::new(&format!("admission policy {name}"), move |client| {
                Box::pin(async move {
                    ok_if_gone(
                        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                            .delete(&name, &DeleteParams::default())
                            .await,
                    )?;
                    ok_if_gone(
                        Api::<ValidatingAdmissionPolicy>::all(client)
                            .delete(&name, &DeleteParams::default())
                            .await,
                    )
                })
            })
        };
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "validations": [{"expression": expression, "message": message}],
            }
        }))?;
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": ns.name},
                    },
                },
            }
        }))?;
        let pp = kube::api::PostParams::default();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&pp, &policy)
            .await
            .with_context(|| format!("create ValidatingAdmissionPolicy {name}"))?;
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&pp, &binding)
            .await
            .with_context(|| format!("create ValidatingAdmissionPolicyBinding {name}"))?;
        Ok(Self {
            name,
            client: client.clone(),
            _cleanup: cleanup,
        })
    }

    /// Waits until the apiserver enforces the policy: `probe` (a dry-run request the policy
    /// denies) fails with the policy's message.
    async fn wait_enforced<F, Fut>(&self, probe: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), kube::Error>>,
    {
        let probe = &probe;
        wait_for(
            T,
            &format!("the admission policy {} enforced", self.name),
            || async move {
                match probe().await {
                    Ok(()) => Ok(false),
                    Err(kube::Error::Api(s)) if s.message.contains(DENIAL_MARKER) => Ok(true),
                    Err(e) => Err(e.into()),
                }
            },
        )
        .await
    }

    /// Lifts the denial: deletes the binding.
    async fn lift(&self) -> Result<()> {
        ok_if_gone(
            Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
                .delete(&self.name, &DeleteParams::default())
                .await,
        )
    }
}

/// An admission policy that denies deleting one claim in one namespace. Removed when this is
/// dropped: otherwise the claim, and so the test's namespace, could never be deleted.
pub struct ClaimDeleteDenial(AdmissionDenial);

impl ClaimDeleteDenial {
    /// Denies `DELETE` of the claim `claim` in the namespace.
    pub async fn create(client: &Client, ns: &TestNamespace, claim: &str) -> Result<Self> {
        AdmissionDenial::create(
            client,
            ns,
            "delete",
            json!([{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["DELETE"], "resources": ["persistentvolumeclaims"],
            }]),
            format!("oldObject.metadata.name != '{claim}'"),
            format!("{DENIAL_MARKER}: deleting claim {claim} is not allowed"),
        )
        .await
        .map(Self)
    }

    /// Waits until the apiserver enforces the policy: a dry-run delete of `claim` (which must
    /// exist) is denied with the policy's message.
    pub async fn wait_enforced(&self, ns: &TestNamespace, claim: &str) -> Result<()> {
        let claims = ns.api::<PersistentVolumeClaim>();
        let claims = &claims;
        self.0
            .wait_enforced(|| async move {
                claims
                    .delete(claim, &DeleteParams::default().dry_run())
                    .await
                    .map(|_| ())
            })
            .await
    }

    /// Lifts the denial.
    pub async fn lift(&self) -> Result<()> {
        self.0.lift().await
    }
}

/// Writes in one namespace that hang: a validating webhook whose endpoint (a listener of this
/// process on 127.0.0.1) accepts connections and never answers, so the API server waits for it
/// for up to `timeoutSeconds` (then lets the write through: `failurePolicy: Ignore`). The
/// webhook goes when this is dropped; the listener with it.
pub struct HangingWrites {
    _cleanup: Finally,
    _listener: std::thread::JoinHandle<()>,
}

impl HangingWrites {
    /// Makes each drain pod create in the namespace hang for `seconds` (at most 30).
    pub async fn drain_pod_creates(
        client: &Client,
        ns: &TestNamespace,
        seconds: u32,
    ) -> Result<Self> {
        let rules = json!([{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["pods"],
        }]);
        let drain_pods = json!({"matchExpressions": [{
            "key": drain_api::labels::DRAIN_POD, "operator": "Exists",
        }]});
        Self::start(client, ns, "drain-pod-creates", rules, drain_pods, seconds).await
    }

    /// Makes each claim delete in the namespace hang for `seconds` (at most 30).
    pub async fn claim_deletes(client: &Client, ns: &TestNamespace, seconds: u32) -> Result<Self> {
        let rules = json!([{
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["DELETE"], "resources": ["persistentvolumeclaims"],
        }]);
        Self::start(client, ns, "claim-deletes", rules, json!({}), seconds).await
    }

    async fn start(
        client: &Client,
        ns: &TestNamespace,
        what: &str,
        rules: serde_json::Value,
        objects: serde_json::Value,
        seconds: u32,
    ) -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let accept = std::thread::spawn(move || {
            // Held open, never read or written: the API server's TLS handshake never ends.
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                held.push(conn);
            }
        });
        let name = format!("{}-hang-{what}", ns.name);
        let cleanup = {
            let name = name.clone();
            Finally::new(&format!("webhook {name}"), move |client| {
                Box::pin(async move {
                    ok_if_gone(
                        Api::<ValidatingWebhookConfiguration>::all(client)
                            .delete(&name, &DeleteParams::default())
                            .await,
                    )
                })
            })
        };
        let webhook: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "hang.e2e.statefulset-drain.local",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/hang")},
                "rules": rules,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
                "objectSelector": objects,
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": seconds.min(30),
            }],
        }))?;
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&Default::default(), &webhook)
            .await?;
        Ok(Self {
            _cleanup: cleanup,
            _listener: accept,
        })
    }
}

/// An admission policy that denies deleting any drain pod (a pod with the drain-pod label) in
/// one namespace. Removed when this is dropped.
pub struct DrainPodDeleteDenial(AdmissionDenial);

impl DrainPodDeleteDenial {
    /// Denies `DELETE` of the pods labelled as drain pods in the namespace.
    pub async fn create(client: &Client, ns: &TestNamespace) -> Result<Self> {
        let label = drain_api::labels::DRAIN_POD;
        AdmissionDenial::create(
            client,
            ns,
            "drain-pod-delete",
            json!([{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["DELETE"], "resources": ["pods"],
            }]),
            format!("!has(oldObject.metadata.labels) || !('{label}' in oldObject.metadata.labels)"),
            format!("{DENIAL_MARKER}: deleting drain pods is not allowed"),
        )
        .await
        .map(Self)
    }

    /// Waits until the apiserver enforces the policy: a dry-run delete of a probe pod labelled
    /// as a drain pod of no set (created here, held unscheduled by a scheduling gate) is denied.
    pub async fn wait_enforced(&self, ns: &TestNamespace) -> Result<()> {
        let pods = ns.api::<Pod>();
        let probe: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "delete-denial-probe",
                "labels": {drain_api::labels::DRAIN_POD: "no-such-set"},
            },
            "spec": {
                "schedulingGates": [{"name": "e2e/probe"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }))?;
        if pods.get_opt("delete-denial-probe").await?.is_none() {
            pods.create(&Default::default(), &probe).await?;
        }
        let pods = &pods;
        self.0
            .wait_enforced(|| async move {
                pods.delete("delete-denial-probe", &DeleteParams::default().dry_run())
                    .await
                    .map(|_| ())
            })
            .await
    }

    /// Lifts the denial.
    pub async fn lift(&self) -> Result<()> {
        self.0.lift().await
    }
}

impl AdmissionDenial {
    /// Denies every change of the annotation `key` on the objects of `resource` (in API group
    /// `group`) in the namespace, and nothing else.
    async fn annotation(
        client: &Client,
        ns: &TestNamespace,
        what: &str,
        (group, resource): (&str, &str),
        key: &str,
        message: String,
    ) -> Result<Self> {
        let value = |obj: &str| {
            format!(
                "(has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations ? {obj}.metadata.annotations['{key}'] : '')"
            )
        };
        Self::create(
            client,
            ns,
            what,
            json!([{
                "apiGroups": [group], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": [resource],
            }]),
            format!("{} == {}", value("object"), value("oldObject")),
            message,
        )
        .await
    }

    /// Waits until the apiserver enforces an [`AdmissionDenial::annotation`] policy: a dry-run
    /// write of `key` on the object `name` of `api` is denied with the policy's message.
    async fn wait_annotation_enforced<K>(&self, api: &Api<K>, name: &str, key: &str) -> Result<()>
    where
        K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
    {
        self.wait_enforced(|| async move {
            let patch = json!({"metadata": {"annotations": {key: "probe"}}});
            api.patch(
                name,
                &kube::api::PatchParams::default().dry_run(),
                &kube::api::Patch::Merge(patch),
            )
            .await
            .map(|_| ())
        })
        .await
    }
}

/// An admission policy that denies every change of the `drain-status` annotation of the
/// StatefulSets in one namespace (the controller's status writes), and nothing else.
pub struct StatusWriteDenial(AdmissionDenial);

impl StatusWriteDenial {
    /// Denies changing the status annotation of any StatefulSet in the namespace.
    pub async fn create(client: &Client, ns: &TestNamespace) -> Result<Self> {
        AdmissionDenial::annotation(
            client,
            ns,
            "status",
            ("apps", "statefulsets"),
            annotations::STATUS,
            format!("{DENIAL_MARKER}: the drain status may not change"),
        )
        .await
        .map(Self)
    }

    /// Waits until the apiserver enforces the policy: a dry-run write of the status annotation
    /// of `set` is denied with the policy's message.
    pub async fn wait_enforced(&self, ns: &TestNamespace, set: &str) -> Result<()> {
        self.0
            .wait_annotation_enforced(&ns.api::<StatefulSet>(), set, annotations::STATUS)
            .await
    }

    /// Lifts the denial.
    pub async fn lift(&self) -> Result<()> {
        self.0.lift().await
    }
}

/// An admission policy that denies every change of the `drain-pod-uid` annotation of the claims
/// in one namespace (the controller's record of a drain pod on its claims), and nothing else.
pub struct ClaimRecordDenial(AdmissionDenial);

impl ClaimRecordDenial {
    /// Denies changing the drain pod record of any claim in the namespace.
    pub async fn create(client: &Client, ns: &TestNamespace) -> Result<Self> {
        AdmissionDenial::annotation(
            client,
            ns,
            "claim-record",
            ("", "persistentvolumeclaims"),
            drain_api::claim_annotations::POD_UID,
            format!("{DENIAL_MARKER}: the drain pod record of a claim may not change"),
        )
        .await
        .map(Self)
    }

    /// Waits until the apiserver enforces the policy: a dry-run write of the record on `claim`
    /// is denied with the policy's message.
    pub async fn wait_enforced(&self, ns: &TestNamespace, claim: &str) -> Result<()> {
        self.0
            .wait_annotation_enforced(
                &ns.api::<PersistentVolumeClaim>(),
                claim,
                drain_api::claim_annotations::POD_UID,
            )
            .await
    }

    /// Lifts the denial.
    pub async fn lift(&self) -> Result<()> {
        self.0.lift().await
    }
}

// --- RBAC -----------------------------------------------------------------------------------

/// The controller's identity as the single-namespace install ships it, in one test namespace: a
/// ServiceAccount with the shipped Role's rules (`artifacts/overlays/single-namespace/rbac.yaml`)
/// and a kubeconfig that acts as it (the admin's credentials, impersonating the account), for
/// [`ControllerProcess::start_with_kubeconfig`](crate::ControllerProcess::start_with_kubeconfig).
/// The account and its Role go with the namespace; the kubeconfig file when this is dropped.
pub struct ControllerIdentity {
    ns: String,
    /// The kubeconfig that acts as the account.
    pub kubeconfig: std::path::PathBuf,
}

/// The ServiceAccount's (and Role's) name, as shipped.
const CONTROLLER_ACCOUNT: &str = "statefulset-drain-controller";

impl ControllerIdentity {
    /// Creates the account, its Role as shipped but with each `(from, to)` text replacement made
    /// in the Role's rules (each `from` must occur), and the kubeconfig.
    pub async fn create(
        client: &Client,
        ns: &TestNamespace,
        edits: &[(&str, &str)],
    ) -> Result<Self> {
        let account: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": CONTROLLER_ACCOUNT}}))?;
        Api::namespaced(client.clone(), &ns.name)
            .create(&Default::default(), &account)
            .await?;
        let identity = Self {
            ns: ns.name.clone(),
            kubeconfig: crate::release_dir()
                .join("e2e-logs")
                .join(format!("kubeconfig-{}.json", ns.name)),
        };
        identity.apply_role(edits)?;
        let mut config = kube::config::Kubeconfig::read_from(crate::kubeconfig_path())?;
        for user in &mut config.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                auth.impersonate = Some(identity.user());
            }
        }
        std::fs::create_dir_all(identity.kubeconfig.parent().context("log dir")?)?;
        std::fs::write(&identity.kubeconfig, serde_json::to_vec(&config)?)?;
        Ok(identity)
    }

    /// The account's user name.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{CONTROLLER_ACCOUNT}", self.ns)
    }

    /// Applies the shipped Role and RoleBinding in the namespace, with `edits` made to the text.
    pub fn apply_role(&self, edits: &[(&str, &str)]) -> Result<()> {
        let mut text = std::fs::read_to_string(
            repo_root().join("artifacts/overlays/single-namespace/rbac.yaml"),
        )?;
        for (from, to) in edits {
            ensure!(text.contains(from), "{from:?} is not in the shipped Role");
            text = text.replacen(from, to, 1);
        }
        let text = text
            .replace("namespace: default", &format!("namespace: {}", self.ns))
            .replace(
                "namespace: statefulset-drain-system",
                &format!("namespace: {}", self.ns),
            );
        kubectl_apply(&text, "the Role")
    }

    /// Waits until the API server's answer to "may the account `verb` `resource`?" is `allowed`
    /// (RBAC changes take effect within moments, not at once).
    pub async fn wait_can(&self, verb: &str, resource: &str, allowed: bool) -> Result<()> {
        let want = if allowed { "yes" } else { "no" };
        wait_for(
            T,
            &format!("{} may {verb} {resource}: {want}", self.user()),
            || async {
                let out = kubectl()
                    .args([
                        "auth",
                        "can-i",
                        verb,
                        resource,
                        "-n",
                        &self.ns,
                        "--as",
                        &self.user(),
                    ])
                    .output()?;
                Ok(String::from_utf8_lossy(&out.stdout).trim() == want)
            },
        )
        .await
    }
}

impl Drop for ControllerIdentity {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

// --- the example datastore ------------------------------------------------------------------

/// The example datastore's StatefulSet name.
pub const DATASTORE: &str = "datastore";

/// Applies the example's manifest in the namespace with each `(from, to)` text replacement made
/// (each `from` must occur), as a user would.
pub fn apply_example(ns: &TestNamespace, edits: &[(&str, &str)]) -> Result<()> {
    let mut text =
        std::fs::read_to_string(repo_root().join("example/datastore/manifests/datastore.yaml"))?;
    for (from, to) in edits {
        ensure!(
            text.contains(from),
            "the example manifest has no {from:?} to edit"
        );
        text = text.replace(from, to);
    }
    kubectl_apply_in(Some(&ns.name), &text, "the example")
}

/// A client of the datastore pod of this ordinal.
pub async fn store_of(ns: &TestNamespace, ordinal: i32) -> Result<Store> {
    let pod = ns
        .api::<Pod>()
        .get(&drain_api::names::pod_name(DATASTORE, ordinal))
        .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).context("pod IP")?;
    Ok(Store::new(&format!("http://{ip}:8080"))?)
}

/// The value the tests store under `key`.
pub fn value_of(key: &str) -> Vec<u8> {
    format!("{key}: {}", "payload ".repeat(key.len() % 7 + 1)).into_bytes()
}

/// Creates the ServiceAccount `account` in the test namespace with the rights the `drainer` needs
/// in a drain pod (as the example's `datastore-drainer` Role: `get` statefulsets; `get`, `list`,
/// `patch` pods), for drain templates that name it.
pub fn grant_drainer_rights(ns: &TestNamespace, account: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {account}, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {account}, namespace: {ns}}}\n\
         rules:\n- {{apiGroups: [apps], resources: [statefulsets], verbs: [get]}}\n\
         - {{apiGroups: [\"\"], resources: [pods], verbs: [get, list, patch]}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {account}, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {account}}}\n\
         subjects: [{{kind: ServiceAccount, name: {account}, namespace: {ns}}}]\n",
        ns = ns.name
    );
    kubectl_apply(&text, "the drainer's rights")
}

/// `kubectl apply` of the manifests in `text` (`what` names them in the error).
pub fn kubectl_apply(text: &str, what: &str) -> Result<()> {
    kubectl_apply_in(None, text, what)
}

/// [`kubectl_apply`] into namespace `ns` (for manifests that name none), or as they say.
pub fn kubectl_apply_in(ns: Option<&str>, text: &str, what: &str) -> Result<()> {
    let mut args = Vec::new();
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    args.extend(["apply", "-f", "-"]);
    let mut child = crate::kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()?;
    child
        .stdin
        .take()
        .context("kubectl stdin")?
        .write_all(text.as_bytes())?;
    ensure!(child.wait()?.success(), "kubectl apply of {what} failed");
    Ok(())
}

/// What the datastore pods of `ordinals` hold (pod name → key → value), read through the API
/// of each.
pub async fn held_by(
    ns: &TestNamespace,
    ordinals: std::ops::Range<i32>,
) -> Result<checker::records::Held> {
    let mut held = checker::records::Held::new();
    for o in ordinals {
        let store = store_of(ns, o).await?;
        let mut records = BTreeMap::new();
        for key in store.list().await? {
            if let Some(value) = store.get(&key).await? {
                records.insert(key, value);
            }
        }
        held.insert(drain_api::names::pod_name(DATASTORE, o), records);
    }
    Ok(held)
}

/// Writes `count` records `rec-NNNN`, record `i` to the pod of ordinal `target(i)`; returns
/// key → value.
pub async fn write_records(
    ns: &TestNamespace,
    count: usize,
    target: impl Fn(usize) -> i32,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut stores = BTreeMap::new();
    let mut placed = Vec::with_capacity(count);
    for i in 0..count {
        let o = target(i);
        if let std::collections::btree_map::Entry::Vacant(slot) = stores.entry(o) {
            slot.insert(store_of(ns, o).await?);
        }
        let key = format!("rec-{i:04}");
        let value = value_of(&key);
        placed.push((o, key, value));
    }
    let stores = &stores;
    futures::stream::iter(placed.iter().map(|(o, k, v)| async move {
        stores[o]
            .put(k, v.clone())
            .await
            .with_context(|| format!("put {k} on pod {o}"))
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>()
    .await?;
    Ok(placed.into_iter().map(|(_, k, v)| (k, v)).collect())
}

/// Every record is readable from at least one of the pods with its exact value (the same
/// record on two pods is allowed, with the same value), and the pods hold no other record.
///
/// The example's rebalance sidecars may be moving records between pods while this looks: a
/// record listed on a pod but gone by the time it is read, or not found in one scan, is looked
/// for again (for up to a minute). A wrong value or an unknown record fails at once.
pub async fn assert_every_record_readable(
    ns: &TestNamespace,
    ordinals: &[i32],
    records: &BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut seen = BTreeSet::new();
        let mut in_transit = Vec::new();
        for &o in ordinals {
            let store = store_of(ns, o).await?;
            for key in store.list().await? {
                let Some(got) = store.get(&key).await? else {
                    in_transit.push(format!("{key} (listed on pod {o}, then gone)"));
                    continue;
                };
                match records.get(&key) {
                    Some(want) if *want == got => {}
                    Some(_) => bail!("record {key} on pod {o} has a different value"),
                    None => bail!("pod {o} holds an unknown record {key}"),
                }
                seen.insert(key);
            }
        }
        let missing: Vec<&String> = records.keys().filter(|k| !seen.contains(*k)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{} of {} records lost, e.g. {:?} (moving when last looked: {:?})",
            missing.len(),
            records.len(),
            missing.iter().take(10).collect::<Vec<_>>(),
            in_transit.iter().take(10).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
