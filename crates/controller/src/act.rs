//! Act: carries out the planner's actions through a narrow seam to the cluster and reports each
//! outcome as Events (chosen by [`events`], a pure function). It decides nothing; every call is
//! idempotent (AlreadyExists and NotFound are outcomes, not errors), data-bearing deletes carry a
//! UID precondition, and deletes of drain pods believed unfinished a resourceVersion one.
//!
//! Actions of one ordinal run in order and stop at its first failure, or at the first outcome
//! showing the plan was made from a stale view (a drain pod or claim changed or gone); neither
//! stops the actions of other ordinals.

use std::collections::BTreeMap;
use std::future::Future;

use drain_api::claim_annotations;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::plan::{Action, ClaimRef, DeleteWhy, FailureKind};
use crate::retain::RetainError;
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

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// About what.
    pub subject: Subject,
    /// Normal or Warning.
    pub severity: Severity,
    /// Reason (CamelCase, stable).
    pub reason: &'static str,
    /// Message.
    pub note: String,
    /// The ordinal it is about, if one: Events about the set that differ only in their note
    /// are kept apart by it (an Event recorder folds Events of the same reason on the same
    /// object into one series, keeping only the first note).
    pub ordinal: Option<i32>,
}

/// The outcome of a create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Created, with this UID.
    Uid(String),
    /// A pod with that name exists already.
    AlreadyExists,
}

/// The outcome of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted (or deletion started).
    Deleted,
    /// Gone already, or replaced by another object of that name (UID precondition failed).
    Gone,
    /// The object changed since it was observed (resourceVersion precondition failed).
    Changed,
}

/// The outcome of a UID-preconditioned patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patched {
    /// Patched.
    Done,
    /// Gone, or replaced by another object of that name (UID precondition failed): nothing
    /// written.
    Gone,
}

/// What retaining one claim's volume came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retained {
    /// The volume is marked and its policy is `Retain` (now or from an earlier try).
    Marked {
        /// The volume.
        volume: String,
    },
    /// The volume's policy was `Retain` already, by its owner's choice: left as it is.
    KeptByOwner {
        /// The volume.
        volume: String,
    },
    /// The claim is bound to no volume (or to one that is gone): no data to keep.
    NoVolume,
    /// The claim is gone or was replaced.
    ClaimGone,
}

