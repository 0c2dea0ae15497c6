//! A built microVM: its vCPUs (configured, then running on their threads), its devices'
//! event subscribers, and what the API may do to it after boot (pause, resume, keys).

use std::sync::{Arc, Mutex};

use devices::legacy::I8042;
use devices::virtio::balloon::Balloon;
use devices::virtio::block::Block;
use event_manager::{EventManager, SubscriberOps};

pub use crate::device_set::Devices;
use crate::event_loop::Subscriber;
use crate::memory::GuestMemory;
use crate::snapshot::{
    DeviceStates, MicrovmState, Setup, SnapshotCreateParams, SnapshotError, SnapshotType,
};
use crate::vcpu::control::{self, VcpuHandle};
use crate::vcpu::stats::VcpuStats;
use crate::vcpu::{self, Vcpu};
use crate::vm::Vm;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Vcpu(#[from] vcpu::Error),
    #[error("cannot install the vCPU kick signal handler: {0}")]
    KickHandler(#[source] std::io::Error),
    #[error("vCPU {0} did not pause in time; the microVM keeps running")]
    PauseTimeout(u8),
}

/// KVM's counters of each vCPU that has them, by vCPU index.
pub(crate) type VcpuCounters = Vec<(u8, VcpuStats)>;

/// What a microVM is made of, as the builder hands it over.
pub(crate) struct Parts {
    pub vcpus: Vec<Vcpu>,
    pub stats: VcpuCounters,
    pub subscribers: Vec<Subscriber>,
    pub devices: Devices,
    pub i8042: Arc<Mutex<I8042>>,
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
    /// KVM logs the pages the guest writes (`track_dirty_pages`): diff snapshots work.
    track_dirty: bool,
    /// The Uffd backend, kept open while the VM runs.
    uffd: Option<crate::snapshot::uffd::Backend>,
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
    pub(crate) fn new(parts: Parts, memory: GuestMemory, vm: Vm, track_dirty: bool) -> Self {
        MicroVm {
            vcpus: parts.vcpus,
            handles: Vec::new(),
            subscribers: parts.subscribers,
            devices: parts.devices,
            stats: parts.stats,
            i8042: parts.i8042,
            paused: false,
            memory,
            vm,
            track_dirty,
            uffd: None,
        }
    }

    /// Keeps the Uffd backend's descriptor for the VM's life.
    pub(crate) fn keep_uffd(&mut self, uffd: crate::snapshot::uffd::Backend) {
        self.uffd = Some(uffd);
    }

    /// Makes [`MicroVm::start`] leave the vCPUs paused (a restored microVM not resumed yet).
    pub(crate) fn start_paused(&mut self) {
        self.paused = true;
        for vcpu in &self.vcpus {
            vcpu.hold();
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

    /// The virtio device of type `D` with this ID (a drive's or an interface's), for the
    /// API's changes after boot.
    pub fn device<D: 'static>(&self, id: &str) -> Option<&Mutex<D>> {
        self.devices.get(id)
    }

    /// The virtio device of type `D`, for a kind of which there is at most one (the
    /// balloon).
    pub fn only<D: 'static>(&self) -> Option<&Mutex<D>> {
        self.devices.only()
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

    /// `PUT /snapshot/create`: the state file and the memory file of the paused microVM, with
    /// `setup` (its configuration and MMDS data) from the VMM thread.
    pub fn create_snapshot(
        &self,
        params: &SnapshotCreateParams,
        setup: Setup,
    ) -> Result<(), SnapshotError> {
        if !self.paused {
            return Err(SnapshotError::NotPaused);
        }
        if params.snapshot_type == SnapshotType::Diff && !self.track_dirty {
            return Err(SnapshotError::Diff);
        }
        // Async disk requests in flight finish and are answered first, so that the saved
        // queues and interrupt state hold every one of them.
        for block in self.devices.all::<Block>() {
            devices::bus::lock(block).drain();
        }
        let vcpus = control::save_all(&self.handles).map_err(SnapshotError::Vcpu)?;
        let vm = crate::snapshot::state::save_vm(self.vm.fd())?;
        let d = &self.devices;
        // The balloon's lock is let go before the transports below lock their devices.
        let (balloon_actual_pages, balloon_hinting) = match d.only::<Balloon>() {
            Some(b) => {
                let b = devices::bus::lock(b);
                (Some(b.actual_pages()), b.hinting_state())
            }
            None => (None, None),
        };
        let devices = DeviceStates {
            serial: d
                .serial
                .as_ref()
                .map(|s| devices::bus::lock(s).snapshot())
                .unwrap_or_default(),
            virtio: d
                .transports
                .iter()
                .map(|t| devices::bus::lock(t).snapshot())
                .chain(
                    d.pci_transports
                        .iter()
                        .map(|t| devices::bus::lock(t).snapshot()),
                )
                .collect(),
            balloon_actual_pages,
            balloon_hinting,
        };
        let memory = match params.snapshot_type {
            SnapshotType::Full => {
                let (mem, path) = (&self.memory, &params.mem_file_path);
                crate::snapshot::write_memory(mem, &self.vm, self.track_dirty, path)?
            }
            SnapshotType::Diff => {
                crate::snapshot::write_diff_memory(&self.memory, &self.vm, &params.mem_file_path)?
            }
        };
        let state = MicrovmState {
            config: setup.config,
            boot_timer: setup.boot_timer,
            pci: setup.pci,
            memory,
            vcpus,
            vm,
            devices,
            mmds: setup.mmds,
        };
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
