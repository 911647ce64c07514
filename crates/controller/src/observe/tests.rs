//! Tests of the observe step: what is read from drain pods, claims and sets.

use super::*;

#[test]
fn drain_record_round_trips_through_annotations() {
    let meta = ObjectMeta {
        annotations: Some(BTreeMap::from([
            (claim_annotations::ATTEMPTS.to_owned(), "2".to_owned()),
            (
                claim_annotations::RETRY_AFTER.to_owned(),
                "2026-01-01T00:00:10Z".to_owned(),
            ),
            (claim_annotations::POD_UID.to_owned(), "p".to_owned()),
            (
                claim_annotations::FIRST_ATTEMPT_AT.to_owned(),
                "garbage".to_owned(),
            ),
        ])),
        ..ObjectMeta::default()
    };
    let r = drain_record(&meta);
    assert_eq!(r.attempts, 2);
    assert_eq!(r.retry_after, Some("2026-01-01T00:00:10Z".parse().unwrap()));
    assert_eq!(r.pod_uid.as_deref(), Some("p"));
    assert_eq!(r.first_attempt_at, None);
}

fn succeeded_pod(extra: serde_json::Value) -> DrainPod {
    let mut pod = serde_json::json!({
        "metadata": {"name": "web-2", "uid": "p",
                     "annotations": {(pod_annotations::CLAIMS): r#"{"data-web-2":"u1"}"#}},
        "spec": {"containers": [
                    {"name": "drain", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                    {"name": "side"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}}]},
        "status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "side", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "message": "bye"}}},
            {"name": "drain", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0,
                 "message": "{\"drainCompleted\":{\"claims\":{\"data-web-2\":\"u1\"}}}\n"}}}
        ]}
    });
    json_patch_merge(&mut pod, extra);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    match drain_pod(&pod, 2).kind {
        PodKind::Drain(d) => d,
        _ => unreachable!(),
    }
}

fn json_patch_merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                json_patch_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

#[test]
fn what_a_succeeded_drain_pod_proves_is_read_from_its_messages_conditions_and_probes() {
    let d = succeeded_pod(serde_json::json!({}));
    let data = BTreeMap::from([("data-web-2".to_owned(), "u1".to_owned())]);
    // Each container with the claims it mounts and the record it wrote ("bye" is none).
    assert_eq!(
        d.containers,
        vec![
            DrainContainer {
                name: "drain".to_owned(),
                claims: data.clone(),
                record: Some(data.clone()),
            },
            DrainContainer {
                name: "side".to_owned(),
                claims: BTreeMap::new(),
                record: None,
            },
        ]
    );
    assert_eq!(d.claims, data);
    assert!(!d.disrupted && !d.kill_probes);

    let disrupted = succeeded_pod(serde_json::json!({"status": {"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]}}));
    assert!(disrupted.disrupted);

    let probed = succeeded_pod(serde_json::json!({"spec": {"containers": [
        {"name": "drain", "livenessProbe": {"exec": {"command": ["true"]}}}
    ]}}));
    assert!(probed.kill_probes);
    let readiness_only = succeeded_pod(serde_json::json!({"spec": {"containers": [
        {"name": "drain", "readinessProbe": {"exec": {"command": ["true"]}}}
    ]}}));
    assert!(!readiness_only.kill_probes);
}

#[test]
fn a_record_is_read_only_from_a_container_that_exited_0_in_its_current_run() {
    let record = r#"{"drainCompleted":{"claims":{"data-web-2":"u1"}}}"#;
    let failed = succeeded_pod(serde_json::json!({"status": {"containerStatuses": [
        {"name": "drain", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
         "state": {"terminated": {"exitCode": 1, "message": record}}}
    ]}}));
    assert_eq!(record_of(&failed, "drain"), None);
    let earlier_run = succeeded_pod(serde_json::json!({"status": {"containerStatuses": [
        {"name": "drain", "image": "x", "imageID": "", "ready": false, "restartCount": 1,
         "state": {"terminated": {"exitCode": 0}},
         "lastState": {"terminated": {"exitCode": 0, "message": record}}}
    ]}}));
    assert_eq!(record_of(&earlier_run, "drain"), None);
    let not_a_record = succeeded_pod(serde_json::json!({"status": {"containerStatuses": [
        {"name": "drain", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "message": format!("done\n{record}")}}}
    ]}}));
    assert_eq!(record_of(&not_a_record, "drain"), None);
}

fn record_of<'a>(d: &'a DrainPod, container: &str) -> Option<&'a BTreeMap<String, String>> {
    d.containers
        .iter()
        .find(|c| c.name == container)
        .and_then(|c| c.record.as_ref())
}