/// The calls the act step makes, in one namespace. The real one talks to the API server; tests
/// use a fake that records calls and injects errors.
pub trait Cluster: Sync {
    /// Creates a pod.
    fn create_pod(&self, pod: &Pod) -> impl Future<Output = Result<Created, kube::Error>> + Send;
    /// Deletes a pod if it still has this UID (and resourceVersion, when given).
    fn delete_pod(
        &self,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<Deleted, kube::Error>> + Send;
    /// Deletes a claim if it still has this UID; gone already is fine.
    fn delete_claim(
        &self,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Sets (`Some`) or removes (`None`) annotations on a claim if it still has this UID;
    /// [`Patched::Gone`] if it is gone or was replaced.
    fn annotate_claim(
        &self,
        name: &str,
        uid: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> impl Future<Output = Result<Patched, kube::Error>> + Send;
    /// Whether `ordinal` is still outside the set's range, read live from the API server (a
    /// guard against a stale cache, read alongside a drain pod's create); `false` if the set is
    /// gone, was replaced or is being deleted.
    fn still_orphaned(
        &self,
        ordinal: i32,
    ) -> impl Future<Output = Result<bool, kube::Error>> + Send;
    /// The UID of the pod holding `name` now, read live from the API server.
    fn pod_uid(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, kube::Error>> + Send;
    /// Sets the reclaim policy of the volume of `claim` (drained by drain pod `pod`) to
    /// `Retain` and marks it until `until` ([`crate::retain`]), reading both live.
    fn retain_volume(
        &self,
        claim: &ClaimRef,
        pod: &str,
        until: Timestamp,
    ) -> impl Future<Output = Result<Retained, RetainError>> + Send;
    /// Publishes an Event (best effort: failures are logged, not returned).
    fn event(&self, event: &EventSpec) -> impl Future<Output = ()> + Send;
    /// Whether this replica may still act (the leader-election fence, checked before each
    /// action; always `true` without leader election).
    fn may_act(&self) -> bool {
        true
    }
    /// Whether a drain pod's create must wait for the live read ([`Cluster::still_orphaned`])
    /// instead of going out alongside it: while the set's last read did not confirm a drain pod
    /// (it failed, or the cache lagged a scale-up or a set of the other kind: a create would
    /// only be withdrawn, and its pod's events would retry it at once).
    fn confirm_first(&self) -> bool {
        false
    }
    /// A withdrawal failed: the pod (`name`, `uid`) is deleted on the set's next reconciles, and
    /// shown to the planner as terminating meanwhile (never recorded on its claims).
    fn withdraw_later(&self, _name: &str, _uid: &str) {}
    /// A drain pod's create found `name` (of `ordinal`) taken: find out, live, what holds it.
    /// A pod made neither by the set nor by this controller is remembered, so the ordinal is
    /// shown blocked without a drain slot until it goes. Best effort.
    fn name_taken(&self, _ordinal: i32, _name: &str) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
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
    /// This replica stopped leading: the action was not carried out.
    #[error("not carried out: this replica no longer leads")]
    NotLeader,
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
    /// Retaining a drained claim's volume failed: the claim is kept.
    #[error("failed to retain the volume of claim {name}; the claim is kept")]
    RetainVolume {
        /// Claim name.
        name: String,
        /// Cause.
        #[source]
        source: RetainError,
    },
    /// A drain pod was to be created without a valid template (a planner bug).
    #[error("no valid drain template to create drain pod {name}")]
    NoTemplate {
        /// Pod name.
        name: String,
    },
}

impl ActError {
    /// Stable category for Event reasons and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CreateDrainPod { .. } | Self::NoTemplate { .. } => "CreateDrainPodFailed",
            Self::DeleteDrainPod { .. } => "DeleteDrainPodFailed",
            Self::DeleteClaim { .. } => "DeleteClaimFailed",
            Self::AnnotateClaim { .. } => "AnnotateClaimFailed",
            Self::RetainVolume { .. } => "RetainVolumeFailed",
            Self::Confirm { .. } => "ReadFailed",
            Self::NotLeader => "NotLeader",
        }
    }

    /// Whether the API server refused it because the namespace is being deleted (it then lets
    /// nothing new be created in it): the namespace takes the set and its claims along, so
    /// this is not a failure to retry or warn about.
    pub fn namespace_terminating(&self) -> bool {
        let source = match self {
            Self::CreateDrainPod { source, .. }
            | Self::DeleteDrainPod { source, .. }
            | Self::DeleteClaim { source, .. }
            | Self::Confirm { source, .. }
            | Self::AnnotateClaim { source, .. } => source,
            Self::RetainVolume { source, .. } => match source {
                RetainError::Api { source, .. } | RetainError::Claim { source, .. } => source,
                RetainError::BoundElsewhere { .. } => return false,
            },
            Self::NotLeader | Self::NoTemplate { .. } => return false,
        };
        // The cause's `reason` is the Kubernetes StatusCause's type.
        matches!(source, kube::Error::Api(s) if s.code == 403
            && s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")))
    }

    /// The error with its cause, for people: "failed to delete claim data-web-2: denied".
    pub fn describe(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(source) = cause {
            out.push_str(": ");
            out.push_str(&source.to_string());
            cause = source.source();
        }
        out
    }
}

/// What every action of one reconcile shares.
pub struct ActCtx<'a> {
    /// The set's name.
    pub set_name: &'a str,
    /// `spec.replicas` now.
    pub replicas: i32,
    /// The validated drain template (absent when new drains are stopped).
    pub template: Option<&'a DrainTemplate>,
    /// The time the plan was made for.
    pub now: Timestamp,
}

impl ActCtx<'_> {
    fn pod_name(&self, ordinal: i32) -> String {
        drain_api::names::pod_name(self.set_name, ordinal)
    }
}

/// What carrying out one action came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done as planned.
    Done,
    /// A drain pod was created with this UID.
    Created(String),
    /// A pod with the drain pod's name exists (the cache lagged): nothing created.
    NameTaken,
    /// A live read showed the cached view was stale; nothing done.
    Stale(&'static str),
    /// The drain pod changed since it was observed (or is gone); the ordinal's remaining actions
    /// are skipped and it is planned again.
    Changed,
    /// The volumes of the claims were retained: one line per claim, for the Event.
    Retained(Vec<String>),
    /// This claim is gone or was replaced since it was observed: nothing more is written to it,
    /// the ordinal's remaining actions are skipped and it is planned again from fresh state.
    ClaimGone(String),
}

impl Outcome {
    /// Whether the plan was made from a view this outcome proved stale, so the ordinal's
    /// remaining actions must not run.
    fn stops_ordinal(&self) -> bool {
        matches!(self, Self::Changed | Self::Stale(_) | Self::ClaimGone(_))
    }
}

/// Carries out `actions`: each ordinal's in order up to its first failure, every ordinal
/// whatever happens to the others, and the ordinals concurrently (a scale-down of a Parallel
/// set starts all its drains at once, not one API round trip after another). Returns the
/// failures, by ordinal, in the order the ordinals first appear.
pub async fn apply<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    actions: &[Action],
) -> Vec<(i32, ActError)> {
    let mut by_ordinal: Vec<(i32, Vec<&Action>)> = Vec::new();
    for action in actions {
        let ordinal = action.ordinal();
        match by_ordinal.iter_mut().find(|(o, _)| *o == ordinal) {
            Some((_, list)) => list.push(action),
            None => by_ordinal.push((ordinal, vec![action])),
        }
    }
    futures::future::join_all(
        by_ordinal
            .iter()
            .map(|(ordinal, list)| apply_ordinal(cluster, ctx, *ordinal, list)),
    )
    .await
    .into_iter()
    .flatten()
    .collect()
}

