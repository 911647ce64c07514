//! Observe: one StatefulSet's snapshot (its claims, the pods holding its pod names, the drain
//! records on its claims) built from cached objects. Pure conversions; the caches are read by
//! the caller.

use std::collections::BTreeMap;
use std::time::Duration;

use drain_api::completion::CompletionRecord;
use drain_api::{annotations, claim_annotations, labels, pod_annotations};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::claim_use::claims_used;
use crate::config::SuccessProof;
use crate::plan::{
    Blocker, Claim, Deletion, DrainContainer, DrainPhase, DrainPod, DrainProgress, DrainRecord,
    NodeHealth, PodKind, PodObs, PodSettings, RETAIN_FALLBACK, Snapshot,
};
use crate::status::StatusReport;

pub use drain_api::names::{claim_set_candidates, parse_claim_name, parse_pod_name};

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The drain record kept in a claim's annotations; unparseable values read as absent.
pub fn drain_record(meta: &ObjectMeta) -> DrainRecord {
    let time = |k| annotation(meta, k).and_then(|v| v.parse::<Timestamp>().ok());
    DrainRecord {
        attempts: annotation(meta, claim_annotations::ATTEMPTS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        first_attempt_at: time(claim_annotations::FIRST_ATTEMPT_AT),
        retry_after: time(claim_annotations::RETRY_AFTER),
        last_failure: annotation(meta, claim_annotations::LAST_FAILURE).map(str::to_owned),
        pod_uid: annotation(meta, claim_annotations::POD_UID).map(str::to_owned),
        counted_pod_uid: annotation(meta, claim_annotations::COUNTED_POD_UID).map(str::to_owned),
        template_hash: annotation(meta, claim_annotations::TEMPLATE_HASH).map(str::to_owned),
        returned_at: time(claim_annotations::RETURNED_AT),
        approved: annotation(meta, claim_annotations::APPROVED).map(str::trim) == Some("true"),
        succeeded_pod_uid: annotation(meta, claim_annotations::SUCCEEDED_POD_UID)
            .map(str::to_owned),
        held: annotation(meta, claim_annotations::HOLD).is_some(),
        lost_nodes: annotation(meta, claim_annotations::LOST_NODES)
            .map(|v| {
                let nodes: std::collections::BTreeSet<&str> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                nodes.into_iter().map(str::to_owned).collect()
            })
            .unwrap_or_default(),
        fence_node: annotation(meta, claim_annotations::FENCE_NODE)
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned),
    }
}

/// A claim of the set, if `meta` names one.
pub fn claim(meta: &ObjectMeta, set: &str, templates: &[String]) -> Option<Claim> {
    let name = meta.name.as_deref()?;
    let (template, ordinal) = parse_claim_name(name, set, templates)?;
    Some(Claim {
        name: name.to_owned(),
        uid: meta.uid.clone().unwrap_or_default(),
        template: template.to_owned(),
        ordinal,
        terminating: meta.deletion_timestamp.is_some(),
        record: drain_record(meta),
    })
}

/// Whether `meta` is labelled as a drain pod of a set named `set`.
pub fn labelled_drain_pod_of(meta: &ObjectMeta, set: &str) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(labels::DRAIN_POD))
        .map(String::as_str)
        == Some(set)
}

/// Whether `pod` is a drain pod this controller made for the set with this name and UID: owned
/// by the set but not as its controller (a pod the set controls is the set's own, whatever its
/// labels say).
pub fn is_drain_pod_of(meta: &ObjectMeta, set: &str, set_uid: &str) -> bool {
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "StatefulSet" && o.uid == set_uid);
    labelled_drain_pod_of(meta, set) && owned && !controlled_by(meta, set_uid)
}

/// Whether the object with UID `uid` is the controller of `meta`'s object.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

/// Most characters of a failed container's termination message quoted in its failure reason.
pub const FAILURE_MESSAGE_CHARS: usize = 600;

