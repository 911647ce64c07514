//! kubectl and kustomize for the install tests: the shipped overlays, overlays of the test's on
//! top of them (written as a user would), rendering (client side) and the API server's dry run,
//! and what the rendered objects say.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::SystemTime;

use anyhow::{Context, Result, bail, ensure};
use e2e::{kubectl, repo_root};
use serde_json::{Value, json};

/// The name of the controller's objects (and of the leader-election Lease).
pub const NAME: &str = "statefulset-drain-controller";

/// Runs `kubectl args` (with `stdin` piped in); its stdout, or an error with its stderr.
pub fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut cmd = kubectl();
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("run kubectl")?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The objects the kustomization `dir` renders, as written (`kubectl create --dry-run=client`:
/// nothing merged with what the cluster holds).
pub fn render(dir: &Path) -> Result<Vec<Value>> {
    let out = kubectl_ok(
        &[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-k",
            &dir.display().to_string(),
        ],
        None,
    )?;
    serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .context("kubectl create -o json")
}

/// `kubectl apply --dry-run=server -k dir`: the API server validates and admits every object
/// (strict field validation). Returns the objects as it would store them (merged with any
/// existing ones, so only their identity and scope are of use).
pub fn validate(dir: &Path) -> Result<Vec<Value>> {
    let out = kubectl_ok(
        &[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-k",
            &dir.display().to_string(),
        ],
        None,
    )?;
    let list: Value = serde_json::from_str(&out).context("kubectl apply -o json")?;
    list["items"]
        .as_array()
        .cloned()
        .context("a List of the applied objects")
}

/// `artifacts/overlays/<overlay>`.
pub fn overlay_dir(overlay: &str) -> PathBuf {
    repo_root().join("artifacts/overlays").join(overlay)
}

/// The path of `to` relative to the directory `from` (kustomize takes relative paths only).
pub fn relative(from: &Path, to: &Path) -> String {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Writes `dir/kustomization.yaml`.
pub fn write_kustomization(dir: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("kustomization.yaml"), text)
        .with_context(|| format!("write {}", dir.display()))
}

/// An overlay on top of `base` that installs it into `namespace` (the Namespace object renamed,
/// every namespaced object moved, the service accounts in the role bindings too) with `suffix`
/// on every name (cluster-scoped names must not collide with another install's).
pub fn relocated(dir: &Path, base: &Path, namespace: &str, suffix: &str) -> Result<()> {
    write_kustomization(
        dir,
        &format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
nameSuffix: {suffix}
transformers:
  - |-
    apiVersion: builtin
    kind: NamespaceTransformer
    metadata:
      name: install-namespace
      namespace: {namespace}
    setRoleBindingSubjects: allServiceAccounts
    fieldSpecs:
      - path: metadata/name
        kind: Namespace
        create: true
      - path: metadata/namespace
        create: true
"#,
            base = relative(dir, base),
        ),
    )
}

/// The README's overlay for watching another namespace with the single-namespace install: the
/// Role and RoleBinding go into `watched`, and `--namespace` names it.
pub fn watching(dir: &Path, base: &Path, watched: &str) -> Result<()> {
    write_kustomization(
        dir,
        &format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
patches:
  - target: {{kind: Role|RoleBinding, name: statefulset-drain-controller}}
    patch: |-
      - {{op: replace, path: /metadata/namespace, value: {watched}}}
  - target: {{kind: Deployment, name: statefulset-drain-controller}}
    patch: |-
      - {{op: test, path: /spec/template/spec/containers/0/args/1, value: --namespace=default}}
      - {{op: replace, path: /spec/template/spec/containers/0/args/1, value: --namespace={watched}}}
"#,
            base = relative(dir, base),
        ),
    )
}

/// An overlay on top of `base` with the leader-election component.
pub fn with_leader_election(dir: &Path, base: &Path) -> Result<()> {
    write_kustomization(
        dir,
        &format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {}\ncomponents:\n  - {}\n",
            relative(dir, base),
            relative(
                dir,
                &repo_root().join("artifacts/components/leader-election")
            )
        ),
    )
}

/// A scratch directory for kustomizations, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `<tmp>/stsd-<what>-<unique>`.
    pub fn new(what: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("stsd-{what}-{}", unique()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir.canonicalize()?))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A short hex string, unique enough for names in one run.
pub fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:06x}", nanos & 0xffffff)
}

// --- what the rendered objects say ------------------------------------------------------------

/// An object's kind.
pub fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

/// An object's name.
pub fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// The one object of this kind whose name starts so.
pub fn the<'a>(objects: &'a [Value], kind_is: &str, name_starts: &str) -> Result<&'a Value> {
    let of_kind = || objects.iter().filter(|o| kind(o) == kind_is);
    // The exact name if there is one (statefulset-drain-controller, not its -volumes role).
    let mut found: Vec<&Value> = of_kind().filter(|o| name(o) == name_starts).collect();
    if found.is_empty() {
        found = of_kind()
            .filter(|o| name(o).starts_with(name_starts))
            .collect();
    }
    match found.as_slice() {
        [one] => Ok(one),
        _ => bail!("{} {kind_is} {name_starts}* rendered", found.len()),
    }
}

/// The kinds of the objects.
pub fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects.iter().map(|o| kind(o).to_owned()).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// Checks what every install's Deployment has: the image, the admin port with /livez and
/// /readyz probes, requests and limits, POD_NAME and POD_NAMESPACE from the downward API, its
/// service account. Returns the controller's args.
pub fn check_deployment(objects: &[Value]) -> Result<Vec<String>> {
    let deployment = the(objects, "Deployment", NAME)?;
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    ensure!(
        c["image"] == "statefulset-drain/controller:dev",
        "image {}",
        c["image"]
    );
    let args = strings(&c["args"]);
    ensure!(
        args.first().map(String::as_str) == Some("--admin-address=0.0.0.0:8080"),
        "args {args:?}"
    );
    ensure!(
        c["ports"] == json!([{"name": "admin", "containerPort": 8080}]),
        "ports {}",
        c["ports"]
    );
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        ensure!(
            get["path"] == path && get["port"] == "admin",
            "{probe}: {get}"
        );
    }
    let res = &c["resources"];
    ensure!(
        res["requests"]["cpu"].is_string()
            && res["requests"]["memory"].is_string()
            && res["limits"]["memory"].is_string(),
        "requests and limits: {res}"
    );
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        ensure!(
            c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["name"] == var && e["valueFrom"]["fieldRef"]["fieldPath"] == field),
            "env {var} from {field}: {}",
            c["env"]
        );
    }
    let sa = the(objects, "ServiceAccount", NAME)?;
    ensure!(
        pod["serviceAccountName"] == sa["metadata"]["name"],
        "the pods run as the install's service account"
    );
    Ok(args)
}

/// The rules of the controller's (Cluster)Role (not the leader-election one).
pub fn controller_rules<'a>(objects: &'a [Value], role_kind: &str) -> Result<&'a Value> {
    let role = objects
        .iter()
        .find(|o| {
            kind(o) == role_kind
                && name(o).starts_with(NAME)
                && !name(o).contains("leader")
                && !name(o).contains("volumes")
                && !name(o).ends_with("-nodes")
        })
        .with_context(|| format!("no {role_kind}"))?;
    Ok(&role["rules"])
}
