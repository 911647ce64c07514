//! The runtime: everything that runs the pipeline rather than decides it. The watches, the
//! controller (kube-runtime's) and the per-set reconcile ([`controller`]), the caches and their
//! indexes ([`caches`], [`watch`]), the memo of the statuses written
//! ([`status_memo`]), leader election ([`leader`]), the admin server and metrics ([`admin`],
//! [`metrics`]), and the sweep of retained volumes ([`sweep`]).

pub mod admin;
pub mod caches;
pub mod controller;
pub mod leader;
pub mod metrics;
pub mod status_memo;
pub mod sweep;
pub mod watch;
