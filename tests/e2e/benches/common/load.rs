//! The load of the scale and memory benchmarks: StatefulSets whose pods and claims stay
//! Pending, and their claims and pods made as the StatefulSet controller makes them.

use anyhow::Context;
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use e2e::TestNamespace;
use e2e::objects::{BUSYBOX, drain_template, sleeper};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// The label on every object of the load.
pub const LOAD_LABEL: &str = "stsd-bench=load";
/// A StorageClass that does not exist: the load's claims stay Pending.
pub const NO_CLASS: &str = "stsd-bench-no-such-class";
/// A volume that does not exist, which the load's claims ask for: the volume controller then
/// only looks it up at each sync (the harness syncs every 2 s), where a claim that asks a class
/// with no provisioner costs it a provisioning attempt and an error line each time (at 50,000
/// claims, 2.5 GB of log and most of a core in 12 minutes).
pub const NO_VOLUME: &str = "stsd-bench-no-such-volume";

/// A load set: `replicas` Pending pods (no scheduler takes them: their `schedulerName` names
/// none, so nothing writes their status, which a scheduler throttled to 50 writes/s would take
/// a quarter of an hour to mark unschedulable at 50,000 pods), each with a
/// Pending claim (no such StorageClass); opted in or not. `OnDelete`: the StatefulSet controller
/// makes its missing pods but changes none it finds.
pub fn load_set(name: &str, replicas: i32, opted_in: bool) -> StatefulSet {
    let mut annotations = serde_json::Map::new();
    if opted_in {
        annotations.insert(
            DRAINER_POD_TEMPLATE.to_owned(),
            drain_template("true", &["data"], json!({"restartPolicy": "Never"})).into(),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations, "labels": {"stsd-bench": "load"}},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "stsd-bench": "load"}},
                "spec": {
                    "schedulerName": "stsd-bench-no-scheduler",
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "app",
                        "image": BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", sleeper("true")],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data", "labels": {"stsd-bench": "load"}},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": NO_CLASS,
                         "volumeName": NO_VOLUME, "resources": {"requests": {"storage": "10Mi"}}}
            }],
        }
    }))
    .expect("valid StatefulSet")
}

/// The claim of ordinal `ordinal` of load set `set`, as the StatefulSet controller makes it.
pub fn load_claim(set: &str, ordinal: i32) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": format!("data-{set}-{ordinal}"),
                     "labels": {"stsd-bench": "load", "app": set}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": NO_CLASS,
                 "volumeName": NO_VOLUME, "resources": {"requests": {"storage": "10Mi"}}}
    }))
    .expect("valid PersistentVolumeClaim")
}

/// The pod of ordinal `ordinal` of the load set `set` (UID `uid`), as the StatefulSet
/// controller makes it from the set's template: its identity and storage match, so the
/// controller leaves it as it is.
pub fn load_pod(set: &StatefulSet, uid: &str, ordinal: i32) -> Pod {
    let name = format!("{}-{ordinal}", set.name_any());
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let mut pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        ..Pod::default()
    };
    let labels = pod.metadata.labels.get_or_insert_default();
    labels.insert("statefulset.kubernetes.io/pod-name".into(), name.clone());
    labels.insert("apps.kubernetes.io/pod-index".into(), ordinal.to_string());
    pod.metadata.name = Some(name.clone());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: set.name_any(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let spec = pod.spec.get_or_insert_default();
    spec.hostname = Some(name);
    spec.subdomain = Some(set.name_any());
    spec.volumes =
        Some(vec![serde_json::from_value(json!({
        "name": "data",
        "persistentVolumeClaim": {"claimName": format!("data-{}-{ordinal}", set.name_any())},
    }))
    .expect("a volume")]);
    pod
}

/// How many pods and claims of the load exist in `ns`.
pub async fn load_counts(ns: &TestNamespace) -> anyhow::Result<(usize, usize)> {
    let lp = ListParams::default().labels(LOAD_LABEL);
    let pods = ns.api::<Pod>().list_metadata(&lp).await?.items.len();
    let claims = ns
        .api::<PersistentVolumeClaim>()
        .list_metadata(&lp)
        .await?
        .items
        .len();
    Ok((pods, claims))
}

/// Creates `objects`, `in_flight` requests at a time; one that exists already is fine (the
/// StatefulSet controller may have made a pod first).
pub async fn create_all<K>(api: &Api<K>, objects: Vec<K>, in_flight: usize) -> anyhow::Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move {
                match api.create(&PostParams::default(), &o).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(in_flight)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Makes the pods of the load sets `names` (of `replicas` each) as the StatefulSet controller
/// would ([`load_pod`]): its client is throttled to about 20 requests/s, so 50,000 pods would
/// take it the best part of an hour.
pub async fn make_pods(
    ns: &TestNamespace,
    names: &[String],
    replicas: i32,
    in_flight: usize,
) -> anyhow::Result<()> {
    let sets_api = ns.api::<StatefulSet>();
    let mut pods = Vec::new();
    for s in names {
        let uid = sets_api
            .get_metadata(s)
            .await?
            .uid()
            .context("the set's UID")?;
        let set = load_set(s, replicas, false);
        pods.extend((0..replicas).map(|o| load_pod(&set, &uid, o)));
    }
    create_all(&ns.api::<Pod>(), pods, in_flight).await
}