#[test]
fn a_container_that_mounts_no_claim_lingers_only_once_every_claims_container_exited_0() {
    let running = serde_json::json!({"running": {"startedAt": "2026-01-01T00:00:10Z"}});
    let exited = serde_json::json!({"terminated": {"exitCode": 0}});
    let status = |name: &str, state: &serde_json::Value| {
        serde_json::json!({"name": name, "image": "x", "imageID": "", "ready": false,
                           "restartCount": 0, "state": state})
    };
    let pod = |data: &serde_json::Value, index: &serde_json::Value| -> DrainPod {
        succeeded_pod(serde_json::json!({
            "metadata": {"annotations": {(pod_annotations::CLAIMS):
                r#"{"data-web-2":"u1","index-web-2":"u2"}"#}},
            "spec": {"containers": [
                {"name": "data", "volumeMounts": [{"name": "data", "mountPath": "/d"}]},
                {"name": "index", "volumeMounts": [{"name": "index", "mountPath": "/i"}]},
                {"name": "proxy"}],
             "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
                {"name": "index", "persistentVolumeClaim": {"claimName": "index-web-2"}}]},
            "status": {"phase": "Running", "containerStatuses": [
                status("data", data), status("index", index), status("proxy", &running)]}
        }))
    };
    // The index container's exit is no reason to call the proxy lingering: data still drains.
    assert!(pod(&running, &exited).lingering.is_empty());
    assert_eq!(pod(&exited, &exited).lingering, vec!["proxy".to_owned()]);
    let both = pod(&exited, &exited);
    assert_eq!(
        both.containers
            .iter()
            .map(|c| c.claims.len())
            .collect::<Vec<_>>(),
        vec![1, 1, 0]
    );
}

#[test]
fn a_crash_looping_drain_pod_has_started_and_is_not_running_until_restarted() {
    let pod = |state: serde_json::Value| -> DrainPod {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-2", "uid": "p"},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "drain", "image": "x", "imageID": "", "ready": false,
                "restartCount": 1, "state": state,
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}
            }]}
        }))
        .unwrap();
        match drain_pod(&pod, 2).kind {
            PodKind::Drain(d) => d,
            _ => unreachable!(),
        }
    };
    let waiting = pod(serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}}));
    assert!(waiting.started && !waiting.running && waiting.restarts == 1);
    let restarted = pod(serde_json::json!({"running": {"startedAt": "2026-01-01T00:00:10Z"}}));
    assert!(restarted.started && restarted.running);
}

