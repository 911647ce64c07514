//! The leader's sweep of retained volumes ([`crate::retain`]): a pass at start, at the earliest
//! end of a retention, when woken (a volume was marked), and every [`SWEEP_EVERY`]; each pass
//! releases the volumes whose retention is over or that were restored.

use std::sync::Arc;
use std::time::Duration;

use drain_api::retained;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::retain::{SweepStep, sweep_step};
use crate::runtime::leader::Leadership;
use crate::runtime::metrics::Metrics;

/// Longest the sweep sleeps without being woken (a retention written by another replica, a
/// restore done by hand, a missed wake-up are seen within this).
pub const SWEEP_EVERY: Duration = Duration::from_secs(300);

/// Wait after a failed sweep.
const SWEEP_RETRY: Duration = Duration::from_secs(30);

/// One pass: releases the volumes whose retention is over; returns the earliest end of the
/// others. Only volumes of claims in `namespaces` (empty: any namespace) are looked at. Its
/// requests count in `metrics` like the reconciles' own.
async fn sweep_once(
    api: &Api<PersistentVolume>,
    namespaces: &[String],
    field_manager: &str,
    metrics: &Metrics,
) -> Result<Option<Timestamp>, kube::Error> {
    let listed = api
        .list(&ListParams::default().labels(&format!("{}=true", retained::LABEL)))
        .await;
    metrics.request("list", "persistentvolumes", &listed);
    let listed = listed?;
    let now = Timestamp::now();
    let pp = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    let mut next: Option<Timestamp> = None;
    for pv in &listed.items {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        match sweep_step(pv, now, namespaces) {
            SweepStep::Skip => {}
            SweepStep::Wait(until) => next = Some(next.map_or(until, |n| n.min(until))),
            SweepStep::Release { patch, why } => {
                let released = api.patch(name, &pp, &Patch::Merge(patch)).await;
                metrics.request("patch", "persistentvolumes", &released);
                match released {
                    Ok(_) => info!(volume = name, why, "retained volume released"),
                    // Changed meanwhile: read again at the next pass, soon.
                    Err(e) => {
                        warn!(volume = name, error = %e, "failed to release a retained volume");
                        let soon = now + SWEEP_RETRY;
                        next = Some(next.map_or(soon, |n| n.min(soon)));
                    }
                }
            }
        }
    }
    Ok(next)
}

/// Sweeps for ever (see the module); only while this replica leads. One sweep for the whole
/// process, over the volumes of claims in `namespaces` (the watched ones; empty: all).
pub async fn sweep(
    client: Client,
    leadership: Leadership,
    namespaces: Vec<String>,
    wake: Arc<Notify>,
    field_manager: &'static str,
    metrics: Arc<Metrics>,
) {
    let api: Api<PersistentVolume> = Api::all(client);
    let mut denied_reported = false;
    loop {
        let mut wait = SWEEP_EVERY;
        if leadership.fence().is_some() {
            match sweep_once(&api, &namespaces, field_manager, &metrics).await {
                Ok(next) => {
                    denied_reported = false;
                    if let Some(next) = next {
                        let left = next.duration_since(Timestamp::now());
                        let left = Duration::try_from(left).unwrap_or_default();
                        wait = wait.min(left).max(Duration::from_secs(1));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    // Only sets that retain volumes need this right (an install without the
                    // retained-volumes RBAC): said once, and not as a failure, since those sets'
                    // own attempts fail with a Warning and keep their claims.
                    if !denied_reported {
                        info!(
                            "no right to list PersistentVolumes: retained volumes are not released, and sets with drain-retain-volume-for keep their drained claims (grant get, list and patch on persistentvolumes: artifacts/components/retained-volumes)"
                        );
                        denied_reported = true;
                    }
                }
                Err(e) => {
                    warn!(error = %e, "failed to list retained volumes");
                    wait = SWEEP_RETRY;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
    }
}
