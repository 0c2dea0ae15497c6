//! Snapshots. `PUT /snapshot/create` on a paused microVM writes the state file ([`file`]:
//! versioned and checksummed) with the microVM's configuration, the KVM state of its vCPUs
//! and VM ([`state`]) and its devices' state, and the memory file (guest RAM, region after
//! region). `PUT /snapshot/load` on a fresh ember ([`load`]) rebuilds the same machine from
//! them, with guest RAM mapped from the memory file.

pub mod file;
pub mod load;
mod memory_file;
pub mod rebase;
mod restore;
pub mod state;
pub mod uffd;

pub use memory_file::{write_diff_memory, write_memory};
pub use restore::restore;

use std::path::Path;

use serde::{Deserialize, Serialize};

use devices::legacy::SerialSnapshot;
use devices::virtio::snapshot::TransportSnapshot;

use crate::config::VmConfig;
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
    /// The configuration the microVM was built from, as `GET /vm/config` shows it.
    pub config: VmConfig,
    /// Whether the boot timer took the first MMIO window (`--boot-timer`).
    pub boot_timer: bool,
    /// Whether the virtio devices are on the PCI bus (`--enable-pci`); absent in snapshots
    /// from before virtio-pci.
    #[serde(default)]
    pub pci: bool,
    /// Guest RAM regions (guest address, bytes), in the memory file's order.
    pub memory: Vec<(u64, u64)>,
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
    pub devices: DeviceStates,
    /// The MMDS data store (`null` when empty).
    pub mmds: serde_json::Value,
}

/// The devices' own state; the virtio transports in the order the builder places them.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeviceStates {
    pub serial: SerialSnapshot,
    pub virtio: Vec<TransportSnapshot>,
    /// The pages the balloon's driver said it holds.
    pub balloon_actual_pages: Option<u32>,
    /// Where free page hinting stood, when the balloon offers it.
    pub balloon_hinting: Option<devices::virtio::balloon::HintingState>,
}

/// What the VMM thread adds to a snapshot besides the machine: its configuration and the
/// MMDS data store.
#[derive(Debug)]
pub struct Setup {
    pub config: VmConfig,
    pub boot_timer: bool,
    pub pci: bool,
    pub mmds: serde_json::Value,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("a snapshot can only be created of a paused microVM; PATCH /vm to Paused first")]
    NotPaused,
    #[error("a Diff snapshot needs dirty page tracking: set track_dirty_pages in machine-config (or in the snapshot load request)")]
    Diff,
    #[error("cannot capture the vCPU state: {0}")]
    Vcpu(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    File(#[from] file::SnapshotFileError),
    #[error("cannot write the memory file {path}: {reason}")]
    Memory { path: String, reason: String },
    #[error(transparent)]
    Load(#[from] load::LoadError),
}

/// Writes the state file.
pub fn write_state(path: &str, state: &MicrovmState) -> Result<(), SnapshotError> {
    Ok(file::save(Path::new(path), state)?)
}