#[test]
fn the_settings_a_drain_pod_was_made_under_are_read_strictly() {
    let settings = |value: &str| {
        pod_settings(&ObjectMeta {
            annotations: Some(BTreeMap::from([(
                pod_annotations::SETTINGS.to_owned(),
                value.to_owned(),
            )])),
            ..ObjectMeta::default()
        })
    };
    assert_eq!(
        settings(r#"{"approval":"automatic","successProof":"exit-code"}"#),
        Some(PodSettings {
            manual_approval: false,
            proof: SuccessProof::ExitCode,
            retain_volume_for: None,
        })
    );
    // Anything unclear holds deletes and asks for the record.
    assert_eq!(
        settings(r#"{"approval":"Automatic","successProof":"exit code"}"#),
        Some(PodSettings {
            manual_approval: true,
            proof: SuccessProof::CompletionRecord,
            retain_volume_for: None,
        })
    );
    assert_eq!(
        settings(r#"{"approval":"automatic","retainVolumeForSeconds":3600}"#)
            .and_then(|s| s.retain_volume_for),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        settings(r#"{"approval":"automatic","retainVolumeForSeconds":"1h"}"#)
            .and_then(|s| s.retain_volume_for),
        Some(RETAIN_FALLBACK)
    );
    assert_eq!(settings("not json"), None);
    assert_eq!(pod_settings(&ObjectMeta::default()), None);
}

#[test]
fn a_native_sidecars_restarts_do_not_count_as_the_drains() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-2", "uid": "p"},
        "spec": {
            "initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "drain"}]
        },
        "status": {"phase": "Running",
            "initContainerStatuses": [{
                "name": "proxy", "image": "x", "imageID": "", "ready": false,
                "restartCount": 7, "state": {"waiting": {"reason": "CrashLoopBackOff"}}
            }],
            "containerStatuses": [{
                "name": "drain", "image": "x", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}
            }]}
    }))
    .unwrap();
    let PodKind::Drain(d) = drain_pod(&pod, 2).kind else {
        unreachable!()
    };
    assert_eq!(d.restarts, 0);
    assert!(d.running && d.blocker.is_none());
}

#[test]
fn a_running_native_sidecar_does_not_make_a_crash_looping_drain_running() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-2", "uid": "p"},
        "spec": {
            "initContainers": [{"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "drain"}]
        },
        "status": {"phase": "Running",
            "initContainerStatuses": [{
                "name": "proxy", "image": "x", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}
            }],
            "containerStatuses": [{
                "name": "drain", "image": "x", "imageID": "", "ready": false,
                "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}
            }]}
    }))
    .unwrap();
    let PodKind::Drain(d) = drain_pod(&pod, 2).kind else {
        unreachable!()
    };
    assert!(d.started && !d.running && d.restarts == 2);
}

#[test]
fn failure_reason_names_the_exit_code_or_the_eviction() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "drain", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "reason": "Error"}}
        }]}
    }))
    .unwrap();
    assert_eq!(
        failure_reason(&pod).as_deref(),
        Some("container drain exited with code 3 (Error)")
    );
    let evicted: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}
    }))
    .unwrap();
    assert_eq!(
        failure_reason(&evicted).as_deref(),
        Some("Evicted: low on memory")
    );
    let told: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "drainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "drain failed: 1 entry is not a record\n"}}
        }]}
    }))
    .unwrap();
    assert_eq!(
        failure_reason(&told).as_deref(),
        Some("container drainer exited with code 1 (Error): drain failed: 1 entry is not a record")
    );
    let long: Pod = serde_json::from_value(serde_json::json!({
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "drainer", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": "é".repeat(2000)}}
        }]}
    }))
    .unwrap();
    let reason = failure_reason(&long).unwrap();
    assert!(reason.ends_with('…'));
    assert_eq!(
        reason.chars().filter(|c| *c == 'é').count(),
        FAILURE_MESSAGE_CHARS
    );
}

#[test]
fn a_pod_the_set_controls_is_the_sets_own_whatever_its_labels() {
    let set: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "uid": "set-uid"},
        "spec": {"replicas": 3, "selector": {}, "serviceName": "web", "template": {},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}
    }))
    .unwrap();
    let pod = |controller: bool| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "uid": "p",
                "labels": {(labels::DRAIN_POD): "web", (labels::ORDINAL): "1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "web", "uid": "set-uid", "controller": controller}]}
        }))
        .unwrap()
    };
    let kind = |p: &Pod| snapshot(&set, [], [p], []).pods[0].kind.clone();
    assert!(matches!(kind(&pod(true)), PodKind::Other));
    assert!(matches!(kind(&pod(false)), PodKind::Drain(_)));
}

