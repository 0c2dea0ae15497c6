//! Snapshots (issue 9, in progress). `PUT /snapshot/create` on a paused microVM writes the
//! state file ([`file`]: versioned and checksummed) with the KVM state of its vCPUs and VM
//! ([`state`]), and the memory file (guest RAM, region after region). Loading a snapshot,
//! diff snapshots and device state are not built yet, so a microVM with virtio devices is
//! refused.

pub mod file;
pub mod state;

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use vm_memory::{Address, Bytes, GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::GuestMemory;
use state::{StateError, VcpuState, VmState};

/// `PUT /snapshot/create` (Firecracker's `SnapshotCreateParams`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateParams {
    pub mem_file_path: String,
    pub snapshot_path: String,
    #[serde(default)]
    pub snapshot_type: SnapshotType,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum SnapshotType {
    #[default]
    Full,
    Diff,
}

/// What the state file holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct MicrovmState {
    /// Guest RAM regions (guest address, bytes), in the memory file's order.
    pub memory: Vec<(u64, u64)>,
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("a snapshot can only be created of a paused microVM; PATCH /vm to Paused first")]
    NotPaused,
    #[error("diff snapshots are not available in Ember yet; create a Full snapshot")]
    Diff,
    #[error("snapshots of microVMs with virtio devices ({0}) are not available in Ember yet")]
    Devices(String),
    #[error("cannot capture the vCPU state: {0}")]
    Vcpu(String),
    #[error("{0}")]
    State(#[from] StateError),
    #[error("{0}")]
    File(#[from] file::SnapshotFileError),
    #[error("cannot write the memory file {path}: {reason}")]
    Memory { path: String, reason: String },
}

/// Writes guest RAM to `path`, region after region; returns the regions.
pub fn write_memory(mem: &GuestMemory, path: &str) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let fail = |reason: String| SnapshotError::Memory {
        path: path.to_string(),
        reason,
    };
    let mut out = std::fs::File::create(path).map_err(|e| fail(e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut regions = Vec::new();
    for region in mem.iter() {
        let (start, len) = (region.start_addr(), region.len());
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            mem.read_slice(&mut buf[..n], start.unchecked_add(done))
                .map_err(|e| fail(e.to_string()))?;
            out.write_all(&buf[..n]).map_err(|e| fail(e.to_string()))?;
            done += n as u64;
        }
        regions.push((start.raw_value(), len));
    }
    out.sync_all().map_err(|e| fail(e.to_string()))?;
    Ok(regions)
}

/// Writes the state file.
pub fn write_state(path: &str, state: &MicrovmState) -> Result<(), SnapshotError> {
    Ok(file::save(Path::new(path), state)?)
}
