//! Snapshots (issue 9, in progress): the versioned, checksummed file that holds a paused
//! microVM's state ([`file`]). Capturing and restoring the state itself is not built yet.

pub mod file;
