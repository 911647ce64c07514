//! The reconcile of one set, read top to bottom: observe (caches plus our own recent writes),
//! validate, plan, act, report; dry-run; and the error policy.

use super::*;

/// The status annotation `report` renders to (`None`: nothing to report).
pub(super) fn rendered(report: &StatusReport) -> Option<String> {
    (report != &StatusReport::default()).then(|| report.render())
}

/// The errors of the set's last report on the ordinals `actions` act on again: kept in the
/// status written alongside the actions, so an action that keeps failing does not clear and
/// re-add its error on every try (errors of ordinals with no action left are cleared).
pub(super) fn errors_kept(set: &StatefulSet, actions: &[plan::Action]) -> BTreeMap<i32, String> {
    let Some(last) = set
        .annotations()
        .get(annotations::STATUS)
        .and_then(|s| StatusReport::parse(s))
    else {
        return BTreeMap::new();
    };
    last.errors
        .into_iter()
        .filter_map(|(o, e)| Some((o.parse::<i32>().ok()?, e)))
        .filter(|(o, _)| actions.iter().any(|a| a.ordinal() == *o))
        .collect()
}

/// A claim's cached entry, or our last write of it if that is newer than the cached entry and
/// of the same claim (not one recreated under the name).
pub(super) fn newest_claim(cached: ClaimEntry, ours: Option<ClaimEntry>) -> ClaimEntry {
    ours.filter(|o| o.uid == cached.uid).unwrap_or(cached)
}

/// The cached drain pods of set `set`, with the ones we created (`created`: name, version,
/// pod) that the watch has not delivered yet: added, or in place of an older cached pod of that
/// name (a gone one: ours could be created under its name).
pub(super) fn with_created(
    mut cached: Vec<Arc<Pod>>,
    created: Vec<(String, u64, Pod)>,
    set: &str,
) -> Vec<Arc<Pod>> {
    for (name, version, pod) in created {
        if pod.labels().get(labels::DRAIN_POD).map(String::as_str) != Some(set) {
            continue;
        }
        match cached
            .iter()
            .position(|p| p.metadata.name.as_deref() == Some(&name))
        {
            Some(i) if version_of(&cached[i].metadata) < version => cached[i] = Arc::new(pod),
            Some(_) => {}
            None => cached.push(Arc::new(pod)),
        }
    }
    cached
}

/// Marks the drain pods we deleted, or failed to withdraw and will delete, as terminating,
/// whatever the cache still shows of them ([`recent::Deleted`]): only the flag, never a
/// deletion time.
pub(super) fn mark_deleted(pods: &mut [plan::PodObs], deleted: impl Fn(&str) -> bool) {
    for pod in pods {
        if matches!(pod.kind, plan::PodKind::Drain(_)) && deleted(&pod.uid) {
            pod.terminating = true;
        }
    }
}

/// Deletes the drain pods of this set whose withdrawal failed before
/// ([`Cluster::withdraw_later`]), with their UIDs as precondition; one that is gone already, or
/// replaced, is done with too. A failure keeps it for the next reconcile. Returns whether some
/// are left.
pub(super) async fn retry_withdrawals(ctx: &Context, id: SetId) -> bool {
    let pending = ctx.memory.read(&id, |m| m.withdrawing.clone());
    if pending.is_empty() {
        return false;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &id.1);
    for (uid, name) in pending {
        let done = match delete_pod(&pods, &ctx.metrics, &ctx.recent, &name, &uid, None).await {
            Ok(Deleted::Deleted) => {
                info!(pod = %name, "drain pod withdrawn (an earlier try had failed)");
                true
            }
            Ok(_) => true,
            Err(e) => {
                warn!(pod = %name, error = %e, "failed to withdraw a drain pod; retrying");
                false
            }
        };
        if done {
            ctx.memory.update(&id, |m| m.withdrawing.remove(&uid));
        }
    }
    ctx.memory.read(&id, |m| !m.withdrawing.is_empty())
}

