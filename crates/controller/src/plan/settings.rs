//! The per-set knobs of the planner: validated annotations and controller flags.

use std::time::Duration;

use crate::config::{OnScaleUp, SuccessProof};

/// Whether new drains may start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewDrains {
    /// Yes, from the drain template with this hash.
    Allowed {
        /// Hash of the current drain template.
        template_hash: String,
    },
    /// No: the set opted out or its drain settings are invalid. Drains in flight are still
    /// completed and cleaned up.
    Stopped {
        /// Why, for the status.
        why: String,
    },
}

/// The per-set knobs of the planner (validated annotations and controller flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Whether new drains may start.
    pub new_drains: NewDrains,
    /// Most drains at once (`None`: unlimited).
    pub max_concurrent: Option<u32>,
    /// What a scale-up does to a drain in flight.
    pub on_scale_up: OnScaleUp,
    /// Most failed attempts before giving up.
    pub max_attempts: Option<u32>,
    /// Time after the first attempt after which retrying stops.
    pub deadline: Option<Duration>,
    /// A running drain pod whose progress has not changed this long is stalled.
    pub stall_after: Option<Duration>,
    /// First retry delay; doubles per failed attempt.
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// A drain pod that has not started (or is blocked) this long after its creation is stuck.
    pub stuck_after: Duration,
    /// A running drain pod that published no progress and changed no container state this
    /// long is quiet: warned once, left running (`None`: never).
    pub quiet_after: Option<Duration>,
    /// A drain pod whose containers restarted this often is stuck.
    pub max_restarts: u32,
    /// A drain pod's node whose `Ready` condition has not been true this long is lost.
    pub node_lost_after: Duration,
    /// Under `finish`, the longest a returning ordinal waits for its drain.
    pub scale_up_wait: Duration,
    /// Whether drained claims are deleted only once approved (`drain-approval: manual`).
    pub manual_approval: bool,
    /// What proves that a drain pod finished (`drain-success-proof`).
    pub proof: SuccessProof,
    /// How long a drained claim's volume is retained after the claim is deleted
    /// (`drain-retain-volume-for`).
    pub retain_volume_for: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            new_drains: NewDrains::Allowed {
                template_hash: String::new(),
            },
            max_concurrent: Some(1),
            on_scale_up: OnScaleUp::Cancel,
            max_attempts: None,
            deadline: None,
            stall_after: None,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
            stuck_after: Duration::from_secs(300),
            quiet_after: Some(Duration::from_secs(1800)),
            max_restarts: 3,
            node_lost_after: Duration::from_secs(60),
            scale_up_wait: Duration::from_secs(300),
            manual_approval: false,
            proof: SuccessProof::CompletionRecord,
            retain_volume_for: None,
        }
    }
}

/// How long a volume is retained when `drain-retain-volume-for` is set but cannot be read (on
/// the set, or in a drain pod's recorded settings): retaining costs storage for a while, not
/// retaining would cost the data the user asked to keep.
pub const RETAIN_FALLBACK: Duration = Duration::from_secs(7 * 86_400);
