//! The typed failures of act ([`ActError`]): one variant per call that can fail, each with the
//! Warning reason it is reported under.

use crate::retain::RetainError;

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
