//! The drainer.