/// One ordinal's actions, in order, up to the first failure or the first sign that the plan
/// was made from a stale view.
async fn apply_ordinal<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    actions: &[&Action],
) -> Option<(i32, ActError)> {
    for action in actions {
        if !cluster.may_act() {
            warn!(
                ordinal,
                "no longer the leader: the remaining actions are left to the leader"
            );
            return Some((ordinal, ActError::NotLeader));
        }
        match apply_one(cluster, ctx, action).await {
            Ok(outcome) => {
                for mut event in events(ctx, action, &outcome) {
                    event.ordinal = Some(ordinal);
                    cluster.event(&event).await;
                }
                if outcome.stops_ordinal() {
                    return None;
                }
            }
            Err(e) => {
                warn!(ordinal, error = %e.describe(), "action failed; the ordinal's other actions wait for the next try");
                return Some((ordinal, e));
            }
        }
    }
    None
}

/// Carries out one action: only the dispatch, one function per kind of action.
async fn apply_one<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    action: &Action,
) -> Result<Outcome, ActError> {
    match action {
        Action::CreateDrainPod {
            ordinal,
            claims,
            attempt,
            new_series,
        } => {
            create_drain_pod(
                cluster,
                ctx,
                *ordinal,
                claims,
                *attempt,
                new_series.as_ref(),
            )
            .await
        }
        Action::RecordDrainPod {
            claims,
            pod_uid,
            series,
            ..
        } => record_drain_pod(cluster, claims, pod_uid, series.as_ref()).await,
        Action::RecordFailure {
            ordinal,
            claims,
            pod_uid,
            attempts,
            retry_after,
            reason,
            only_if_pod_gone,
            series,
            ..
        } => {
            let failure = Failure {
                pod_uid,
                attempts: *attempts,
                retry_after: *retry_after,
                reason,
                only_if_pod_gone: *only_if_pod_gone,
                series: series.as_ref(),
            };
            record_failure(cluster, ctx, *ordinal, claims, &failure).await
        }
        Action::RecordReturn { claims, at, .. } => record_return(cluster, claims, *at).await,
        Action::RecordSuccess {
            claims, pod_uid, ..
        } => {
            let record = set(&[(claim_annotations::SUCCEEDED_POD_UID, pod_uid.clone())]);
            annotate_all(cluster, claims, &record).await
        }
        Action::DeleteDrainPod {
            name,
            uid,
            resource_version,
            why,
            ..
        } => delete_drain_pod(cluster, name, uid, resource_version.as_deref(), *why).await,
        Action::RetainVolumes {
            ordinal,
            claims,
            until,
        } => retain_volumes(cluster, &ctx.pod_name(*ordinal), claims, *until).await,
        Action::DeleteClaims { claims, .. } => delete_claims(cluster, claims).await,
        Action::ClearRecord { claims, .. } => clear_record(cluster, claims).await,
        Action::Warn { message, .. } => {
            warn!(%message, "drain blocked");
            Ok(Outcome::Done)
        }
        Action::AwaitApproval { claims, .. } => {
            info!(claims = %names(claims), "drain succeeded; the claims wait for approval");
            Ok(Outcome::Done)
        }
    }
}