/// Why a drain pod failed, in a few words: the pod's reason (e.g. Evicted) or the first
/// container that exited non-zero (now or on its last run), with the start of its termination
/// message (the `drainer` writes its error there).
pub fn failure_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(reason) = &status.reason {
        let message = status.message.as_deref().unwrap_or("");
        return Some(
            format!("{reason}: {message}")
                .trim_end_matches([':', ' '])
                .to_owned(),
        );
    }
    container_statuses(pod).find_map(|c| {
        let term = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .filter(|t| t.exit_code != 0)
            .or_else(|| c.last_state.as_ref()?.terminated.as_ref())?;
        (term.exit_code != 0).then(|| {
            let message = term
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(|m| match m.char_indices().nth(FAILURE_MESSAGE_CHARS) {
                    Some((cut, _)) => format!(": {}…", &m[..cut]),
                    None => format!(": {m}"),
                })
                .unwrap_or_default();
            format!(
                "container {} exited with code {}{}{message}",
                c.name,
                term.exit_code,
                term.reason
                    .as_ref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )
        })
    })
}

fn container_statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    pod.status.iter().flat_map(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
    })
}

fn phase(pod: &Pod) -> DrainPhase {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => DrainPhase::Running,
        Some("Succeeded") => DrainPhase::Succeeded,
        Some("Failed") => DrainPhase::Failed,
        Some("Unknown") => DrainPhase::Unknown,
        _ => DrainPhase::Pending,
    }
}

/// Waiting reasons that mean a container cannot start; the first two cannot go away by
/// themselves.
const DEFINITIVE_WAITING: [&str; 2] = ["ErrImageNeverPull", "InvalidImageName"];
const BLOCKING_WAITING: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "ContainerCannotRun",
    "PreCreateHookError",
];

fn to_timestamp(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Timestamp {
    t.0
}

/// Why the pod cannot start, from its container waiting reasons or its scheduling condition.
fn blocker(pod: &Pod) -> Option<Blocker> {
    let waiting = container_statuses(pod).find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.as_deref()?;
        let definitive = DEFINITIVE_WAITING.contains(&reason);
        (definitive || BLOCKING_WAITING.contains(&reason)).then(|| Blocker {
            reason: reason.to_owned(),
            message: w.message.clone().unwrap_or_default(),
            definitive,
        })
    });
    waiting.or_else(|| {
        let cond = pod
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        Some(Blocker {
            reason: cond
                .reason
                .clone()
                .unwrap_or_else(|| "Unschedulable".to_owned()),
            message: cond.message.clone().unwrap_or_default(),
            definitive: false,
        })
    })
}

/// When every container finished (the latest finish), if each reports a finish time.
fn finished_at(pod: &Pod) -> Option<Timestamp> {
    let mut latest: Option<Timestamp> = None;
    let mut any = false;
    for c in pod.status.as_ref()?.container_statuses.iter().flatten() {
        any = true;
        let t = to_timestamp(
            c.state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()?,
        );
        latest = Some(latest.map_or(t, |l| l.max(t)));
    }
    latest.filter(|_| any)
}

/// The latest time a container (init containers too) started or finished, now or in its last
/// run.
fn changed_at(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .flat_map(|c| [c.state.as_ref(), c.last_state.as_ref()])
        .flatten()
        .flat_map(|s| {
            [
                s.running.as_ref().and_then(|r| r.started_at.as_ref()),
                s.terminated.as_ref().and_then(|t| t.finished_at.as_ref()),
            ]
        })
        .flatten()
        .map(to_timestamp)
        .max()
}

/// The regular containers of the pod (its spec's `containers`), each with the claims of
/// `claims` it uses and the completion record it wrote, if it exited 0 with one.
fn containers(pod: &Pod, claims: &BTreeMap<String, String>) -> Vec<DrainContainer> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .map(|c| {
            let record = container_statuses(pod)
                .find(|s| s.name == c.name)
                .and_then(|s| {
                    let t = s.state.as_ref()?.terminated.as_ref()?;
                    if t.exit_code != 0 {
                        return None;
                    }
                    CompletionRecord::parse(t.message.as_deref()?).map(|r| r.claims)
                });
            DrainContainer {
                name: c.name.clone(),
                claims: claims_used(spec, c, claims),
                record,
            }
        })
        .collect()
}

