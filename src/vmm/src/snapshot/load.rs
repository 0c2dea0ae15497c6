//! `PUT /snapshot/load`: Firecracker's request body, and everything checked before a single
//! KVM object exists, so that a bad request leaves the fresh ember as it was: the state file
//! (format, version, checksum), its configuration, the overrides, and the memory backend
//! (the memory file's size against the snapshot's guest memory).

use std::fs::File;
use std::path::Path;

use serde::Deserialize;

use super::{file, MicrovmState};
use crate::config::{ConfigError, HugePages};
use crate::resources::VmResources;

/// `PUT /snapshot/load` (Firecracker's `SnapshotLoadParams`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoadParams {
    pub snapshot_path: String,
    /// Deprecated in Firecracker: a `File` backend.
    pub mem_file_path: Option<String>,
    pub mem_backend: Option<MemoryBackend>,
    /// Deprecated in Firecracker: `track_dirty_pages`.
    #[serde(default)]
    pub enable_diff_snapshots: bool,
    #[serde(default)]
    pub track_dirty_pages: bool,
    #[serde(default)]
    pub resume_vm: bool,
    #[serde(default)]
    pub network_overrides: Vec<NetworkOverride>,
    pub vsock_override: Option<VsockOverride>,
    /// Advance the guest clock by the wall-clock time since the snapshot.
    #[serde(default)]
    pub clock_realtime: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBackend {
    pub backend_type: MemoryBackendType,
    pub backend_path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum MemoryBackendType {
    /// The memory file, mapped copy-on-write.
    File,
    /// A page-fault handler process reached through the Unix socket at `backend_path`.
    Uffd,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    pub iface_id: String,
    pub host_dev_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockOverride {
    pub uds_path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("Loading a microVM snapshot not allowed after configuring boot-specific resources.")]
    Configured,
    #[error("give either mem_backend or the deprecated mem_file_path, not both")]
    TwoBackends,
    #[error("mem_backend is required (or the deprecated mem_file_path)")]
    NoBackend,
    #[error(transparent)]
    File(#[from] file::SnapshotFileError),
    #[error(
        "Cannot restore hugetlbfs backed snapshot by mapping the memory file. Please use uffd."
    )]
    HugePagesFromFile,
    #[error("the snapshot file's guest memory regions do not match its {mib} MiB machine")]
    Regions { mib: usize },
    #[error("the snapshot file has {found} vCPU states for its {expected} vCPUs")]
    VcpuCount { found: usize, expected: u8 },
    #[error("cannot open the memory file {path}: {source}")]
    OpenMemory {
        path: String,
        source: hostfile::Error,
    },
    #[error(
        "the memory file {path} is {found} bytes; the snapshot's guest memory is {expected} bytes"
    )]
    MemorySize {
        path: String,
        found: u64,
        expected: u64,
    },
    #[error("network_overrides names interface {0}, which the snapshot does not have")]
    NoSuchIface(String),
    #[error("vsock_override is given, but the snapshot has no vsock device")]
    NoVsock,
    #[error("the snapshot's configuration is refused here: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Uffd(#[from] super::uffd::UffdError),
    #[error("the snapshot's guest memory cannot be set up: {0}")]
    Memory(#[from] crate::memory::Error),
    #[error("the microVM cannot be rebuilt: {0}")]
    Build(#[from] crate::builder::BuildError),
    #[error("the snapshot's MMDS data is refused: {0}")]
    Mmds(#[from] mmds::StoreError),
}

/// Where guest RAM comes from.
#[derive(Debug)]
pub enum Memory {
    /// The memory file, checked to be as large as the snapshot's guest memory.
    File(File),
    /// The handler's socket.
    Uffd(String),
}

/// A checked load request: the snapshot's state, the configuration to rebuild (overrides
/// applied, vsock socket bound) and where guest RAM comes from.
#[derive(Debug)]
pub struct Prepared {
    pub state: MicrovmState,
    pub resources: VmResources,
    pub memory: Memory,
}

impl SnapshotLoadParams {
    pub fn dirty_tracking(&self) -> bool {
        self.track_dirty_pages || self.enable_diff_snapshots
    }

    fn backend(&self) -> Result<MemoryBackend, LoadError> {
        match (&self.mem_backend, &self.mem_file_path) {
            (Some(_), Some(_)) => Err(LoadError::TwoBackends),
            (None, None) => Err(LoadError::NoBackend),
            (Some(backend), None) => Ok(backend.clone()),
            (None, Some(path)) => Ok(MemoryBackend {
                backend_type: MemoryBackendType::File,
                backend_path: path.clone(),
            }),
        }
    }

    /// Checks everything the request and its files say, before anything is built.
    pub fn prepare(&self) -> Result<Prepared, LoadError> {
        let backend = self.backend()?;
        let state: MicrovmState = file::load(Path::new(&self.snapshot_path))?;
        let machine = state.config.machine_config.clone().unwrap_or_default();
        let expected_regions = machine
            .mem_bytes()
            .map(crate::memory::layout)
            .unwrap_or_default();
        if state.memory != expected_regions {
            return Err(LoadError::Regions {
                mib: machine.mem_size_mib,
            });
        }
        if state.vcpus.len() != usize::from(machine.vcpu_count) {
            return Err(LoadError::VcpuCount {
                found: state.vcpus.len(),
                expected: machine.vcpu_count,
            });
        }
        let mut config = state.config.clone();
        for o in &self.network_overrides {
            let iface = config
                .network_interfaces
                .iter_mut()
                .find(|i| i.iface_id == o.iface_id)
                .ok_or_else(|| LoadError::NoSuchIface(o.iface_id.clone()))?;
            iface.host_dev_name = o.host_dev_name.clone();
        }
        if let Some(o) = &self.vsock_override {
            let vsock = config.vsock.as_mut().ok_or(LoadError::NoVsock)?;
            vsock.uds_path = o.uds_path.clone();
        }
        let memory = match backend.backend_type {
            // A private file mapping cannot be hugetlbfs; Firecracker refuses it the same way.
            MemoryBackendType::File if machine.huge_pages != HugePages::None => {
                return Err(LoadError::HugePagesFromFile)
            }
            MemoryBackendType::File => {
                Memory::File(memory_file(&backend.backend_path, &state.memory)?)
            }
            MemoryBackendType::Uffd => Memory::Uffd(backend.backend_path),
        };
        // Last, as it binds the vsock socket.
        let mut resources = VmResources::from_snapshot(config)?;
        resources.pci_enabled = state.pci;
        if state.boot_timer {
            // Its MMIO window must stay taken; its start time is this process's.
            resources.boot_timer = Some(std::time::Instant::now());
        }
        Ok(Prepared {
            state,
            resources,
            memory,
        })
    }
}

/// Opens the memory file and checks that it holds exactly the snapshot's guest memory.
fn memory_file(path: &str, regions: &[(u64, u64)]) -> Result<File, LoadError> {
    let open_err = |source| LoadError::OpenMemory {
        path: path.to_string(),
        source,
    };
    let file = hostfile::open(Path::new(path), hostfile::Kind::Regular, false).map_err(open_err)?;
    let found = file.metadata().map_err(|e| open_err(e.into()))?.len();
    let expected: u64 = regions.iter().map(|r| r.1).sum();
    if found != expected {
        return Err(LoadError::MemorySize {
            path: path.to_string(),
            found,
            expected,
        });
    }
    Ok(file)
}