/// Records the drain pod's UID on its claims.
async fn record_drain_pod<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    pod_uid: &str,
    series: Option<&(Timestamp, String)>,
) -> Result<Outcome, ActError> {
    let mut record = set(&[(claim_annotations::POD_UID, pod_uid.to_owned())]);
    if let Some((at, hash)) = series {
        record.extend(series_record(*at, hash, false));
    }
    annotate_all(cluster, claims, &record).await
}

/// The claim annotations that start a series of attempts: its start and template; the counts
/// of an earlier series go, and with `new_drain` also an earlier return (a series repaired
/// for a running drain pod keeps a return recorded for it).
fn series_record(at: Timestamp, hash: &str, new_drain: bool) -> BTreeMap<String, Option<String>> {
    let mut cleared = vec![
        claim_annotations::ATTEMPTS,
        claim_annotations::RETRY_AFTER,
        claim_annotations::LAST_FAILURE,
        claim_annotations::COUNTED_POD_UID,
    ];
    if new_drain {
        cleared.push(claim_annotations::RETURNED_AT);
    }
    let mut record: BTreeMap<String, Option<String>> =
        cleared.iter().map(|k| ((*k).to_owned(), None)).collect();
    record.insert(
        claim_annotations::FIRST_ATTEMPT_AT.to_owned(),
        Some(at.to_string()),
    );
    record.insert(
        claim_annotations::TEMPLATE_HASH.to_owned(),
        Some(hash.to_owned()),
    );
    record
}

/// A failed attempt, as counted on the claims.
struct Failure<'a> {
    pod_uid: &'a str,
    attempts: u32,
    retry_after: Timestamp,
    reason: &'a str,
    /// The pod vanished from the cache: count it only once the API server confirms it is gone.
    only_if_pod_gone: bool,
    /// The failed pod's series, when the claims do not record it yet.
    series: Option<&'a (Timestamp, String)>,
}

/// Before counting a drain pod that vanished from the cache: whether the API server still has
/// it (the cache lagged), which is [`Outcome::Stale`] and no failure.
async fn confirm_pod_gone<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    pod_uid: &str,
) -> Result<Option<Outcome>, ActError> {
    let name = ctx.pod_name(ordinal);
    let live = cluster
        .pod_uid(&name)
        .await
        .map_err(|source| ActError::Confirm {
            what: format!("pod {name}"),
            source,
        })?;
    if live.as_deref() == Some(pod_uid) {
        info!(pod = %name, "drain pod still exists (the cache lagged); not a failure");
        return Ok(Some(Outcome::Stale("drain pod still exists")));
    }
    Ok(None)
}

/// Counts a failed attempt on the claims: attempts, when to retry, why, and which pod.
async fn record_failure<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    claims: &[ClaimRef],
    failure: &Failure<'_>,
) -> Result<Outcome, ActError> {
    if failure.only_if_pod_gone
        && let Some(stale) = confirm_pod_gone(cluster, ctx, ordinal, failure.pod_uid).await?
    {
        return Ok(stale);
    }
    let mut record = BTreeMap::new();
    if let Some((at, hash)) = failure.series {
        record.extend(series_record(*at, hash, false));
    }
    record.extend(set(&[
        (claim_annotations::ATTEMPTS, failure.attempts.to_string()),
        (
            claim_annotations::RETRY_AFTER,
            failure.retry_after.to_string(),
        ),
        (claim_annotations::LAST_FAILURE, failure.reason.to_owned()),
        (
            claim_annotations::COUNTED_POD_UID,
            failure.pod_uid.to_owned(),
        ),
    ]));
    annotate_all(cluster, claims, &record).await
}

