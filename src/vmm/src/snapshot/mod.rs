//! Snapshots (issue 9, in progress): the versioned, checksummed file that holds a paused
//! microVM's state ([`file`]), and the KVM state of its vCPUs and VM, captured and put back
//! into a new VM ([`state`]). The API, guest memory and device state are not built yet.

pub mod file;
pub mod state;