/// Reads one set's snapshot from the caches, through the per-set indexes.
pub(super) fn observe_set(
    ctx: &Context,
    kind: SetKind,
    set: &StatefulSet,
    only_in_flight: bool,
) -> plan::Snapshot {
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    // Each read is at least as new as our own last write of the object (`crate::runtime::recent`).
    let claims: Vec<_> = ctx
        .claim_index
        .names(&ns, &name)
        .iter()
        .filter_map(|c| {
            let (cached, version) = ctx.claims.get_versioned(&ns, c)?;
            let entry = newest_claim(cached, ctx.recent.claims.newer_than(&ns, c, version));
            Some(entry.meta(&ns, c))
        })
        .collect();
    let drain_pods = with_created(
        ctx.drain_pod_index
            .names(&ns, &name)
            .iter()
            .filter_map(|p| ctx.drain_pods.get(&ObjectRef::new(p).within(&ns)))
            .collect(),
        ctx.recent.pods.in_namespace(&ns),
        &name,
    );
    let templates = observe::claim_templates(set);
    let others: Vec<_> = claims
        .iter()
        .filter_map(|c| observe::parse_claim_name(c.name.as_deref()?, &name, &templates))
        .map(|(_, o)| o)
        .collect::<std::collections::BTreeSet<i32>>()
        .iter()
        .filter_map(|o| {
            let pod = names::pod_name(&name, *o);
            Some(ctx.stateful_pods.get(&ns, &pod)?.meta(&ns, &pod))
        })
        .collect();
    let mut snap = observe::snapshot(
        set,
        claims.iter(),
        drain_pods.iter().map(|p| p.as_ref()),
        others.iter(),
    );
    let withdrawing: std::collections::BTreeSet<String> =
        ctx.memory.read(&set_id(kind, set), |m| {
            m.withdrawing.keys().cloned().collect()
        });
    mark_deleted(&mut snap.pods, |uid| {
        ctx.recent.deleted_pods.contains(uid) || withdrawing.contains(uid)
    });
    if only_in_flight {
        // Opted out: only ordinals with a drain pod of ours are finished; nothing else is touched.
        let drained: std::collections::BTreeSet<i32> = snap
            .pods
            .iter()
            .filter(|p| matches!(p.kind, plan::PodKind::Drain(_)))
            .map(|p| p.ordinal)
            .collect();
        snap.claims.retain(|c| drained.contains(&c.ordinal));
        snap.pods.retain(|p| drained.contains(&p.ordinal));
        snap.previous.retain(|o, _| drained.contains(o));
    }
    snap
}