/// Records on the claims when the scale-up that brought the ordinal back was seen.
async fn record_return<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    at: Timestamp,
) -> Result<Outcome, ActError> {
    let record = set(&[(claim_annotations::RETURNED_AT, at.to_string())]);
    annotate_all(cluster, claims, &record).await
}

/// Deletes a drain pod with its preconditions; one that is gone or changed stops the ordinal.
async fn delete_drain_pod<C: Cluster>(
    cluster: &C,
    name: &str,
    uid: &str,
    resource_version: Option<&str>,
    why: DeleteWhy,
) -> Result<Outcome, ActError> {
    let deleted = cluster
        .delete_pod(name, uid, resource_version)
        .await
        .map_err(|source| ActError::DeleteDrainPod {
            name: name.to_owned(),
            source,
        })?;
    info!(pod = %name, ?why, ?deleted, "deleted drain pod");
    Ok(match deleted {
        Deleted::Deleted => Outcome::Done,
        Deleted::Gone | Deleted::Changed => Outcome::Changed,
    })
}

/// Deletes drained claims, each with its UID precondition, stopping at the first failure.
async fn delete_claims<C: Cluster>(cluster: &C, claims: &[ClaimRef]) -> Result<Outcome, ActError> {
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
    Ok(Outcome::Done)
}

/// Retains the volume of each claim before it is deleted; stops at the first that cannot be.
async fn retain_volumes<C: Cluster>(
    cluster: &C,
    pod: &str,
    claims: &[ClaimRef],
    until: Timestamp,
) -> Result<Outcome, ActError> {
    let mut lines = Vec::new();
    for c in claims {
        let retained = cluster
            .retain_volume(c, pod, until)
            .await
            .map_err(|source| ActError::RetainVolume {
                name: c.name.clone(),
                source,
            })?;
        let line = match retained {
            Retained::Marked { volume } => {
                info!(claim = %c.name, %volume, %until, "retained the drained claim's volume");
                format!(
                    "volume {volume} of claim {} is retained until {until}",
                    c.name
                )
            }
            Retained::KeptByOwner { volume } => format!(
                "volume {volume} of claim {} has reclaim policy Retain already; left as it is",
                c.name
            ),
            Retained::NoVolume => format!("claim {} is bound to no volume", c.name),
            Retained::ClaimGone => return Ok(Outcome::ClaimGone(c.name.clone())),
        };
        lines.push(line);
    }
    Ok(Outcome::Retained(lines))
}

/// Removes every drain annotation from the claims.
async fn clear_record<C: Cluster>(cluster: &C, claims: &[ClaimRef]) -> Result<Outcome, ActError> {
    let clear: BTreeMap<String, Option<String>> = claim_annotations::ALL
        .iter()
        .map(|k| ((*k).to_owned(), None))
        .collect();
    annotate_all(cluster, claims, &clear).await
}

