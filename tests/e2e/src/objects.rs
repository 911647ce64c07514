//! Builders for the objects the end-to-end tests create.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};

/// The busybox image the harness imports into the node (`tests/cluster/up`).
pub const BUSYBOX: &str = "statefulset-drain.local/busybox:test";

/// A shell script for a long-running container that exits at once on SIGTERM.
pub fn sleeper(script: &str) -> String {
    format!("trap 'exit 0' TERM; {script}; while true; do sleep 0.2; done")
}

/// A StatefulSet of busybox pods with claim templates, built up step by step.
#[derive(Clone, Debug)]
pub struct SetBuilder {
    name: String,
    replicas: i32,
    claims: Vec<String>,
    annotations: BTreeMap<String, String>,
    parallel: bool,
    ordinals_start: Option<i32>,
    script: String,
    extra_spec: Value,
}

impl SetBuilder {
    /// A set named `name` with 3 replicas, one claim template `data`, and a container that writes
    /// its hostname to `/data/owner` and then sleeps.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            replicas: 3,
            claims: vec!["data".to_owned()],
            annotations: BTreeMap::new(),
            parallel: false,
            ordinals_start: None,
            script: "echo $HOSTNAME > /data/owner".to_owned(),
            extra_spec: json!({}),
        }
    }
    /// Sets `spec.replicas`.
    pub fn replicas(mut self, n: i32) -> Self {
        self.replicas = n;
        self
    }
    /// Replaces the claim templates (each mounted at `/<name>`, the first also at `/data`).
    pub fn claims(mut self, names: &[&str]) -> Self {
        self.claims = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }
    /// Adds an annotation on the StatefulSet.
    pub fn annotation(mut self, key: &str, value: impl Into<String>) -> Self {
        self.annotations.insert(key.to_owned(), value.into());
        self
    }
    /// `podManagementPolicy: Parallel`.
    pub fn parallel(mut self) -> Self {
        self.parallel = true;
        self
    }
    /// `spec.ordinals.start`.
    pub fn ordinals_start(mut self, start: i32) -> Self {
        self.ordinals_start = Some(start);
        self
    }
    /// The shell script the stateful container runs before sleeping.
    pub fn script(mut self, script: &str) -> Self {
        self.script = script.to_owned();
        self
    }
    /// Merges extra fields into `spec` (e.g. a retention policy).
    pub fn spec_extra(mut self, extra: Value) -> Self {
        self.extra_spec = extra;
        self
    }

    /// The StatefulSet.
    pub fn build(&self) -> StatefulSet {
        let mounts: Vec<Value> = self
            .claims
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"name": c, "mountPath": if i == 0 { "/data".to_owned() } else { format!("/{c}") }})
            })
            .collect();
        let templates: Vec<Value> = self
            .claims
            .iter()
            .map(|c| {
                json!({
                    "metadata": {"name": c},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "10Mi"}}}
                })
            })
            .collect();
        let mut spec = json!({
            "replicas": self.replicas,
            "serviceName": self.name,
            "selector": {"matchLabels": {"app": self.name}},
            "podManagementPolicy": if self.parallel { "Parallel" } else { "OrderedReady" },
            "template": {
                "metadata": {"labels": {"app": self.name}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "app",
                        "image": BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", sleeper(&self.script)],
                        "volumeMounts": mounts,
                        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                    }]
                }
            },
            "volumeClaimTemplates": templates,
        });
        if let Some(start) = self.ordinals_start {
            spec["ordinals"] = json!({"start": start});
        }
        if let (Some(s), Some(extra)) = (spec.as_object_mut(), self.extra_spec.as_object()) {
            for (k, v) in extra {
                s.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(json!({
            "metadata": {"name": self.name, "annotations": self.annotations},
            "spec": spec,
        }))
        .expect("valid StatefulSet")
    }

    /// The headless Service the set names.
    pub fn service(&self) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": self.name},
            "spec": {"clusterIP": "None", "selector": {"app": self.name},
                     "ports": [{"port": 80}]}
        }))
        .expect("valid Service")
    }
}

/// A run-to-completion busybox pod that mounts `claim` at `/data` and runs `script`.
pub fn job_pod(name: &str, claim: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        }
    }))
    .expect("valid Pod")
}

/// The last line of a drain script that finished: it writes the completion record the
/// controller hands the drain pod to the termination message (`drain_api::completion`).
pub const WRITE_COMPLETION_RECORD: &str =
    r#"printf '%s' "$DRAIN_COMPLETION_RECORD" > /dev/termination-log"#;

/// A drain pod template (the annotation's JSON) running `script` in busybox with every claim in
/// `claims` mounted (the first at `/data`, the others at `/<name>`). When `script` ends with
/// status 0 (not by `exit`, which a trap on SIGTERM uses to stop early), the container writes
/// the completion record ([`WRITE_COMPLETION_RECORD`]), as every drain that finished must.
pub fn drain_template(script: &str, claims: &[&str], extra_spec: Value) -> String {
    drain_template_without_record(
        &format!("{{ {script}\n}} && {WRITE_COMPLETION_RECORD}"),
        claims,
        extra_spec,
    )
}

/// As [`drain_template`], but the script is run as it is: it writes no completion record unless
/// it does so itself.
pub fn drain_template_without_record(script: &str, claims: &[&str], extra_spec: Value) -> String {
    let mounts: Vec<Value> = claims
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"name": c, "mountPath": if i == 0 { "/data".to_owned() } else { format!("/{c}") }})
        })
        .collect();
    let mut spec = json!({
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "drain", "image": BUSYBOX, "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "volumeMounts": mounts,
        }]
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"metadata": {"labels": {"role": "drain"}}, "spec": spec}).to_string()
}

/// A drain template's JSON (as [`drain_template`] makes it) with `edit` applied to its parsed
/// value: a probe, a second container, a volume.
pub fn edit_template(template: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut t: Value = serde_json::from_str(template).expect("a drain template is JSON");
    edit(&mut t);
    t.to_string()
}
