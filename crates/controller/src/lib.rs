//! The StatefulSet drain controller: observe → validate → plan → act → report.