/// Starts a new series on the claims if the plan says so, creates the drain pod and records its
/// UID on the claims.
///
/// The live check that the ordinal is still out of range (a guard against a stale cache) runs
/// alongside the create rather than before it: one round trip instead of two between a pod's
/// going and its drain pod. A create the live set proves wrong, or cannot confirm, is withdrawn
/// at once (deleted with its UID as the only precondition, its claims unrecorded), normally
/// before the node starts it; had it started, it would be a drain stopped by a delete, not a
/// success. A withdrawal that fails is left to the set's next reconciles
/// ([`Cluster::withdraw_later`]). The read goes first when [`Cluster::confirm_first`] says so.
async fn create_drain_pod<C: Cluster>(
    cluster: &C,
    ctx: &ActCtx<'_>,
    ordinal: i32,
    claims: &BTreeMap<String, ClaimRef>,
    attempt: u32,
    new_series: Option<&(Timestamp, String)>,
) -> Result<Outcome, ActError> {
    let name = ctx.pod_name(ordinal);
    let template = ctx
        .template
        .ok_or_else(|| ActError::NoTemplate { name: name.clone() })?;
    let refs: Vec<ClaimRef> = claims.values().cloned().collect();
    let pod = template.pod(&DrainPodInput {
        ordinal,
        replicas: ctx.replicas,
        claims: claims
            .iter()
            .map(|(t, c)| (t.clone(), (c.name.clone(), c.uid.clone())))
            .collect(),
    });
    let confirm = |source| ActError::Confirm {
        what: "the statefulset".to_owned(),
        source,
    };
    let (orphaned, created) = if cluster.confirm_first() {
        if !cluster.still_orphaned(ordinal).await.map_err(confirm)? {
            return Ok(back_in_range(ordinal));
        }
        (Ok(true), cluster.create_pod(&pod).await)
    } else {
        let (orphaned, created) =
            futures::join!(cluster.still_orphaned(ordinal), cluster.create_pod(&pod));
        (orphaned.map_err(confirm), created)
    };
    let created = match (created, &orphaned) {
        (Ok(created), _) => created,
        (Err(_), Ok(false)) => return Ok(back_in_range(ordinal)),
        (Err(source), _) => return Err(ActError::CreateDrainPod { name, source }),
    };
    match (created, orphaned) {
        (Created::Uid(uid), Ok(true)) => {
            info!(pod = %name, attempt, "created drain pod");
            let mut record = set(&[(claim_annotations::POD_UID, uid.clone())]);
            if let Some((at, hash)) = new_series {
                // A new series: written with the pod, after the create, so nothing delays it.
                record.extend(series_record(*at, hash, true));
            }
            // A claim replaced just now leaves the pod unrecorded: the next reconcile plans from
            // what it finds. The pod exists either way, so it is reported.
            annotate_all(cluster, &refs, &record).await?;
            Ok(Outcome::Created(uid))
        }
        (Created::Uid(uid), unconfirmed) => {
            // The UID alone as precondition: the pod is withdrawn whatever became of it (it has
            // been scheduled by now, which changes its resourceVersion).
            if let Err(source) = cluster.delete_pod(&name, &uid, None).await {
                cluster.withdraw_later(&name, &uid);
                return Err(ActError::DeleteDrainPod { name, source });
            }
            info!(pod = %name, "drain pod withdrawn right after its create: the live set did not confirm its ordinal out of range");
            unconfirmed.map(|_| back_in_range(ordinal))
        }
        (Created::AlreadyExists, Ok(false)) => Ok(back_in_range(ordinal)),
        (Created::AlreadyExists, Err(e)) => Err(e),
        (Created::AlreadyExists, Ok(true)) => {
            info!(pod = %name, "a pod named like the drain pod exists; waiting for it");
            cluster.name_taken(ordinal, &name).await;
            Ok(Outcome::NameTaken)
        }
    }
}

/// The live set has `ordinal` in range again: the plan was made from a stale cache.
fn back_in_range(ordinal: i32) -> Outcome {
    info!(
        ordinal,
        "the ordinal is back in range (the cache lagged); no drain pod"
    );
    Outcome::Stale("ordinal back in range")
}

