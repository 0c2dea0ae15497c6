//! A built microVM: its vCPUs (configured, then running on their threads), its devices'
//! event subscribers, and what the API may do to it after boot (pause, resume, keys).

use std::sync::{Arc, Mutex};

use devices::legacy::I8042;
use devices::virtio::balloon::Balloon;
use devices::virtio::block::Block;
use devices::virtio::net::Net;
use devices::virtio::rng::Entropy;
use devices::virtio::vsock::Vsock;
use event_manager::{EventManager, SubscriberOps};

use crate::event_loop::Subscriber;
use crate::memory::GuestMemory;
use crate::snapshot::{MicrovmState, SnapshotCreateParams, SnapshotError, SnapshotType};
use crate::vcpu::control::{self, VcpuHandle};
use crate::vcpu::stats::VcpuStats;
use crate::vcpu::{self, Vcpu};
use crate::vm::Vm;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Vcpu(#[from] vcpu::Error),
    #[error("cannot install the vCPU kick signal handler: {0}")]
    KickHandler(#[source] std::io::Error),
    #[error("vCPU {0} did not pause in time; the microVM keeps running")]
    PauseTimeout(u8),
}

/// The virtio devices by ID, for the API's changes after boot.
#[derive(Debug, Default)]
pub struct Devices {
    pub blocks: Vec<(String, Arc<Mutex<Block>>)>,
    pub nets: Vec<(String, Arc<Mutex<Net>>)>,
    pub entropy: Option<Arc<Mutex<Entropy>>>,
    pub balloon: Option<Arc<Mutex<Balloon>>>,
    pub vsock: Option<Arc<Mutex<Vsock>>>,
}

fn find<'a, T>(list: &'a [(String, Arc<Mutex<T>>)], id: &str) -> Option<&'a Arc<Mutex<T>>> {
    list.iter().find(|(name, _)| name == id).map(|(_, d)| d)
}

pub struct MicroVm {
    /// Configured but not started; emptied by [`MicroVm::start`].
    vcpus: Vec<Vcpu>,
    handles: Vec<VcpuHandle>,
    subscribers: Vec<Subscriber>,
    devices: Devices,
    /// KVM's counters of each vCPU that has them, by vCPU index.
    stats: Vec<(u8, VcpuStats)>,
    i8042: Arc<Mutex<I8042>>,
    paused: bool,
    /// Kept alive for the VM's lifetime: KVM's memory slots point into it.
    memory: GuestMemory,
    vm: Vm,
}

impl std::fmt::Debug for MicroVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroVm")
            .field("vcpus", &(self.vcpus.len() + self.handles.len()))
            .field("paused", &self.paused)
            .finish()
    }
}

impl MicroVm {
    pub(crate) fn new(
        vcpus: Vec<Vcpu>,
        stats: Vec<(u8, VcpuStats)>,
        subscribers: Vec<Subscriber>,
        devices: Devices,
        i8042: Arc<Mutex<I8042>>,
        memory: GuestMemory,
        vm: Vm,
    ) -> Self {
        MicroVm {
            vcpus,
            handles: Vec::new(),
            subscribers,
            devices,
            stats,
            i8042,
            paused: false,
            memory,
            vm,
        }
    }

    /// Hands the devices to the event loop and starts a thread per vCPU, each of which
    /// installs the vCPU seccomp filter from `filters` before it runs the guest.
    pub fn start(
        &mut self,
        event_manager: &mut EventManager<Subscriber>,
        filters: &seccomp::Filters,
    ) -> Result<(), Error> {
        control::install_kick_handler().map_err(Error::KickHandler)?;
        for subscriber in self.subscribers.drain(..) {
            event_manager.add_subscriber(subscriber);
        }
        for vcpu in std::mem::take(&mut self.vcpus) {
            self.handles.push(vcpu.start(filters.clone())?);
        }
        Ok(())
    }

    pub fn balloon(&self) -> Option<&Arc<Mutex<Balloon>>> {
        self.devices.balloon.as_ref()
    }

    /// The block device of drive `id`.
    pub fn block(&self, id: &str) -> Option<&Arc<Mutex<Block>>> {
        find(&self.devices.blocks, id)
    }

    /// The net device of interface `id`.
    pub fn net(&self, id: &str) -> Option<&Arc<Mutex<Net>>> {
        find(&self.devices.nets, id)
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Stops every vCPU; the guest's clocks keep running on the host, its code does not.
    pub fn pause(&mut self) -> Result<(), Error> {
        if let Err(index) = control::pause_all(&self.handles) {
            control::resume_all(&self.handles);
            return Err(Error::PauseTimeout(index));
        }
        self.paused = true;
        Ok(())
    }

    pub fn resume(&mut self) {
        control::resume_all(&self.handles);
        self.paused = false;
    }

    /// `PUT /snapshot/create`: the state file and the memory file of the paused microVM.
    pub fn create_snapshot(&self, params: &SnapshotCreateParams) -> Result<(), SnapshotError> {
        if !self.paused {
            return Err(SnapshotError::NotPaused);
        }
        if params.snapshot_type == SnapshotType::Diff {
            return Err(SnapshotError::Diff);
        }
        let d = &self.devices;
        let mut kinds = Vec::new();
        for (kind, present) in [
            ("block", !d.blocks.is_empty()),
            ("net", !d.nets.is_empty()),
            ("entropy", d.entropy.is_some()),
            ("balloon", d.balloon.is_some()),
            ("vsock", d.vsock.is_some()),
        ] {
            if present {
                kinds.push(kind);
            }
        }
        if !kinds.is_empty() {
            return Err(SnapshotError::Devices(kinds.join(", ")));
        }
        let vcpus = control::save_all(&self.handles).map_err(SnapshotError::Vcpu)?;
        let vm = crate::snapshot::state::save_vm(self.vm.fd())?;
        let memory = crate::snapshot::write_memory(&self.memory, &params.mem_file_path)?;
        let state = MicrovmState { memory, vcpus, vm };
        crate::snapshot::write_state(&params.snapshot_path, &state)
    }

    /// Presses and releases Ctrl+Alt+Del on the i8042 keyboard.
    pub fn send_ctrl_alt_del(&self) {
        devices::bus::lock(&self.i8042).press_ctrl_alt_del();
    }

    /// Logs KVM's counters for each vCPU (exits by reason), at Info: `--level Info`.
    pub fn log_exit_counts(&self) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        for (index, stats) in &self.stats {
            let counts: Vec<String> = stats
                .read()
                .into_iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            log::info!("vCPU {index} KVM counters: {}", counts.join(" "));
        }
        let emulated = crate::vcpu::emulate::emulated_counts();
        if !emulated.is_empty() {
            log::info!("instructions Ember emulated: {emulated:?}");
        }
    }
}
