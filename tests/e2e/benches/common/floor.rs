//! The floor: a minimal drain controller that this program runs on a twin set, the least any
//! drain controller's reactions cost on this cluster at that instant.
//!
//! It does what the controller's protocol does, and nothing else: on a stateful pod's Deleted
//! event it creates a pod of the same name from the same template, with the pod's claim
//! mounted; on that pod's first event that shows its program finished well
//! ([`super::finished`]) it deletes the claim, then the pod.
//! It reads nothing, checks no proof, records no status and sends no Event. It watches with a
//! client of its own (its own connections, as the controller has), so its events arrive as a
//! separate program's would, and its pods run like drain pods (the same load on the node).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use drain_api::labels::{DRAIN_POD, STATEFUL_POD_NAME};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// The running floor reactor; stops when dropped.
pub struct Floor {
    task: tokio::task::JoinHandle<()>,
}

impl Floor {
    /// Starts reacting to the stateful pods of the set `set` in `namespace`, with a client of
    /// its own, and waits until its watch has listed the namespace. `template` is a drain pod
    /// template's JSON (the annotation's value), `claim` the name of the claim template.
    pub async fn start(namespace: &str, set: &str, template: &str, claim: &str) -> Result<Self> {
        let client = own_client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, namespace);
        let template: Value = serde_json::from_str(template).context("the drain template")?;
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
                        let pod = drain_pod(&template, &set, &p.name_any(), &claim);
                        let api = pods.clone();
                        tokio::spawn(async move {
                            let sent = std::time::Instant::now();
                            let _ = api.create(&PostParams::default(), &pod).await;
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
        Ok(Self { task })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.task.abort();
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

/// The floor's drain pod for the stateful pod `name`: the template, named and labelled as a
/// drain pod, with the pod's hostname and its claim mounted.
fn drain_pod(template: &Value, set: &str, name: &str, claim: &str) -> Pod {
    let mut pod = template.clone();
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["labels"][DRAIN_POD] = json!(set);
    pod["spec"]["hostname"] = json!(name);
    pod["spec"]["volumes"] = json!([{
        "name": claim,
        "persistentVolumeClaim": {"claimName": format!("{claim}-{name}")},
    }]);
    serde_json::from_value(pod).expect("a drain pod from the template")
}