/// Writes `annotations` to each claim in turn; [`Outcome::ClaimGone`] (and nothing written to
/// the claims after it) at the first one that is gone or was replaced, else [`Outcome::Done`].
async fn annotate_all<C: Cluster>(
    cluster: &C,
    claims: &[ClaimRef],
    annotations: &BTreeMap<String, Option<String>>,
) -> Result<Outcome, ActError> {
    for c in claims {
        let patched = cluster
            .annotate_claim(&c.name, &c.uid, annotations)
            .await
            .map_err(|source| ActError::AnnotateClaim {
                name: c.name.clone(),
                source,
            })?;
        if patched == Patched::Gone {
            info!(claim = %c.name, "claim gone or replaced since it was observed; planning the ordinal again");
            return Ok(Outcome::ClaimGone(c.name.clone()));
        }
    }
    Ok(Outcome::Done)
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

fn on_set(severity: Severity, reason: &'static str, note: String) -> EventSpec {
    EventSpec {
        subject: Subject::Set,
        severity,
        reason,
        note,
        ordinal: None,
    }
}

/// The Event that reports what `action` would do, under `--dry-run` (pure; no time in the
/// note, so an unchanged plan gives unchanged Events).
pub fn dry_run_event(ctx: &ActCtx<'_>, action: &Action) -> EventSpec {
    let pod = ctx.pod_name(action.ordinal());
    let (reason, note) = match action {
        Action::CreateDrainPod {
            claims, attempt, ..
        } => {
            let refs: Vec<ClaimRef> = claims.values().cloned().collect();
            (
                "DryRunCreateDrainPod",
                format!(
                    "would create drain pod {pod} (attempt {attempt}) for claims {}",
                    names(&refs)
                ),
            )
        }
        Action::RecordDrainPod { claims, .. } => (
            "DryRunRecordDrainPod",
            format!("would record drain pod {pod} on claims {}", names(claims)),
        ),
        Action::RecordFailure {
            claims,
            attempts,
            reason,
            gave_up,
            ..
        } => (
            "DryRunRecordFailure",
            format!(
                "would count failed attempt {attempts} of drain pod {pod} on claims {} ({reason}){}",
                names(claims),
                if *gave_up { "; and give up" } else { "" }
            ),
        ),
        Action::RecordReturn { claims, .. } => (
            "DryRunRecordReturn",
            format!(
                "would record the scale-up that brought {pod} back on claims {}",
                names(claims)
            ),
        ),
        Action::RecordSuccess { claims, .. } => (
            "DryRunRecordSuccess",
            format!(
                "would record on claims {} that drain pod {pod} was seen succeeding",
                names(claims)
            ),
        ),
        Action::DeleteDrainPod { why, .. } => (
            "DryRunDeleteDrainPod",
            format!("would delete drain pod {pod} ({why:?})"),
        ),
        Action::RetainVolumes { claims, until, .. } => (
            "DryRunRetainVolumes",
            format!(
                "would retain the volumes of claims {} until {until}",
                names(claims)
            ),
        ),
        Action::DeleteClaims { claims, .. } => (
            "DryRunDeleteClaims",
            format!(
                "would delete claims {} (drain pod {pod} succeeded)",
                names(claims)
            ),
        ),
        Action::ClearRecord { claims, .. } => (
            "DryRunClearRecord",
            format!("would clear the drain record of claims {}", names(claims)),
        ),
        Action::AwaitApproval { claims, .. } => (
            "DryRunAwaitApproval",
            format!(
                "drain pod {pod} succeeded; claims {} would wait for approval",
                names(claims)
            ),
        ),
        Action::Warn {
            reason, message, ..
        } => ("DryRunWarn", format!("{reason}: {message}")),
    };
    EventSpec {
        ordinal: Some(action.ordinal()),
        ..on_set(Severity::Normal, reason, note)
    }
}

/// The Events that report an action's outcome (pure: the act step publishes them).
pub fn events(ctx: &ActCtx<'_>, action: &Action, outcome: &Outcome) -> Vec<EventSpec> {
    use Severity::{Normal, Warning};
    if outcome.stops_ordinal() || *outcome == Outcome::NameTaken {
        return Vec::new();
    }
    match action {
        Action::CreateDrainPod {
            ordinal,
            claims,
            attempt,
            ..
        } => {
            let Outcome::Created(uid) = outcome else {
                return Vec::new();
            };
            let name = ctx.pod_name(*ordinal);
            let refs: Vec<ClaimRef> = claims.values().cloned().collect();
            let (reason, note) = if *attempt > 1 {
                let note = format!(
                    "created drain pod {name} (attempt {attempt}) for {}",
                    names(&refs)
                );
                ("DrainRetrying", note)
            } else {
                (
                    "DrainPodCreated",
                    format!("created drain pod {name} for {}", names(&refs)),
                )
            };
            vec![
                on_set(Normal, reason, note.clone()),
                EventSpec {
                    subject: Subject::Pod {
                        name,
                        uid: uid.clone(),
                    },
                    severity: Normal,
                    reason,
                    note,
                    ordinal: None,
                },
            ]
        }
        Action::RecordFailure {
            ordinal,
            claims,
            pod_uid,
            kind,
            attempts,
            retry_after,
            reason,
            gave_up,
            ..
        } => {
            let name = ctx.pod_name(*ordinal);
            let (event_reason, what) = match kind {
                FailureKind::Failed | FailureKind::Vanished => ("DrainFailed", "failed"),
                FailureKind::Interrupted => ("DrainInterrupted", "was interrupted"),
                FailureKind::Unproven => ("DrainUnproven", "exited 0 without proof it finished"),
                FailureKind::Stuck => ("DrainStuck", "is stuck"),
                FailureKind::Stalled => ("DrainStalled", "made no progress"),
                FailureKind::DeadlineExceeded => {
                    ("DrainDeadlineExceeded", "ran past the drain deadline")
                }
            };
            let note = format!("drain pod {name} {what} (attempt {attempts}): {reason}");
            let mut out = vec![EventSpec {
                subject: Subject::Pod {
                    name,
                    uid: pod_uid.clone(),
                },
                severity: Warning,
                reason: event_reason,
                note: note.clone(),
                ordinal: None,
            }];
            if *gave_up {
                let note = format!(
                    "{note}; giving up: claims {} are kept (remove the drain-* annotations from them, \
                     raise the limit, or change the drain template to retry)",
                    names(claims)
                );
                out.push(on_set(Warning, "DrainGaveUp", note));
            } else {
                let secs = retry_after.duration_since(ctx.now).as_secs().max(0);
                out.push(on_set(
                    Warning,
                    event_reason,
                    format!("{note}; retrying in {secs}s"),
                ));
            }
            out
        }
        Action::DeleteDrainPod { name, why, .. } => match why {
            DeleteWhy::Cancelled => vec![on_set(
                Normal,
                "DrainCancelled",
                format!(
                    "scale-up: cancelled the drain of {name}; its claims are kept for the returning pod"
                ),
            )],
            DeleteWhy::ScaleUpWaitExceeded => vec![on_set(
                Warning,
                "ScaleUpWaitExceeded",
                format!(
                    "scale-up: the returning pod waited too long for drain {name} (policy finish); \
                     cancelled it, its claims are kept for the returning pod"
                ),
            )],
            DeleteWhy::ReturnedBeforeApproval => vec![on_set(
                Normal,
                "DrainReturnedBeforeApproval",
                format!(
                    "scale-up: the ordinal of drain pod {name} came back before the deletion of its \
                     drained claims was approved; removed the drain pod, the claims are kept for \
                     the returning pod"
                ),
            )],
            DeleteWhy::TemplateChanged => vec![on_set(
                Normal,
                "DrainTemplateChanged",
                format!(
                    "drain template changed: replacing drain pod {name}, which was not running \
                     (not started yet, or waiting to be restarted after a failure)"
                ),
            )],
            DeleteWhy::Succeeded
            | DeleteWhy::Failed
            | DeleteWhy::DeadlineExceeded
            | DeleteWhy::Stuck
            | DeleteWhy::Stalled => Vec::new(),
        },
        Action::DeleteClaims { ordinal, claims } => {
            let name = ctx.pod_name(*ordinal);
            vec![
                on_set(
                    Normal,
                    "DrainSucceeded",
                    format!(
                        "drain pod {name} succeeded; deleting claims {}",
                        names(claims)
                    ),
                ),
                on_set(
                    Normal,
                    "ClaimsDeleted",
                    format!("deleted claims {} drained by {name}", names(claims)),
                ),
            ]
        }
        Action::RetainVolumes { .. } => match outcome {
            Outcome::Retained(lines) => vec![on_set(
                Normal,
                "VolumesRetained",
                format!(
                    "{}; kubectl drain-status {} --volumes shows how to restore one",
                    lines.join("; "),
                    ctx.set_name
                ),
            )],
            _ => Vec::new(),
        },
        Action::Warn {
            reason, message, ..
        } => vec![on_set(Warning, reason, message.clone())],
        Action::AwaitApproval { ordinal, claims } => {
            let list = names(claims);
            vec![on_set(
                Normal,
                "DrainAwaitingApproval",
                format!(
                    "drain pod {} succeeded; claims {list} are deleted once approved: kubectl \
                     annotate pvc {} {}=true",
                    ctx.pod_name(*ordinal),
                    claims
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    claim_annotations::APPROVED
                ),
            )]
        }
        Action::RecordDrainPod { .. }
        | Action::RecordReturn { .. }
        | Action::RecordSuccess { .. }
        | Action::ClearRecord { .. } => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
