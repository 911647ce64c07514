//! Filling in the pods and claims of a set that came to concern us after the pod and claim
//! watches listed ([`crate::runtime::interest`]): they were not kept, so they are listed for it
//! and merged into the caches ([`Cache::merge`]), and the set is planned once they are in.
//!
//! Sets that come to concern us together are filled together, one list of each kind per
//! namespace. A list that fails is tried again with backoff; the set is not planned until its
//! fill is done (nothing is drained or deleted from a partial picture).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use drain_api::labels;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::Client;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::runtime::interest::Interest;
use crate::runtime::meta_cache::{Cache, ClaimEntry, PodEntry};
use crate::runtime::metrics::Metrics;
use crate::runtime::watch::SetKey;

/// Objects per page of a fill's lists (as the watches', [`super::watches::LIST_PAGE`]).
const PAGE: u32 = super::watches::LIST_PAGE;

/// What a fill needs: the client, the caches to fill, the interest to mark, and the metrics.
pub(super) struct Filler {
    pub(super) client: Client,
    pub(super) interest: Arc<Interest>,
    pub(super) pods: Cache<PodEntry>,
    pub(super) claims: Cache<ClaimEntry>,
    pub(super) metrics: Arc<Metrics>,
}

/// Lists every page of `api` with `params`, metadata only.
async fn list_all<K>(
    api: &Api<K>,
    params: ListParams,
) -> Result<Vec<PartialObjectMeta<K>>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page = api.list_metadata(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

impl Filler {
    /// Fills the sets `sets` of `namespace` (each with the generation of its entry, taken
    /// before): begins a fill on both caches (deletions are remembered from now on), lists the
    /// namespace's stateful pods and claims, merges them, and marks each set filled if it is
    /// still the entry the fill was begun for. Returns the sets marked.
    async fn fill(
        &self,
        namespace: &str,
        sets: &BTreeMap<String, u64>,
    ) -> Result<Vec<String>, kube::Error> {
        self.pods.begin_fill();
        self.claims.begin_fill();
        let listed = async {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), namespace);
            let p = list_all(
                &pods,
                ListParams::default().labels(labels::STATEFUL_POD_NAME),
            )
            .await;
            self.metrics.request("list", "pods", &p);
            let c = list_all(&claims, ListParams::default()).await;
            self.metrics.request("list", "persistentvolumeclaims", &c);
            Ok::<_, kube::Error>((p?, c?))
        }
        .await;
        let merged =
            listed.map(|(pods, claims)| (self.pods.merge(pods), self.claims.merge(claims)));
        self.pods.end_fill();
        self.claims.end_fill();
        let (pods, claims) = merged?;
        let marked: Vec<String> = sets
            .iter()
            .filter(|(set, generation)| self.interest.filled(namespace, set, **generation))
            .map(|(set, _)| set.clone())
            .collect();
        info!(
            namespace,
            sets = ?marked,
            pods,
            claims,
            "pods and claims of sets that came to concern us listed and cached"
        );
        Ok(marked)
    }

    /// Fills the sets received on `requests`, each batch of them together by namespace; each
    /// filled set is passed to `trigger` (to be planned), which says whether it found the set
    /// in its cache: one it did not (the sets' watch is relisting and has not stored it yet)
    /// is passed again every second while it concerns us. Runs until `requests` closes.
    pub(super) async fn run(
        self,
        mut requests: mpsc::UnboundedReceiver<SetKey>,
        trigger: impl Fn(&str, &str) -> bool,
    ) {
        let mut pending: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut untriggered: BTreeSet<SetKey> = BTreeSet::new();
        let mut backoff = None;
        loop {
            untriggered.retain(|(ns, set)| self.interest.ready(ns, set) && !trigger(ns, set));
            if pending.is_empty() {
                let next = if untriggered.is_empty() {
                    requests.recv().await
                } else {
                    match tokio::time::timeout(Duration::from_secs(1), requests.recv()).await {
                        Ok(next) => next,
                        Err(_) => continue,
                    }
                };
                let Some((ns, set)) = next else {
                    return;
                };
                pending.entry(ns).or_default().insert(set);
            }
            while let Ok((ns, set)) = requests.try_recv() {
                pending.entry(ns).or_default().insert(set);
            }
            let mut failed = BTreeMap::new();
            for (ns, sets) in std::mem::take(&mut pending) {
                // A set that stopped concerning us meanwhile needs nothing.
                let generations: BTreeMap<String, u64> = sets
                    .iter()
                    .filter_map(|s| Some((s.clone(), self.interest.generation(&ns, s)?)))
                    .collect();
                if generations.is_empty() {
                    continue;
                }
                match self.fill(&ns, &generations).await {
                    Ok(marked) => {
                        for set in marked {
                            if !trigger(&ns, &set) {
                                untriggered.insert((ns.clone(), set));
                            }
                        }
                    }
                    Err(e) => {
                        warn!(namespace = %ns, sets = ?sets, error = %e, "listing the pods and claims of sets that came to concern us failed; they are not planned until it succeeds; retrying");
                        failed.insert(ns, sets);
                    }
                }
            }
            if failed.is_empty() {
                backoff = None;
                continue;
            }
            pending = failed;
            let wait = backoff
                .get_or_insert_with(|| {
                    ExponentialBuilder::default()
                        .with_min_delay(Duration::from_millis(500))
                        .with_max_delay(Duration::from_secs(30))
                        .without_max_times()
                        .with_jitter()
                        .build()
                })
                .next()
                .unwrap_or(Duration::from_secs(30));
            debug!(?wait, "fill retry");
            tokio::time::sleep(wait).await;
        }
    }
}
