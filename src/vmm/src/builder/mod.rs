//! The build recipe, in order: `VmResources` → guest memory → KVM VM → kernel and initrd →
//! devices (and their command-line entries) → boot information → configured vCPUs. The
//! result is a [`MicroVm`] whose vCPUs have not run yet.

mod attach;
mod boot;
mod pci;

use std::fs::File;
use std::sync::Arc;

use arch::cpuid::Topology;
use arch::layout::{self, CMDLINE_MAX_SIZE};
use devices::virtio::balloon::Balloon;

use self::attach::{attach_devices, Attached};
pub(crate) use self::attach::{VirtioSpec, Wiring};
use crate::config::{self, BootSourceConfig};
use crate::memory::{self, GuestMemory};
use crate::microvm::{MicroVm, Parts, VcpuCounters};
use crate::resources::VmResources;
use crate::snapshot::MicrovmState;
use crate::vcpu::stats::VcpuStats;
use crate::vcpu::{self, BootEntry, Vcpu, VcpuShared};
use crate::vm::{self, Vm};
use crate::ExitSignal;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no boot source is configured: set boot-source.kernel_image_path")]
    NoBootSource,
    #[error(transparent)]
    Memory(#[from] memory::Error),
    #[error(transparent)]
    Vm(#[from] vm::Error),
    /// `what`: "kernel image" or "initrd".
    #[error("cannot open the {what} {path}: {source}")]
    Open {
        what: &'static str,
        path: String,
        source: hostfile::Error,
    },
    #[error(transparent)]
    Load(#[from] arch::loader::Error),
    #[error("the kernel command line is {len} bytes long; at most {} fit", CMDLINE_MAX_SIZE - 1)]
    CmdlineTooLong { len: usize },
    #[error(transparent)]
    BootParams(#[from] arch::boot_params::Error),
    #[error(transparent)]
    MpTable(#[from] arch::mptable::Error),
    #[error(transparent)]
    Acpi(#[from] arch::acpi::Error),
    #[error("cannot write the boot tables into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    #[error("drive {id}: {source}")]
    Drive {
        id: String,
        source: devices::virtio::block::Error,
    },
    #[error("network interface {id}: {source}")]
    Net {
        id: String,
        source: devices::virtio::net::Error,
    },
    #[error("cannot place a device on the bus: {0}")]
    Bus(#[from] devices::bus::Error),
    #[error("cannot create an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("cannot set up the vsock device: {0}")]
    Vsock(#[source] std::io::Error),
    #[error(transparent)]
    Vcpu(#[from] vcpu::Error),
    #[error("there are more MMIO devices than interrupt lines 5 to 23 can serve")]
    TooManyDevices,
    #[error(transparent)]
    PciBusFull(#[from] devices::pci::root::BusFull),
    #[error("cannot copy the console's file descriptors: {0}")]
    Console(#[source] std::io::Error),
    #[error("cannot open the serial output file {path}: {source}")]
    SerialOutput {
        path: String,
        source: hostfile::Error,
    },
    #[error("the snapshot's serial console state is not valid: {0}")]
    SerialState(#[source] std::io::Error),
    #[error(transparent)]
    State(#[from] crate::snapshot::state::StateError),
    #[error(transparent)]
    DeviceState(#[from] devices::virtio::snapshot::RestoreError),
    #[error("the snapshot has {saved} virtio devices; its configuration makes {built}")]
    DeviceCount { saved: usize, built: usize },
    #[error(transparent)]
    CpuTemplate(#[from] vcpu::template::TemplateError),
}

/// The CPU template of the microVM, checked against this host.
fn guest_cpu(ctx: &Context, caps: &vm::HostCaps) -> Result<vcpu::template::GuestCpu, BuildError> {
    let r = ctx.resources;
    let cpu = vcpu::template::resolve(
        r.machine_config.cpu_template,
        r.cpu_template.as_ref(),
        caps,
        |n| ctx.vm.has_capability(n),
    )?;
    if caps.pvm && cpu != vcpu::template::GuestCpu::default() {
        log::warn!(
            "this host's KVM is kvm_pvm, which answers most of the guest's CPUID from the host CPU: the CPU template is given to KVM, but the guest sees only part of it"
        );
    }
    Ok(cpu)
}

/// Where the guest's serial console goes and comes from. Each build takes copies of the
/// descriptors, so that a failed `InstanceStart` can be retried.
#[derive(Debug)]
pub struct Console {
    pub output: File,
    pub input: Option<File>,
}

/// What the VMM lends every microVM it builds.
#[derive(Debug)]
pub struct Host<'a> {
    pub console: &'a Console,
    /// Where vCPUs and devices report that the VM must stop.
    pub exit: &'a Arc<ExitSignal>,
    pub mmds: &'a mmds::SharedStore,
    pub metrics: &'a Arc<telemetry::Metrics>,
}

/// Builds a VM from `resources`, ready for [`MicroVm::start`].
pub fn build(resources: &VmResources, host: &Host) -> Result<MicroVm, BuildError> {
    let boot = resources
        .boot_source
        .as_ref()
        .ok_or(BuildError::NoBootSource)?;
    let machine = &resources.machine_config;
    let mem_bytes = machine.mem_bytes().map_err(|_| memory::Error::Map {
        mib: machine.mem_size_mib as u64,
        reason: "it overflows a 64-bit address".into(),
    })?;

    let mem = memory::create(mem_bytes, machine.huge_pages)?;
    let track_dirty = machine.track_dirty_pages;
    in_new_vm(resources, host, mem, track_dirty, |ctx| {
        assemble(ctx, mem_bytes, boot)
    })
}

/// Rebuilds a snapshot's microVM from `resources` (its configuration, overrides applied) on
/// `mem` (its guest RAM, already in place): the same devices at the same addresses, in their
/// saved state, and the vCPUs and VM in KVM's saved state. Nothing runs yet.
pub fn restore(
    resources: &VmResources,
    state: &MicrovmState,
    mem: GuestMemory,
    track_dirty: bool,
    clock_realtime: bool,
    host: &Host,
) -> Result<MicroVm, BuildError> {
    in_new_vm(resources, host, mem, track_dirty, |ctx| {
        let parts = rebuild(ctx, state)?;
        // KVM needs guest memory in place for some MSRs (kvmclock, async PF, PV EOI, steal
        // time).
        for (vcpu, saved) in parts.vcpus.iter().zip(&state.vcpus) {
            vcpu.restore_state(saved)?;
        }
        crate::snapshot::state::restore_vm(ctx.vm.fd(), &state.vm, clock_realtime)?;
        for transport in &parts.devices.transports {
            devices::bus::lock(transport).announce_restore();
        }
        for transport in &parts.devices.pci_transports {
            devices::bus::lock(transport).announce_restore();
        }
        Ok(parts)
    })
}

/// A KVM VM over `mem`, its parts made by `make`, and the microVM that owns them all.
fn in_new_vm(
    resources: &VmResources,
    host: &Host,
    mem: GuestMemory,
    track_dirty: bool,
    make: impl FnOnce(&Context) -> Result<Parts, BuildError>,
) -> Result<MicroVm, BuildError> {
    let vm = Vm::new(&mem, track_dirty)?;
    let ctx = Context {
        vm: &vm,
        mem: &mem,
        resources,
        host,
    };
    let parts = make(&ctx)?;
    Ok(MicroVm::new(parts, mem, vm, track_dirty))
}

/// The devices of a restore in their saved state, and the vCPUs with their CPUID.
fn rebuild(ctx: &Context, state: &MicrovmState) -> Result<Parts, BuildError> {
    let caps = ctx.vm.host_caps()?;
    let attached = attach_devices(ctx, Some(&state.devices.serial))?;
    let (mmio, pci) = (
        &attached.devices.transports,
        &attached.devices.pci_transports,
    );
    if mmio.len() + pci.len() != state.devices.virtio.len() {
        return Err(BuildError::DeviceCount {
            saved: state.devices.virtio.len(),
            built: mmio.len() + pci.len(),
        });
    }
    let machine = &ctx.resources.machine_config;
    let cpu = guest_cpu(ctx, &caps)?;
    // CPUID now: KVM takes it only before the vCPU's state.
    let (vcpus, stats) = create_vcpus(ctx, &attached, &caps, |index, fd| {
        Ok(Vcpu::configure(
            fd,
            topology(machine, index),
            &caps,
            &cpu,
            None,
        )?)
    })?;
    if let Some(balloon) = attached.devices.only::<Balloon>() {
        let mut balloon = devices::bus::lock(balloon);
        if let Some(pages) = state.devices.balloon_actual_pages {
            balloon.restore_actual_pages(pages);
        }
        if let Some(hinting) = state.devices.balloon_hinting {
            balloon.restore_hinting(hinting);
        }
    }
    // A microVM's virtio devices are all virtio-mmio or all virtio-pci.
    for (transport, saved) in mmio.iter().zip(&state.devices.virtio) {
        devices::bus::lock(transport).restore(saved)?;
    }
    for (transport, saved) in pci.iter().zip(&state.devices.virtio) {
        devices::bus::lock(transport).restore(saved)?;
    }
    if let Some(root) = &attached.pci_root {
        devices::bus::lock(root).refresh_bars();
    }
    Ok(into_parts(attached, vcpus, stats))
}

/// Everything but the memory slots: kernel, initrd, devices, boot tables, vCPUs.
fn assemble(ctx: &Context, mem_bytes: u64, boot: &BootSourceConfig) -> Result<Parts, BuildError> {
    let (vm, mem) = (ctx.vm, ctx.mem);
    let machine = &ctx.resources.machine_config;
    let kernel = boot::load_kernel(mem, &boot.kernel_image_path)?;
    let low_ram_end = mem_bytes.min(layout::MMIO_GAP_START);
    let initrd = match &boot.initrd_path {
        Some(path) => Some(boot::load_initrd(mem, path, &kernel, low_ram_end)?),
        None => None,
    };

    let caps = vm.host_caps()?;
    let cpu = guest_cpu(ctx, &caps)?;
    let mut cmdline = boot.boot_args().to_string();
    if !ctx.resources.pci_enabled {
        cmdline.push_str(" pci=off");
    }
    if caps.pvm {
        cmdline.push(' ');
        cmdline.push_str(crate::pvm::BOOT_ARGS);
    }
    let attached = attach_devices(ctx, None)?;
    cmdline.push_str(&attached.kernel_args);

    boot::write_cmdline(mem, &cmdline)?;
    let described = boot::Machine {
        vcpus: machine.vcpu_count,
        mem_bytes,
        cmdline_size: cmdline.len() + 1,
        virtio_mmio: &attached.virtio_mmio,
        pci: ctx.resources.pci_enabled,
    };
    boot::write_boot_info(mem, &kernel, initrd, &described)?;
    let cr3 = arch::paging::write_identity_tables(mem)?;
    let entry = BootEntry {
        protocol: kernel.protocol,
        entry: kernel.entry,
        cr3,
    };
    let (vcpus, stats) = create_vcpus(ctx, &attached, &caps, |index, fd| {
        let topo = topology(machine, index);
        Vcpu::configure(fd, topo, &caps, &cpu, (index == 0).then_some(entry))?;
        Ok(())
    })?;
    Ok(into_parts(attached, vcpus, stats))
}

/// What every build step reads.
struct Context<'a> {
    vm: &'a Vm,
    mem: &'a GuestMemory,
    resources: &'a VmResources,
    host: &'a Host<'a>,
}

fn topology(machine: &config::MachineConfig, index: u8) -> Topology {
    Topology {
        cpu_index: index,
        count: machine.vcpu_count,
        smt: machine.smt,
    }
}

/// Creates the vCPUs, each set up by `setup` (boot state or a snapshot's).
fn create_vcpus(
    ctx: &Context,
    attached: &Attached,
    caps: &vm::HostCaps,
    mut setup: impl FnMut(u8, &kvm_ioctls::VcpuFd) -> Result<(), BuildError>,
) -> Result<(Vec<Vcpu>, VcpuCounters), BuildError> {
    let count = ctx.resources.machine_config.vcpu_count;
    let mut vcpus = Vec::with_capacity(usize::from(count));
    let mut stats = Vec::with_capacity(usize::from(count));
    let shared = VcpuShared {
        pio: attached.pio.clone(),
        mmio: attached.mmio.clone(),
        exit: ctx.host.exit.clone(),
        mem: ctx.mem.clone(),
        metrics: ctx.host.metrics.clone(),
        msr_indices: Arc::new(caps.msr_indices.clone()),
    };
    for index in 0..count {
        let fd = ctx.vm.create_vcpu(index)?;
        setup(index, &fd)?;
        stats.extend(VcpuStats::open(&fd).map(|st| (index, st)));
        vcpus.push(Vcpu::new(index, fd, shared.clone()));
    }
    Ok((vcpus, stats))
}

/// The microVM's parts, once its vCPUs are made.
fn into_parts(attached: Attached, vcpus: Vec<Vcpu>, stats: VcpuCounters) -> Parts {
    Parts {
        vcpus,
        stats,
        subscribers: attached.subscribers,
        devices: attached.devices,
        i8042: attached.i8042,
    }
}
