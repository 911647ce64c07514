//! The floor: a minimal drain controller that this program runs on a twin set, the least any
//! drain controller's reactions cost on this cluster at that instant.
//!
//! It does what the controller's protocol does, and nothing else: on a stateful pod's Deleted
//! event it creates the drain pod the controller would create for it (built by the controller's
//! own [`DrainTemplate::pod`] from the same template, so the API server handles the same object:
//! its labels, annotations, owner reference, environment and the claim mounted); on that pod's
//! first event that shows its program finished well ([`super::finished`]) it deletes the claim,
//! then the pod. It reads nothing when it reacts (the set is read once at its start, the claims'
//! UIDs come from a watch), checks no proof, records no status and sends no Event. It watches
//! with a client of its own (its own connections, as the controller has), so its events arrive
//! as a separate program's would, and its pods run like drain pods (the same load on the node).
//!
//! Until 2026-11-28 it created a bare pod (the template with a name, a label, the hostname and
//! the claim): under the benchmark's load the API server took a median 2.6 ms longer over the
//! controller's larger pod than over that one (its audit log, 32 creates a side; admission,
//! validation and storing), part of which was the pod's size counted against the reaction.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use drain_api::annotations::DRAINER_POD_TEMPLATE;
use drain_api::labels::{DRAIN_POD, STATEFUL_POD_NAME};
use drain_api::names;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use statefulset_drain_controller::config::DrainConfig;
use statefulset_drain_controller::identity::FIELD_MANAGER;
use statefulset_drain_controller::template::{DrainPodInput, DrainTemplate, validate};

/// The running floor reactor; stops when dropped.
pub struct Floor {
    task: tokio::task::JoinHandle<()>,
    claim_watch: tokio::task::JoinHandle<()>,
}

impl Floor {
    /// Starts reacting to the stateful pods of the set `set` in `namespace` (which must exist:
    /// it is read once, here), with a client of its own, and waits until its watches (pods and
    /// claims) have listed the namespace. `template` is a drain pod template's JSON (the annotation's value),
    /// `claim` the name of the claim template.
    pub async fn start(namespace: &str, set: &str, template: &str, claim: &str) -> Result<Self> {
        let client = own_client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        let sets: Api<StatefulSet> = Api::namespaced(client, namespace);
        let drain = drain_template(&sets.get(set).await?, template)?;
        // The claims' UIDs, for the drain pod's record of its claims, as the controller's cache
        // has them.
        let (claim_store, writer) = reflector::store();
        let claim_watch = tokio::spawn(
            watcher(claims.clone(), watcher::Config::default())
                .reflect(writer)
                .for_each(|_| async {}),
        );
        tokio::time::timeout(
            std::time::Duration::from_secs(120),
            claim_store.wait_until_ready(),
        )
        .await
        .context("the floor's claim watch listed the namespace")?
        .context("the floor's claim watch ended")?;
        let (synced_tx, synced) = tokio::sync::oneshot::channel();
        let (set, claim) = (set.to_owned(), claim.to_owned());
        let task = tokio::spawn(async move {
            let events = watcher(pods.clone(), watcher::Config::default());
            let mut events = std::pin::pin!(events);
            let mut synced_tx = Some(synced_tx);
            let cleaning = Arc::new(Mutex::new(HashSet::<String>::new()));
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                match event {
                    watcher::Event::InitDone => {
                        if let Some(tx) = synced_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    watcher::Event::Delete(p) if is_stateful_of(&p, &set) => {
                        let Some(ordinal) = names::parse_pod_name(&p.name_any(), &set) else {
                            continue;
                        };
                        let name = drain.claim_name(&claim, ordinal);
                        let uid = claim_store
                            .state()
                            .iter()
                            .find(|c| c.name_any() == name)
                            .and_then(|c| c.uid());
                        if uid.is_none() {
                            eprintln!(
                                "floor: no claim {name} in its watch; the record names no UID"
                            );
                        }
                        let uid = uid.unwrap_or_default();
                        let pod = drain.pod(&DrainPodInput {
                            ordinal,
                            // What a scale-down by one leaves (a burst to 0 leaves 0: a digit
                            // or two more, no other difference); it reads nothing to know more.
                            replicas: ordinal,
                            claims: BTreeMap::from([(claim.clone(), (name, uid))]),
                            avoid_nodes: Vec::new(),
                            revision: None,
                        });
                        let api = pods.clone();
                        tokio::spawn(async move {
                            // The controller's field manager: the same request, byte for byte
                            // but for the UIDs and the replicas.
                            let pp = PostParams {
                                field_manager: Some(FIELD_MANAGER.to_owned()),
                                ..PostParams::default()
                            };
                            let sent = std::time::Instant::now();
                            let _ = api.create(&pp, &pod).await;
                            super::trace_took("floor-create", &pod.name_any(), sent);
                        });
                    }
                    watcher::Event::Apply(p) if is_ours(&p, &set) && super::finished(&p) => {
                        let name = p.name_any();
                        if !cleaning.lock().expect("lock").insert(name.clone()) {
                            continue;
                        }
                        let (pods, claims) = (pods.clone(), claims.clone());
                        let (claim, cleaning) = (format!("{claim}-{name}"), Arc::clone(&cleaning));
                        tokio::spawn(async move {
                            let sent = std::time::Instant::now();
                            let _ = claims.delete(&claim, &DeleteParams::default()).await;
                            super::trace_took("floor-delete", &claim, sent);
                            let _ = pods
                                .delete(&name, &DeleteParams::default().grace_period(0))
                                .await;
                            cleaning.lock().expect("lock").remove(&name);
                        });
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(120), synced)
            .await
            .context("the floor's watch listed the namespace")?
            .context("the floor's watch ended")?;
        Ok(Self { task, claim_watch })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.task.abort();
        self.claim_watch.abort();
    }
}

/// A client of its own (not shared with the program's watches and writes).
async fn own_client() -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(e2e::kubeconfig_path())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(Client::try_from(cfg)?)
}

fn is_stateful_of(p: &Pod, set: &str) -> bool {
    p.labels().contains_key(STATEFUL_POD_NAME)
        && p.owner_references()
            .iter()
            .any(|o| o.kind == "StatefulSet" && o.name == set)
}

fn is_ours(p: &Pod, set: &str) -> bool {
    p.labels().get(DRAIN_POD).map(String::as_str) == Some(set)
}

/// The controller's drain template for `set` with `template` as its annotation (the twin set
/// is not opted in, so the controller leaves it alone).
fn drain_template(set: &StatefulSet, template: &str) -> Result<DrainTemplate> {
    let mut set = set.clone();
    set.annotations_mut()
        .insert(DRAINER_POD_TEMPLATE.to_owned(), template.to_owned());
    let config = DrainConfig::from_set(&set).map_err(|e| anyhow!("the drain settings: {e}"))?;
    validate(&set, &config).map_err(|e| anyhow!("the drain template: {e:?}"))
}