#[test]
fn a_nodes_health_is_read_from_its_ready_condition_and_its_out_of_service_taint() {
    let node = |ready: serde_json::Value, taints: serde_json::Value| -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": taints},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False"},
                ready,
            ]},
        }))
        .unwrap()
    };
    let lost = node(
        serde_json::json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastTransitionTime": "2026-12-07T21:00:00Z"}),
        serde_json::json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
    );
    assert_eq!(
        node_health(Some(&lost)),
        NodeHealth::NotReady {
            since: Some("2026-12-07T21:00:00Z".parse().unwrap()),
            why: "Unknown: NodeStatusUnknown: Kubelet stopped posting node status.".to_owned(),
            out_of_service: false,
        }
    );
    let declared = node(
        serde_json::json!({"type": "Ready", "status": "False"}),
        serde_json::json!([{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
            "effect": "NoExecute"}]),
    );
    assert!(matches!(
        node_health(Some(&declared)),
        NodeHealth::NotReady { out_of_service: true, ref why, since: None } if why == "False"
    ));
    let ready = node(
        serde_json::json!({"type": "Ready", "status": "True"}),
        serde_json::json!(null),
    );
    assert_eq!(node_health(Some(&ready)), NodeHealth::Ready { since: None });
    // Just registered, no Ready condition yet: not taken as lost.
    let new: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n2"}})).unwrap();
    assert_eq!(node_health(Some(&new)), NodeHealth::Ready { since: None });
    assert_eq!(node_health(None), NodeHealth::Gone);
}

#[test]
fn a_drain_pod_says_its_node_and_whether_it_is_ready() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-2", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": [{"name": "drain"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]},
    }))
    .unwrap();
    let PodKind::Drain(d) = drain_pod(&pod, 2).kind else {
        unreachable!()
    };
    assert_eq!((d.node.as_deref(), d.ready), (Some("n1"), false));
    let mut ready = pod.clone();
    ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".to_owned();
    ready.spec.as_mut().unwrap().node_name = None;
    let PodKind::Drain(d) = drain_pod(&ready, 2).kind else {
        unreachable!()
    };
    assert_eq!((d.node, d.ready), (None, true));
}

#[test]
fn nodes_are_read_for_drain_pods_that_started_and_are_not_ready_or_outlive_their_grace() {
    let pod = |started: bool, ready: bool, due: Option<&str>| -> PodObs {
        let mut p = drain_pod(
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-2", "uid": "u"},
                "spec": {"nodeName": "n1", "containers": [{"name": "drain"}]},
                "status": {"phase": "Running"},
            }))
            .unwrap(),
            2,
        );
        let PodKind::Drain(d) = &mut p.kind else {
            unreachable!()
        };
        (d.started, d.ready) = (started, ready);
        p.deletion = due.map(|t| Deletion {
            due: Some(t.parse().unwrap()),
            ..Deletion::default()
        });
        p.terminating = due.is_some();
        p
    };
    let now: Timestamp = "2026-12-07T21:00:00Z".parse().unwrap();
    let read = |p: PodObs| {
        let snap = Snapshot {
            pods: vec![p],
            ..Snapshot::default()
        };
        !nodes_to_read(&snap, now).is_empty()
    };
    assert!(
        read(pod(true, false, None)),
        "running, not ready: its node may be lost"
    );
    assert!(!read(pod(true, true, None)), "running and ready");
    assert!(!read(pod(false, false, None)), "still starting");
    assert!(
        !read(pod(false, false, Some("2026-12-07T21:00:30Z"))),
        "stopping in its grace period"
    );
    assert!(
        read(pod(false, false, Some("2026-12-07T20:59:30Z"))),
        "past its grace period"
    );
}
