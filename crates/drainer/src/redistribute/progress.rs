//! Progress of a redistribution: counters, log lines, and the
//! [`PROGRESS`](drain_api::pod_annotations::PROGRESS) annotation on the drain pod itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use drain_api::pod_annotations;
use drain_api::progress::DrainProgress;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};

/// Where progress is published: a patch of one annotation on the drain pod.
#[derive(Clone)]
pub struct PodAnnotator {
    pods: Api<Pod>,
    name: String,
}

impl std::fmt::Debug for PodAnnotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodAnnotator")
            .field("pod", &self.name)
            .finish()
    }
}

impl PodAnnotator {
    /// Publishes on pod `name` through `pods`.
    pub fn new(pods: Api<Pod>, name: impl Into<String>) -> Self {
        Self {
            pods,
            name: name.into(),
        }
    }

    /// Writes `progress`; a failure is logged, never fatal (progress is informational, and a
    /// drain must not fail because it cannot report).
    async fn publish(&self, progress: &DrainProgress) -> bool {
        let patch = serde_json::json!({
            "metadata": {"annotations": {pod_annotations::PROGRESS: progress.render()}}
        });
        let pp = PatchParams {
            field_manager: Some("drainer".to_owned()),
            ..PatchParams::default()
        };
        match self.pods.patch(&self.name, &pp, &Patch::Merge(patch)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(pod = %self.name, error = %drain_logging::error_chain(&e), "failed to publish progress");
                false
            }
        }
    }
}

/// Counters of one redistribution.
pub struct Progress {
    records_total: u64,
    bytes_total: u64,
    /// Records handed over (stored by their owner, or already there).
    pub records: u64,
    /// Bytes of those records.
    pub bytes: u64,
    /// Of [`records`](Self::records), those whose owner held a newer write (its copy kept).
    pub newer_there: u64,
    /// Bytes handed to connections so far, records in flight and retries included.
    sent: Arc<AtomicU64>,
    started: Instant,
    publisher: Option<PodAnnotator>,
    published: Option<DrainProgress>,
}

impl Progress {
    /// Counters for `records` records of `bytes` bytes, published through `publisher`; `sent`
    /// counts the bytes the transfers put on the wire.
    pub fn new(
        records: usize,
        bytes: u64,
        publisher: Option<PodAnnotator>,
        sent: Arc<AtomicU64>,
    ) -> Self {
        Self {
            records_total: records as u64,
            bytes_total: bytes,
            records: 0,
            bytes: 0,
            newer_there: 0,
            sent,
            started: Instant::now(),
            publisher,
            published: None,
        }
    }

    /// Counts one record handed over.
    pub fn moved(&mut self, bytes: u64, newer_there: bool) {
        self.records += 1;
        self.bytes += bytes;
        self.newer_there += u64::from(newer_there);
    }

    /// Records or bytes found after the start (new files, files that grew) raise the totals.
    pub fn at_least(&mut self, records_left: usize, bytes_left: u64) {
        self.records_total = self.records_total.max(self.records + records_left as u64);
        self.bytes_total = self.bytes_total.max(self.bytes + bytes_left);
    }

    /// The annotation's content now.
    pub fn snapshot(&self) -> DrainProgress {
        DrainProgress {
            records_moved: self.records,
            records_remaining: self.records_total.saturating_sub(self.records),
            bytes_moved: self.bytes,
            bytes_remaining: self.bytes_total.saturating_sub(self.bytes),
            bytes_sent: self.sent.load(Ordering::Relaxed),
            changed_at: jiff::Timestamp::now().to_string(),
        }
    }

    /// Publishes the counters if they changed since the last publish (or never were).
    pub async fn publish(&mut self) {
        let Some(publisher) = &self.publisher else {
            return;
        };
        let now = self.snapshot();
        if self
            .published
            .as_ref()
            .is_some_and(|last| !last.counters_differ(&now))
        {
            return;
        }
        if publisher.publish(&now).await {
            self.published = Some(now);
        }
    }

    /// Logs the counters with `message`.
    pub fn log(&self, message: &'static str) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        tracing::info!(
            records_moved = self.records,
            records_newer_there = self.newer_there,
            records_total = self.records_total,
            bytes_moved = self.bytes,
            bytes_sent = self.sent.load(Ordering::Relaxed),
            elapsed_secs = format!("{secs:.1}"),
            records_per_sec = format!("{:.1}", self.records as f64 / secs),
            mib_per_sec = format!("{:.2}", self.bytes as f64 / secs / (1024.0 * 1024.0)),
            "{message}"
        );
    }
}