/// The settings the pod was made under, if it records them.
fn pod_settings(meta: &ObjectMeta) -> Option<PodSettings> {
    let value: serde_json::Value =
        serde_json::from_str(annotation(meta, pod_annotations::SETTINGS)?).ok()?;
    Some(PodSettings {
        // Anything but an explicit `automatic` holds deletes for approval.
        manual_approval: value.get("approval").and_then(|v| v.as_str()) != Some("automatic"),
        // Anything but an explicit `exit-code` asks for the record.
        proof: match value.get("successProof").and_then(|v| v.as_str()) {
            Some("exit-code") => SuccessProof::ExitCode,
            _ => SuccessProof::CompletionRecord,
        },
        // A value that is there but unclear still retains, for the fallback time.
        retain_volume_for: value.get("retainVolumeForSeconds").map(|v| {
            v.as_u64()
                .filter(|&s| s > 0)
                .map_or(RETAIN_FALLBACK, Duration::from_secs)
        }),
    })
}

/// The regular containers that use no claim (a mesh proxy, a log shipper) still running after
/// every container that uses one exited 0: they keep the pod from ending.
fn lingering(pod: &Pod, containers: &[DrainContainer]) -> Vec<String> {
    let exited_0 = |name: &str| {
        container_statuses(pod).any(|s| {
            s.name == name
                && s.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
        })
    };
    let mut draining = containers
        .iter()
        .filter(|c| !c.claims.is_empty())
        .peekable();
    if draining.peek().is_none() || !draining.all(|c| exited_0(&c.name)) {
        return Vec::new();
    }
    containers
        .iter()
        .filter(|c| c.claims.is_empty())
        .filter(|c| {
            container_statuses(pod)
                .any(|s| s.name == c.name && s.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
        .map(|c| c.name.clone())
        .collect()
}

/// Whether the pod has a `DisruptionTarget` condition: something asked it to stop (an
/// eviction, a preemption, its node shutting down).
fn disrupted(pod: &Pod) -> bool {
    condition(pod, "DisruptionTarget")
}

/// Whether the pod's condition `type_` is true.
fn condition(pod: &Pod, type_: &str) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The health of a node, from the live read of its name (`None`: no such Node).
pub fn node_health(node: Option<&Node>) -> NodeHealth {
    let Some(node) = node else {
        return NodeHealth::Gone;
    };
    let ready = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "Ready");
    let since = ready.and_then(|c| c.last_transition_time.as_ref().map(to_timestamp));
    let Some(ready) = ready.filter(|c| c.status != "True") else {
        return NodeHealth::Ready { since };
    };
    let why = [
        Some(ready.status.as_str()),
        ready.reason.as_deref(),
        ready.message.as_deref(),
    ]
    .into_iter()
    .flatten()
    .map(str::trim)
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>()
    .join(": ");
    NodeHealth::NotReady {
        since,
        why,
        out_of_service: node
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .any(|t| t.key == crate::plan::OUT_OF_SERVICE),
    }
}

/// The pods other than drain pods still being deleted after their grace period (`now` is past
/// their deletion timestamp): their node is read live, to tell one stuck on a lost node.
pub fn pods_to_locate(snap: &mut Snapshot, now: Timestamp) -> impl Iterator<Item = &mut PodObs> {
    snap.pods.iter_mut().filter(move |p| {
        matches!(p.kind, PodKind::Other)
            && p.deletion
                .as_ref()
                .and_then(|d| d.due)
                .is_some_and(|due| due <= now)
    })
}

/// The nodes the planner judges by ([`NodeHealth`], read live): the node of each drain pod,
/// not finished, that started and is not ready, or is still being deleted after its grace
/// period (the node lifecycle controller makes every pod of a node that stops answering not
/// ready, so a lost node shows there first; a pod starting up or stopping in time is not read
/// for), the node of each other pod located by [`pods_to_locate`], and each node an
/// ordinal's claims are fenced by.
pub fn nodes_to_read(snap: &Snapshot, now: Timestamp) -> std::collections::BTreeSet<String> {
    let past_grace = |p: &PodObs| {
        (p.deletion.as_ref())
            .and_then(|d| d.due)
            .is_some_and(|due| due <= now)
    };
    let pods = snap.pods.iter().filter_map(|p| match &p.kind {
        PodKind::Drain(d)
            if ((d.started && !d.ready) || past_grace(p))
                && !matches!(d.phase, DrainPhase::Succeeded | DrainPhase::Failed) =>
        {
            d.node.clone()
        }
        PodKind::Other => p.deletion.as_ref()?.node.clone(),
        _ => None,
    });
    let fences = snap
        .claims
        .iter()
        .filter_map(|c| c.record.fence_node.clone());
    pods.chain(fences).collect()
}

/// Whether a regular container has a liveness or startup probe.
fn kill_probes(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .any(|c| c.liveness_probe.is_some() || c.startup_probe.is_some())
}

/// The latest time any of the pod's containers started running, if one did.
fn started_at(pod: &Pod) -> Option<Timestamp> {
    container_statuses(pod)
        .filter_map(|c| {
            let state = c.state.as_ref()?;
            let started = state
                .running
                .as_ref()
                .and_then(|r| r.started_at.as_ref())
                .or_else(|| {
                    state
                        .terminated
                        .as_ref()
                        .and_then(|t| t.started_at.as_ref())
                })?;
            Some(to_timestamp(started))
        })
        .max()
}

/// A drain pod, as the planner sees it.
pub fn drain_pod(pod: &Pod, ordinal: i32) -> PodObs {
    let meta = &pod.metadata;
    let claims = annotation(meta, pod_annotations::CLAIMS)
        .and_then(|v| serde_json::from_str::<BTreeMap<String, String>>(v).ok())
        .unwrap_or_default();
    let phase = phase(pod);
    // `deletionTimestamp − deletionGracePeriodSeconds` is when the deletion was asked for, as
    // long as the grace period is positive. Once the pod is terminal the API server rewrites
    // both (grace 0, timestamp = the kubelet's final delete), so a zero grace period carries
    // no request time: it is taken as the earliest possible, which nothing finished before.
    let delete_requested_at = meta.deletion_timestamp.as_ref().map(|t| {
        match meta.deletion_grace_period_seconds.filter(|g| *g > 0) {
            Some(grace) => to_timestamp(t)
                .checked_sub(jiff::SignedDuration::from_secs(grace))
                .unwrap_or(Timestamp::MIN),
            None => Timestamp::MIN,
        }
    });
    let started = container_statuses(pod).any(|c| {
        c.restart_count > 0
            || c.last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
            || c.state
                .as_ref()
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    });
    // A native sidecar (an init container with `restartPolicy: Always`) runs beside the drain,
    // so it does not make the drain running.
    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let running = container_statuses(pod).any(|c| {
        !sidecars.contains(&c.name.as_str())
            && c.state.as_ref().is_some_and(|s| s.running.is_some())
    });
    // A native sidecar's restarts (a proxy, a log shipper) say nothing of the drain's health.
    let restarts = container_statuses(pod)
        .filter(|c| !sidecars.contains(&c.name.as_str()))
        .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
        .max()
        .unwrap_or(0);
    let containers = containers(pod, &claims);
    PodObs {
        ordinal,
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        terminating: meta.deletion_timestamp.is_some(),
        deletion: deletion(meta, pod.spec.as_ref().and_then(|s| s.node_name.clone())),
        kind: PodKind::Drain(DrainPod {
            lingering: lingering(pod, &containers),
            phase,
            claims,
            containers,
            failure: (phase == DrainPhase::Failed || restarts > 0)
                .then(|| failure_reason(pod))
                .flatten(),
            template_hash: annotation(meta, pod_annotations::TEMPLATE_HASH).map(str::to_owned),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            created_at: meta.creation_timestamp.as_ref().map(to_timestamp),
            delete_requested_at,
            finished_at: finished_at(pod),
            changed_at: changed_at(pod),
            disrupted: disrupted(pod),
            kill_probes: kill_probes(pod),
            settings: pod_settings(meta),
            started,
            running,
            restarts,
            blocker: blocker(pod),
            started_at: started_at(pod),
            progress: annotation(meta, pod_annotations::PROGRESS).and_then(DrainProgress::parse),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            ready: condition(pod, "Ready"),
        }),
    }
}

/// Any other pod holding a set's pod name (its stateful pod, usually).
pub fn other_pod(meta: &ObjectMeta, ordinal: i32) -> PodObs {
    PodObs {
        ordinal,
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        terminating: meta.deletion_timestamp.is_some(),
        deletion: deletion(meta, None),
        kind: PodKind::Other,
    }
}

/// What holds a pod being deleted, if it is.
fn deletion(meta: &ObjectMeta, node: Option<String>) -> Option<Deletion> {
    let due = meta.deletion_timestamp.as_ref()?;
    Some(Deletion {
        due: Some(to_timestamp(due)),
        finalizers: meta.finalizers.clone().unwrap_or_default(),
        node,
    })
}

/// The set's claim template names.
pub fn claim_templates(set: &StatefulSet) -> Vec<String> {
    set.spec
        .iter()
        .flat_map(|s| s.volume_claim_templates.iter().flatten())
        .filter_map(|c| c.metadata.name.clone())
        .collect()
}

/// The set's snapshot from its claims' metadata, the drain pods and the other pods holding its
/// pod names (already narrowed to the set's namespace by the caller).
pub fn snapshot<'a>(
    set: &StatefulSet,
    claims: impl IntoIterator<Item = &'a ObjectMeta>,
    drain_pods: impl IntoIterator<Item = &'a Pod>,
    other_pods: impl IntoIterator<Item = &'a ObjectMeta>,
) -> Snapshot {
    let name = set.metadata.name.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let spec = set.spec.as_ref();
    let templates = claim_templates(set);
    let mut pods: Vec<PodObs> = Vec::new();
    for pod in drain_pods {
        let Some(pod_name) = pod.metadata.name.as_deref() else {
            continue;
        };
        let Some(o) = parse_pod_name(pod_name, &name) else {
            continue;
        };
        if is_drain_pod_of(&pod.metadata, &name, &uid) {
            pods.push(drain_pod(pod, o));
        } else if controlled_by(&pod.metadata, &uid) {
            // The set's own pod, whatever its labels say.
            pods.push(other_pod(&pod.metadata, o));
        } else if labelled_drain_pod_of(&pod.metadata, &name) {
            let mut foreign = other_pod(&pod.metadata, o);
            foreign.kind = PodKind::Foreign;
            pods.push(foreign);
        }
    }
    for meta in other_pods {
        let Some(pod_name) = meta.name.as_deref() else {
            continue;
        };
        if let Some(o) = parse_pod_name(pod_name, &name)
            && !pods.iter().any(|p| p.name == pod_name)
        {
            pods.push(other_pod(meta, o));
        }
    }
    pods.sort_by_key(|p| p.ordinal);
    let mut claims: Vec<Claim> = claims
        .into_iter()
        .filter_map(|m| claim(m, &name, &templates))
        .collect();
    claims.sort_by(|a, b| (a.ordinal, &a.name).cmp(&(b.ordinal, &b.name)));
    let previous = annotation(&set.metadata, annotations::STATUS)
        .and_then(StatusReport::parse)
        .map(|r| r.states())
        .unwrap_or_default();
    Snapshot {
        set_name: name,
        replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
        ordinals_start: spec
            .and_then(|s| s.ordinals.as_ref())
            .and_then(|o| o.start)
            .unwrap_or(0),
        reserved: Default::default(),
        also_held: None,
        claim_templates: templates,
        claims,
        pods,
        previous,
        nodes: Default::default(),
    }
}

#[cfg(test)]
mod tests;