/// Reads again, live, each pod remembered as holding one of the set's names without being the
/// set's or ours ([`Cluster::name_taken`]): while it is there (same UID), the planner sees it as
/// [`plan::PodKind::Unknown`]; once it is gone, replaced, or a cached pod holds the ordinal, it
/// is forgotten. Such pods are in no cache, so this read is what notices their deletion (the
/// planner requeues blocked ordinals every [`plan::RECHECK_UNKNOWN_POD`]).
pub(super) async fn recheck_taken(ctx: &Context, id: SetId, ns: &str, snap: &mut plan::Snapshot) {
    let remembered = ctx.memory.read(&id, |m| m.taken.clone());
    if remembered.is_empty() {
        return;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut gone = Vec::new();
    for (ordinal, uid) in remembered {
        let name = names::pod_name(&snap.set_name, ordinal);
        // A cached pod holds the ordinal now, or no claim is left to drain (or the set opted
        // out and the ordinal has no drain in flight): nothing to remember.
        if snap.pods.iter().any(|p| p.ordinal == ordinal)
            || !snap.claims.iter().any(|c| c.ordinal == ordinal)
        {
            gone.push(ordinal);
            continue;
        }
        let result = pods.get_opt(&name).await;
        ctx.metrics.request("get", "pods", &result);
        match result {
            Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(uid.as_str()) => {
                let mut seen = observe::other_pod(&pod.metadata, ordinal);
                seen.kind = plan::PodKind::Unknown;
                snap.pods.push(seen);
            }
            Ok(_) => gone.push(ordinal),
            Err(e) => {
                // Unknown now: kept as blocked rather than risk a create that fails again.
                debug!(pod = %name, error = %e, "could not read the pod holding the name again");
                let mut seen = observe::other_pod(&Default::default(), ordinal);
                seen.name = name;
                seen.uid = uid;
                seen.kind = plan::PodKind::Unknown;
                snap.pods.push(seen);
            }
        }
    }
    snap.pods.sort_by_key(|p| p.ordinal);
    if !gone.is_empty() {
        ctx.memory
            .update(&id, |m| m.taken.retain(|o, _| !gone.contains(o)));
    }
}

/// Reconciles one StatefulSet that opted in, or that opted out with drains in flight:
/// 1. observe: wait for the caches, then read the set's claims, drain pods and the pods holding
///    its pod names from them; a set being deleted is left alone;
/// 2. validate: [`validate::validate`] (invalid → Warning Event and a status problem; drains in
///    flight are completed, no new one starts until the set changes);
/// 3. plan: [`plan::plan`], pure;
/// 4. act: [`act::apply`], idempotent, with Events; one ordinal's failure does not stop others;
/// 5. report: the status annotation (with the failed actions); requeue at the plan's next
///    deadline or the resync period, or back off when an action failed.
pub(super) async fn reconcile<K: ServedSet>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let kind = K::KIND;
    let set = Arc::new(obj.to_statefulset());
    let name = set.name_any();
    let ns = set.namespace().unwrap_or_default();
    let span = info_span!("reconcile", statefulset = %name, namespace = %ns, kind = kind.label());
    async move {
        if set.metadata.deletion_timestamp.is_some() {
            // Being deleted: drain pods go with the set (garbage collector), claims stay.
            debug!("statefulset is being deleted; leaving it alone");
            ctx.status.forget(&set);
            return Ok(Requeue::await_change());
        }
        if !ctx.config.leadership.is_leading() {
            // A standby: the leader acts; becoming the leader reconciles every set.
            debug!("not the leader; standing by");
            return Ok(Requeue::await_change());
        }
        // Read our own last status write even if the cache has not seen it yet.
        let set = match ctx.status.overlay(&set) {
            Some(fresher) => Arc::new(fresher),
            None => set,
        };
        ctx.wait_ready().await?;
        // Before anything that may end the reconcile early (a name clash among them).
        let withdrawals_left = retry_withdrawals(&ctx, set_id(kind, &set)).await;
        let set_ref = set_reference(kind, &set);
        let opted_in = opted_in(&set);
        if let Some(twin) = ctx.twin_cached(K::KIND, &ns, &name) {
            // Pods and claims named `<name>-<ordinal>` could be either set's: none is drained.
            let note = format!("a {} named {name} exists in this namespace too: their pods and claims have the same names, so neither is drained until one is renamed or deleted", twin.label());
            warn!(twin = twin.label(), "name shared with a set of the other kind; nothing is drained");
            publish(&ctx.recorder, &set_ref, Severity::Warning, "NameClash", note, None);
            return Ok(Requeue::requeue(Duration::from_secs(30).min(ctx.config.resync)));
        }
        let range = match obj.ordinals() {
            Ok(range) => range,
            Err(e) => {
                // Which ordinals the set runs is unknown: nothing is planned, nothing deleted.
                warn!(error = %e, "unreadable reserveOrdinals; nothing is drained until the set changes");
                publish(&ctx.recorder, &set_ref, Severity::Warning, "InvalidReserveOrdinals", format!("{e}; nothing is drained or deleted until this is fixed"), None);
                return Ok(Requeue::await_change());
            }
        };

        // validate
        let validated = opted_in.then(|| {
            validate::validate(&set).map(|mut v| {
                v.template.set_owner_api_version(kind.api_version());
                v
            })
        });
        let problems = match &validated {
            Some(Err(problems)) => problems.clone(),
            _ => Vec::new(),
        };
        for p in &problems {
            warn!(reason = p.reason, message = %p.message, "invalid drain settings; no new drain until the set changes");
            publish(&ctx.recorder, &set_ref, Severity::Warning, p.reason, format!("{}; no new drain starts until this is fixed", p.message), None);
        }
        let problem = (!problems.is_empty())
            .then(|| problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; "));
        let valid = match &validated {
            Some(Ok(v)) => Ok(v),
            Some(Err(_)) => Err("the drain settings are invalid (see problem)"),
            None => Err("the set opted out of draining"),
        };
        let settings = validate::settings(&set, valid, &ctx.config.flags, obj.default_max_concurrent());

        // observe
        let mut snap = observe_set(&ctx, kind, &set, !opted_in);
        recheck_taken(&ctx, set_id(kind, &set), &ns, &mut snap).await;
        snap.reserved = range.reserved;
        snap.also_held = obj.start_fallback();

        // plan
        let now = Timestamp::now();
        let plan = plan::plan(&snap, &settings, now);
        if !plan.actions.is_empty() && !ctx.config.dry_run {
            info!(actions = ?plan.actions, "acting");
            debug!(pods = ?snap.pods, claims = ?snap.claims, "observed");
        }

        // act
        let cluster = KubeCluster {
            sets: Api::<K>::namespaced(ctx.client.clone(), &ns),
            twin: ctx.twin_api(K::KIND, &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            claims: Api::namespaced(ctx.client.clone(), &ns),
            recorder: &ctx.recorder,
            recent: &ctx.recent,
            set: set_ref.clone(),
            metrics: &ctx.metrics,
            leadership: &ctx.config.leadership,
            live: tokio::sync::OnceCell::new(),
            memory: &ctx.memory,
            volumes: Api::all(ctx.client.clone()),
            retained: &ctx.retained,
            id: set_id(kind, &set),
        };
        let act_ctx = ActCtx {
            set_name: &name,
            replicas: snap.replicas,
            template: valid.ok().map(|v| &v.template),
            now,
        };
        if ctx.config.dry_run {
            return dry_run::<K>(&ctx, &set, &set_ref, &act_ctx, &plan, problem).await;
        }
        // The status is handed to the writer before the actions, and written in the background
        // (`status_writer`): a reconcile holds up the next one of its set (pods that go
        // meanwhile wait), so it lasts only as long as its actions. It says what the plan
        // expects, keeping the last errors of the ordinals acted on again; if an action fails,
        // the errors are handed in once the actions are done.
        let expected = StatusReport::of(&plan.status, problem.clone(), &errors_kept(&set, &plan.actions));
        ctx.status.submit(K::KIND, &set, rendered(&expected));
        let failed = act::apply(&cluster, &act_ctx, &plan.actions).await;
        if failed.iter().any(|(_, e)| matches!(e, ActError::NotLeader)) {
            // Lost the lease mid-reconcile: the new leader plans afresh and reports.
            return Ok(Requeue::await_change());
        }
        // Not a failure: nothing new can be created in a namespace being deleted, and it takes
        // the set and its claims along. No retry, and no Warning (no Event can be created in it
        // either); the other ordinals' outcomes are reported as usual.
        let (terminating, failed): (Vec<_>, Vec<_>) =
            failed.into_iter().partition(|(_, e)| e.namespace_terminating());
        if !terminating.is_empty() {
            info!(ordinals = ?terminating.iter().map(|(o, _)| *o).collect::<Vec<_>>(), "the namespace is being deleted: no drain pod can be created in it, and its claims go with it");
        }
        let mut errors: BTreeMap<i32, String> = BTreeMap::new();
        for (ordinal, e) in &failed {
            error!(ordinal, error = %e.describe(), "action failed; retrying with backoff");
            publish(&ctx.recorder, &set_ref, Severity::Warning, e.reason(), e.describe(), Some(*ordinal));
            errors.entry(*ordinal).or_insert_with(|| e.describe());
        }
        // Not carried out, so not counted: the failed ordinals and those refused for the namespace.
        let failed_ordinals = errors.keys().chain(terminating.iter().map(|(o, _)| o)).copied().collect();
        ctx.metrics.record_reconcile(&ns, &name, &plan, &snap, &failed_ordinals);

        // report: only if the outcome differs from what was handed in before the actions
        let outcome = StatusReport::of(&plan.status, problem, &errors);
        if outcome != expected {
            ctx.status.submit(K::KIND, &set, rendered(&outcome));
        }
        if let Some((_, first)) = failed.into_iter().next() {
            return Err(Error::Act { count: errors.len(), first });
        }
        ctx.memory.update(&set_id(kind, &set), |m| m.failures = None);
        ctx.metrics.reconciles.get_or_create(&crate::runtime::metrics::ResultLabels { result: "ok".into() }).inc();
        ctx.forget_if_gone(kind, &ns, &name);
        if !terminating.is_empty() {
            return Ok(Requeue::await_change());
        }
        let mut requeue = plan.requeue_after.unwrap_or(ctx.config.resync).min(ctx.config.resync);
        if withdrawals_left {
            requeue = requeue.min(Duration::from_secs(2));
        }
        // A create just found a name held by a pod nobody here made: plan again at once, with
        // that pod seen, so the slot it was given goes to another ordinal.
        let newly_taken = ctx.memory.read(&set_id(kind, &set), |m| {
            m.taken.keys().any(|o| !snap.pods.iter().any(|p| p.ordinal == *o && p.kind == plan::PodKind::Unknown))
        });
        if newly_taken {
            requeue = requeue.min(Duration::from_millis(100));
        }
        Ok(Requeue::requeue(requeue))
    }
    .instrument(span)
    .await
}

/// Under `--dry-run`, instead of acting: logs and reports (once per change of the plan) what
/// each action would do, and writes the status marked `dryRun`.
pub(super) async fn dry_run<K: ServedSet>(
    ctx: &Context,
    set: &StatefulSet,
    set_ref: &ObjectReference,
    act_ctx: &ActCtx<'_>,
    plan: &plan::Plan,
    problem: Option<String>,
) -> Result<Requeue, Error> {
    let events: Vec<EventSpec> = plan
        .actions
        .iter()
        .map(|a| act::dry_run_event(act_ctx, a))
        .collect();
    let fingerprint = watch::fingerprint(
        events
            .iter()
            .map(|e| (e.reason, e.note.as_str()))
            .collect::<Vec<_>>(),
    );
    let key = set_id(K::KIND, set);
    let changed = ctx
        .memory
        .update(&key, |m| m.dry_run_reported.replace(fingerprint))
        != Some(fingerprint);
    if changed {
        for e in &events {
            info!(reason = e.reason, note = %e.note, "dry run");
            publish(
                &ctx.recorder,
                set_ref,
                e.severity,
                e.reason,
                e.note.clone(),
                e.ordinal,
            );
        }
    }
    let mut status = StatusReport::of(&plan.status, problem, &BTreeMap::new());
    // Marked only where there is something to report.
    status.dry_run = status != StatusReport::default();
    ctx.status.submit(K::KIND, set, rendered(&status));
    Ok(Requeue::requeue(
        plan.requeue_after
            .unwrap_or(ctx.config.resync)
            .min(ctx.config.resync),
    ))
}

/// Retries a failed reconcile with exponential backoff per set (1 s doubling, at most 5 min).
pub(super) fn error_policy<K: ServedSet>(set: Arc<K>, err: &Error, ctx: Arc<Context>) -> Requeue {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let key = (K::KIND, ns.clone(), name.clone());
    let delay = ctx.memory.update(&key, |m| {
        let (now, delay) = next_failure(m.failures, std::time::Instant::now());
        m.failures = Some(now);
        delay
    });
    ctx.forget_if_gone(K::KIND, &ns, &name);
    ctx.metrics
        .reconciles
        .get_or_create(&crate::runtime::metrics::ResultLabels {
            result: "error".into(),
        })
        .inc();
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::runtime::metrics::ReasonLabels {
            reason: err.reason().to_owned(),
        })
        .inc();
    warn!(statefulset = %set.name_any(), reason = err.reason(), error = %err, ?delay, "reconcile failed");
    Requeue::requeue(delay)
}

/// A set's failed reconciles in a row, and when the retry the last one scheduled is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failures {
    /// Failures counted toward the backoff.
    pub(super) count: u32,
    /// When the scheduled retry is due.
    pub(super) retry_at: std::time::Instant,
}

/// The count and the delay after a reconcile failed at `now`: the backoff (1 s doubling to
/// 5 min) grows only with failures of retries that were due, not with failures of reconciles
/// that watch events brought in between, which keep the retry already scheduled. Otherwise a
/// burst of events during one denial (a drain pod's status changes, the other ordinals) would
/// push the next retry minutes past the denial's end.
pub(super) fn next_failure(
    last: Option<Failures>,
    now: std::time::Instant,
) -> (Failures, Duration) {
    match last {
        Some(last) if now < last.retry_at => (last, last.retry_at - now),
        _ => {
            let count = last.map_or(1, |l| l.count.saturating_add(1));
            let delay = plan::backoff(count, Duration::from_secs(1), Duration::from_secs(300));
            (
                Failures {
                    count,
                    retry_at: now + delay,
                },
                delay,
            )
        }
    }
}
