//! The example datastore.
