//! How this controller names itself to the API server: the field manager of its writes, which is
//! also the reporting controller of its Events and the holder identity prefix of its Lease.

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "statefulset-drain-controller";
