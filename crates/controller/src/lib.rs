//! The StatefulSet drain controller: observe → validate → plan → act → report.

pub mod config;
#[cfg(test)]
pub mod fixtures;
pub mod plan;
pub mod template;
