//! Act: carries out the planner's actions through a narrow seam to the cluster, in order, and
//! reports each outcome as an Event. It decides nothing; every call is idempotent (AlreadyExists
//! and NotFound are outcomes, not errors) and data-bearing deletes carry a UID precondition.

use std::collections::BTreeMap;
use std::future::Future;

use drain_api::claim_annotations;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::plan::{Action, ClaimRef, DeleteWhy};
use crate::template::{DrainPodInput, DrainTemplate};

/// Severity of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// The StatefulSet being reconciled.
    Set,
    /// A drain pod, by name and UID.
    Pod {
        /// Name.
        name: String,
        /// UID.
        uid: String,
    },
}

/// The outcome of a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Created, with this UID.
    Uid(String),
    /// A pod with that name exists already.
    AlreadyExists,
}

/// The calls the act step makes, in one namespace. The real one talks to the API server; tests
/// use a fake that records calls and injects errors.
pub trait Cluster: Sync {
    /// Creates a pod.
    fn create_pod(&self, pod: &Pod) -> impl Future<Output = Result<Created, kube::Error>> + Send;
    /// Deletes a pod if it still has this UID; gone already is fine.
    fn delete_pod(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Deletes a claim if it still has this UID; gone already is fine.
    fn delete_claim(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Sets (`Some`) or removes (`None`) annotations on a claim if it still has this UID; gone
    /// (or replaced) already is fine.
    fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Whether `ordinal` is still outside the set's range, read live from the API server (a
    /// guard against a stale cache just before a create); `false` if the set is gone or was
    /// replaced.
    fn still_orphaned(
        &self,
        ordinal: i32,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// The UID of the pod holding `name` now, read live from the API server.
    fn pod_uid(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, kube::Error>> + Send;
    /// Publishes an Event (best effort: failures are logged, not returned).
    fn event(
        &self,
        subject: &Subject,
        severity: Severity,
        reason: &str,
        note: String,
    ) -> impl Future<Output = ()> + Send;
}

/// An action that failed.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// Creating a drain pod failed.
    #[error("failed to create drain pod {name}")]
    CreateDrainPod {
        /// Pod name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Deleting a drain pod failed.
    #[error("failed to delete drain pod {name}")]
    DeleteDrainPod {
        /// Pod name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Deleting a drained claim failed.
    #[error("failed to delete claim {name}")]
    DeleteClaim {
        /// Claim name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Reading the set or a pod live (to confirm a cached view) failed.
    #[error("failed to read {what}")]
    Confirm {
        /// What was read.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Writing the drain record on a claim failed.
    #[error("failed to annotate claim {name}")]
    AnnotateClaim {
        /// Claim name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl ActError {
    /// Stable category for Event reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CreateDrainPod { .. } => "CreateDrainPodFailed",
            Self::DeleteDrainPod { .. } => "DeleteDrainPodFailed",
            Self::DeleteClaim { .. } => "DeleteClaimFailed",
            Self::AnnotateClaim { .. } => "AnnotateClaimFailed",
            Self::Confirm { .. } => "ReadFailed",
        }
    }
}

async fn annotate_all<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<(), ActError> {
    for c in claims {
        cluster
            .annotate_claim(&c.name, &c.uid, annotations)
            .await
            .map_err(|source| ActError::AnnotateClaim {
                name: c.name.clone(),
                source,
            })?;
    }
    Ok(())
}

fn set(pairs: &[(&str, String)]) -> BTreeMap<String, Option<String>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
        .collect()
}

fn names(claims: &[ClaimRef]) -> String {
    claims
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Carries out `actions` in order, stopping at the first failure.
pub async fn apply<C: Cluster>(
    cluster: &C,
    template: &DrainTemplate,
    replicas: i32,
    actions: &[Action],
    now: Timestamp,
) -> Result<(), ActError> {
    for action in actions {
        apply_one(cluster, template, replicas, action, now).await?;
    }
    Ok(())
}

async fn apply_one<C: Cluster>(
    cluster: &C,
    template: &DrainTemplate,
    replicas: i32,
    action: &Action,
    now: Timestamp,
) -> Result<(), ActError> {
    match action {
        Action::CreateDrainPod {
            ordinal,
            claims,
            attempt,
            first_attempt_at,
        } => {
            let refs: Vec<ClaimRef> = claims.values().cloned().collect();
            let orphaned =
                cluster
                    .still_orphaned(*ordinal)
                    .await
                    .map_err(|source| ActError::Confirm {
                        what: "the statefulset".to_owned(),
                        source,
                    })?;
            if !orphaned {
                info!(
                    ordinal,
                    "the ordinal is back in range (the cache lagged); no drain pod"
                );
                return Ok(());
            }
            if let Some(first) = first_attempt_at {
                annotate_all(
                    cluster,
                    &refs,
                    &set(&[(claim_annotations::FIRST_ATTEMPT_AT, first.to_string())]),
                )
                .await?;
            }
            let pod = template.pod(&DrainPodInput {
                ordinal: *ordinal,
                replicas,
                claims: claims
                    .iter()
                    .map(|(t, c)| (t.clone(), (c.name.clone(), c.uid.clone())))
                    .collect(),
            });
            let name = template.pod_name(*ordinal);
            match cluster
                .create_pod(&pod)
                .await
                .map_err(|source| ActError::CreateDrainPod {
                    name: name.clone(),
                    source,
                })? {
                Created::Uid(uid) => {
                    info!(pod = %name, attempt, "created drain pod");
                    annotate_all(
                        cluster,
                        &refs,
                        &set(&[(claim_annotations::POD_UID, uid.clone())]),
                    )
                    .await?;
                    let (reason, note) = if *attempt > 1 {
                        (
                            "DrainRetrying",
                            format!(
                                "created drain pod {name} (attempt {attempt}) for {}",
                                names(&refs)
                            ),
                        )
                    } else {
                        (
                            "DrainPodCreated",
                            format!("created drain pod {name} for {}", names(&refs)),
                        )
                    };
                    cluster
                        .event(&Subject::Set, Severity::Normal, reason, note.clone())
                        .await;
                    cluster
                        .event(&Subject::Pod { name, uid }, Severity::Normal, reason, note)
                        .await;
                }
                Created::AlreadyExists => {
                    info!(pod = %name, "a pod named like the drain pod exists; waiting for it");
                }
            }
        }
        Action::RecordDrainPod {
            claims, pod_uid, ..
        } => {
            annotate_all(
                cluster,
                claims,
                &set(&[(claim_annotations::POD_UID, pod_uid.clone())]),
            )
            .await?;
        }
        Action::RecordFailure {
            ordinal,
            claims,
            pod_uid,
            attempts,
            retry_after,
            reason,
            gave_up,
            only_if_pod_gone,
        } => {
            if *only_if_pod_gone {
                let name = template.pod_name(*ordinal);
                let now_uid = cluster
                    .pod_uid(&name)
                    .await
                    .map_err(|source| ActError::Confirm {
                        what: format!("pod {name}"),
                        source,
                    })?;
                if now_uid.as_deref() == Some(pod_uid.as_str()) {
                    info!(pod = %name, "drain pod still exists (the cache lagged); not a failure");
                    return Ok(());
                }
            }
            let record = set(&[
                (claim_annotations::ATTEMPTS, attempts.to_string()),
                (claim_annotations::RETRY_AFTER, retry_after.to_string()),
                (claim_annotations::LAST_FAILURE, reason.clone()),
                (claim_annotations::COUNTED_POD_UID, pod_uid.clone()),
            ]);
            annotate_all(cluster, claims, &record).await?;
            let name = template.pod_name(*ordinal);
            warn!(pod = %name, attempts, %reason, gave_up, "drain failed");
            let note = format!("drain pod {name} failed (attempt {attempts}): {reason}");
            cluster
                .event(
                    &Subject::Pod {
                        name: name.clone(),
                        uid: pod_uid.clone(),
                    },
                    Severity::Warning,
                    "DrainFailed",
                    note.clone(),
                )
                .await;
            if *gave_up {
                let note = format!(
                    "{note}; giving up: claims {} are kept (remove the drain-* annotations from them, \
                     or raise the limit, to retry)",
                    names(claims)
                );
                cluster
                    .event(&Subject::Set, Severity::Warning, "DrainGaveUp", note)
                    .await;
            } else {
                let secs = retry_after.duration_since(now).as_secs().max(0);
                let note = format!("{note}; retrying in {secs}s");
                cluster
                    .event(&Subject::Set, Severity::Warning, "DrainFailed", note)
                    .await;
            }
        }
        Action::DeleteDrainPod { name, uid, why, .. } => {
            cluster
                .delete_pod(name, uid)
                .await
                .map_err(|source| ActError::DeleteDrainPod {
                    name: name.clone(),
                    source,
                })?;
            info!(pod = %name, ?why, "deleted drain pod");
            match why {
                DeleteWhy::Cancelled => {
                    let note = format!(
                        "scale-up: cancelled the drain of {name}; its claims are kept for the returning pod"
                    );
                    cluster
                        .event(&Subject::Set, Severity::Normal, "DrainCancelled", note)
                        .await;
                }
                DeleteWhy::DeadlineExceeded => {
                    let note =
                        format!("drain pod {name} ran past the drain deadline and was stopped");
                    cluster
                        .event(
                            &Subject::Set,
                            Severity::Warning,
                            "DrainDeadlineExceeded",
                            note,
                        )
                        .await;
                }
                DeleteWhy::Succeeded | DeleteWhy::Failed => {}
            }
        }
        Action::DeleteClaims { ordinal, claims } => {
            let name = template.pod_name(*ordinal);
            let note = format!(
                "drain pod {name} succeeded; deleting claims {}",
                names(claims)
            );
            cluster
                .event(
                    &Subject::Set,
                    Severity::Normal,
                    "DrainSucceeded",
                    note.clone(),
                )
                .await;
            for c in claims {
                cluster
                    .delete_claim(&c.name, &c.uid)
                    .await
                    .map_err(|source| ActError::DeleteClaim {
                        name: c.name.clone(),
                        source,
                    })?;
                info!(claim = %c.name, "deleted drained claim");
            }
            let note = format!("deleted claims {} drained by {name}", names(claims));
            cluster
                .event(&Subject::Set, Severity::Normal, "ClaimsDeleted", note)
                .await;
        }
        Action::ClearRecord { claims, .. } => {
            let clear: BTreeMap<String, Option<String>> = claim_annotations::ALL
                .iter()
                .map(|k| ((*k).to_owned(), None))
                .collect();
            annotate_all(cluster, claims, &clear).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
