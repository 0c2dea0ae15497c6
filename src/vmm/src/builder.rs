//! The build recipe, in order: `VmResources` → guest memory → KVM VM → kernel and initrd →
//! devices (and their command-line entries) → boot information → configured vCPUs. The
//! result is a [`MicroVm`] whose vCPUs have not run yet.

use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arch::boot_params::{self, InitrdPlacement};
use arch::cpuid::Topology;
use arch::layout::{self, CMDLINE_ADDR, CMDLINE_MAX_SIZE, FIRST_VIRTIO_IRQ, I8042_IRQ, SERIAL_IRQ};
use arch::{BootProtocol, KernelEntry};
use devices::legacy::{i8042, BootTimer, Serial, SerialOutput, SerialSnapshot, I8042};
use devices::virtio::balloon::{Balloon, BalloonConfig};
use devices::virtio::block::{Block, BlockConfig, CacheType, IoEngine};
use devices::virtio::mmio::REG_QUEUE_NOTIFY;
use devices::virtio::net::{MmdsLink, Net, NetConfig};
use devices::virtio::rng::{Entropy, EntropyConfig};
use devices::virtio::vsock::{Vsock, VsockConfig};
use devices::virtio::{IrqTrigger, MmioTransport, VirtioDevice};
use devices::Bus;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::config::{
    self, BootSourceConfig, DriveConfig, NetworkInterfaceConfig, RateLimiterConfig, SerialConfig,
};
use crate::event_loop::{ResetWatcher, Subscriber};
use crate::memory::{self, GuestMemory};
use crate::microvm::{Devices, MicroVm};
use crate::resources::VmResources;
use crate::snapshot::MicrovmState;
use crate::vcpu::stats::VcpuStats;
use crate::vcpu::{self, BootEntry, Vcpu};
use crate::vm::{self, Vm};
use crate::ExitSignal;

const COM1_BASE: u64 = 0x3f8;
const COM1_LEN: u64 = 8;
const I8042_BASE: u64 = 0x60;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no boot source is configured: set boot-source.kernel_image_path")]
    NoBootSource,
    #[error("{0}")]
    Memory(#[from] memory::Error),
    #[error("{0}")]
    Vm(#[from] vm::Error),
    #[error("cannot open the kernel image {path}: {source}")]
    OpenKernel {
        path: String,
        source: hostfile::Error,
    },
    #[error("cannot open the initrd {path}: {source}")]
    OpenInitrd {
        path: String,
        source: hostfile::Error,
    },
    #[error("{0}")]
    Load(#[from] arch::loader::Error),
    #[error("the kernel command line is {len} bytes long; at most {} fit", CMDLINE_MAX_SIZE - 1)]
    CmdlineTooLong { len: usize },
    #[error("{0}")]
    BootParams(#[from] boot_params::Error),
    #[error("{0}")]
    MpTable(#[from] arch::mptable::Error),
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
    #[error("{0}")]
    Vcpu(#[from] vcpu::Error),
    #[error("there are more MMIO devices than interrupt lines 5 to 23 can serve")]
    TooManyDevices,
    #[error("cannot copy the console's file descriptors: {0}")]
    Console(#[source] std::io::Error),
    #[error("cannot open the serial output file {path}: {source}")]
    SerialOutput {
        path: String,
        source: hostfile::Error,
    },
    #[error("the snapshot's serial console state is not valid: {0}")]
    SerialState(#[source] std::io::Error),
    #[error("{0}")]
    State(#[from] crate::snapshot::state::StateError),
    #[error("{0}")]
    DeviceState(#[from] devices::virtio::snapshot::RestoreError),
    #[error("the snapshot has {saved} virtio devices; its configuration makes {built}")]
    DeviceCount { saved: usize, built: usize },
    #[error("{0}")]
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

fn eventfd() -> Result<EventFd, BuildError> {
    EventFd::new(libc::EFD_NONBLOCK).map_err(BuildError::EventFd)
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
    let vm = Vm::new(&mem, track_dirty)?;
    let ctx = Context {
        vm: &vm,
        mem: &mem,
        resources,
        host,
    };
    let parts = assemble(&ctx, mem_bytes, boot)?;
    Ok(MicroVm::new(parts, mem, vm, track_dirty))
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
    let vm = Vm::new(&mem, track_dirty)?;
    let ctx = Context {
        vm: &vm,
        mem: &mem,
        resources,
        host,
    };
    let parts = rebuild(&ctx, state)?;
    // KVM needs guest memory in place for some MSRs (kvmclock, async PF, PV EOI, steal time).
    for (vcpu, saved) in parts.vcpus.iter().zip(&state.vcpus) {
        vcpu.restore_state(saved)?;
    }
    crate::snapshot::state::restore_vm(vm.fd(), &state.vm, clock_realtime)?;
    for transport in &parts.devices.transports {
        devices::bus::lock(transport).announce_restore();
    }
    Ok(MicroVm::new(parts, mem, vm, track_dirty))
}

/// The devices of a restore in their saved state, and the vCPUs with their CPUID.
fn rebuild(ctx: &Context, state: &MicrovmState) -> Result<Parts, BuildError> {
    let caps = ctx.vm.host_caps()?;
    let attached = attach_devices(ctx, Some(&state.devices.serial))?;
    let transports = &attached.devices.transports;
    if transports.len() != state.devices.virtio.len() {
        return Err(BuildError::DeviceCount {
            saved: state.devices.virtio.len(),
            built: transports.len(),
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
    if let (Some(balloon), Some(pages)) = (
        &attached.devices.balloon,
        state.devices.balloon_actual_pages,
    ) {
        devices::bus::lock(balloon).restore_actual_pages(pages);
    }
    if let (Some(balloon), Some(hinting)) =
        (&attached.devices.balloon, state.devices.balloon_hinting)
    {
        devices::bus::lock(balloon).restore_hinting(hinting);
    }
    for (transport, saved) in transports.iter().zip(&state.devices.virtio) {
        devices::bus::lock(transport).restore(saved)?;
    }
    Ok(attached.into_parts(vcpus, stats))
}

/// What [`assemble`] makes.
pub(crate) struct Parts {
    pub vcpus: Vec<Vcpu>,
    pub stats: VcpuCounters,
    pub subscribers: Vec<Subscriber>,
    pub devices: Devices,
    pub i8042: Arc<Mutex<I8042>>,
}

/// Everything but the memory slots: kernel, initrd, devices, boot tables, vCPUs.
fn assemble(ctx: &Context, mem_bytes: u64, boot: &BootSourceConfig) -> Result<Parts, BuildError> {
    let (vm, mem) = (ctx.vm, ctx.mem);
    let machine = &ctx.resources.machine_config;
    let kernel = load_kernel(mem, &boot.kernel_image_path)?;
    let low_ram_end = mem_bytes.min(layout::MMIO_GAP_START);
    let initrd = match &boot.initrd_path {
        Some(path) => {
            let mut file = hostfile::open(Path::new(path), hostfile::Kind::Regular, false)
                .map_err(|source| BuildError::OpenInitrd {
                    path: path.clone(),
                    source,
                })?;
            Some(arch::loader::load_initrd(
                mem,
                &mut file,
                &kernel,
                low_ram_end,
            )?)
        }
        None => None,
    };

    let caps = vm.host_caps()?;
    let cpu = guest_cpu(ctx, &caps)?;
    let mut cmdline = boot.boot_args().to_string();
    if caps.pvm {
        cmdline.push(' ');
        cmdline.push_str(crate::pvm::BOOT_ARGS);
    }
    let attached = attach_devices(ctx, None)?;
    cmdline.push_str(&attached.kernel_args);

    write_cmdline(mem, &cmdline)?;
    write_boot_info(
        mem,
        &kernel,
        initrd,
        machine.vcpu_count,
        mem_bytes,
        cmdline.len() + 1,
    )?;
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
    Ok(attached.into_parts(vcpus, stats))
}

/// What every build step reads.
struct Context<'a> {
    vm: &'a Vm,
    mem: &'a GuestMemory,
    resources: &'a VmResources,
    host: &'a Host<'a>,
}

/// The devices on their buses, and what the kernel must be told of them.
struct Attached {
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    subscribers: Vec<Subscriber>,
    devices: Devices,
    i8042: Arc<Mutex<I8042>>,
    /// The root device's and the virtio-mmio devices' command-line entries.
    kernel_args: String,
}

impl Attached {
    /// The microVM's parts, once its vCPUs are made.
    fn into_parts(self, vcpus: Vec<Vcpu>, stats: VcpuCounters) -> Parts {
        Parts {
            vcpus,
            stats,
            subscribers: self.subscribers,
            devices: self.devices,
            i8042: self.i8042,
        }
    }
}

fn topology(machine: &config::MachineConfig, index: u8) -> Topology {
    Topology {
        cpu_index: index,
        count: machine.vcpu_count,
        smt: machine.smt,
    }
}

/// KVM's counters of each vCPU that has them, by vCPU index.
type VcpuCounters = Vec<(u8, VcpuStats)>;

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
    let msr_indices = Arc::new(caps.msr_indices.clone());
    for index in 0..count {
        let fd = ctx.vm.create_vcpu(index)?;
        setup(index, &fd)?;
        stats.extend(VcpuStats::open(&fd).map(|st| (index, st)));
        vcpus.push(
            Vcpu::new(
                index,
                fd,
                attached.pio.clone(),
                attached.mmio.clone(),
                ctx.host.exit.clone(),
                ctx.mem.clone(),
                ctx.host.metrics.clone(),
            )
            .with_snapshot_msrs(msr_indices.clone()),
        );
    }
    Ok((vcpus, stats))
}

/// Puts the legacy devices and every configured virtio device on their buses, the serial
/// port in `serial` state if given (a snapshot's).
fn attach_devices(ctx: &Context, serial: Option<&SerialSnapshot>) -> Result<Attached, BuildError> {
    let (vm, mem, resources, mmds, metrics) = (
        ctx.vm,
        ctx.mem,
        ctx.resources,
        ctx.host.mmds,
        ctx.host.metrics,
    );
    let mut subscribers: Vec<Subscriber> = Vec::new();
    let mut pio = Bus::new();
    let mut mmio = Bus::new();
    let mut cmdline = String::new();
    let mut devices = Devices::default();
    let i8042 = attach_legacy(
        vm,
        &mut pio,
        &mut subscribers,
        &mut devices,
        (ctx.host.console, serial, ctx.resources.serial.as_ref()),
        ctx.host.exit,
        ctx.host.metrics,
    )?;
    // Like Firecracker, the boot timer takes the first MMIO window and the drives follow it.
    let mut window = 0;
    if let Some(start) = resources.boot_timer {
        let timer = Arc::new(Mutex::new(BootTimer::new(start)));
        mmio.insert(layout::virtio_mmio_addr(0), layout::VIRTIO_MMIO_SIZE, timer)?;
        window = 1;
    }
    let mut slot = 0;
    for drive in resources.drives() {
        let config = block_config(drive, metrics);
        let block = Block::new(&config).map_err(|source| BuildError::Drive {
            id: drive.drive_id.clone(),
            source,
        })?;
        let block = Arc::new(Mutex::new(block));
        let (addr, irq) = attach_virtio(
            vm,
            mem,
            &mut mmio,
            &mut devices,
            block.clone(),
            window + slot,
            slot,
        )?;
        subscribers.push(block.clone());
        devices.blocks.push((drive.drive_id.clone(), block));
        slot += 1;
        if drive.is_root_device {
            cmdline.push_str(&root_args(drive));
        }
        cmdline.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    for iface in resources.network_interfaces() {
        let config = net_config(iface, resources, mmds, metrics);
        let net = Net::new(&config).map_err(|source| BuildError::Net {
            id: iface.iface_id.clone(),
            source,
        })?;
        let net = Arc::new(Mutex::new(net));
        let (addr, irq) = attach_virtio(
            vm,
            mem,
            &mut mmio,
            &mut devices,
            net.clone(),
            window + slot,
            slot,
        )?;
        subscribers.push(net.clone());
        devices.nets.push((iface.iface_id.clone(), net));
        slot += 1;
        cmdline.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    if let Some(entropy) = resources.entropy() {
        let config = EntropyConfig {
            limiter: RateLimiterConfig::spec(entropy.rate_limiter.as_ref()),
            metrics: metrics.entropy.clone(),
        };
        let rng = Entropy::new(&config).map_err(BuildError::EventFd)?;
        let rng = Arc::new(Mutex::new(rng));
        let (addr, irq) = attach_virtio(
            vm,
            mem,
            &mut mmio,
            &mut devices,
            rng.clone(),
            window + slot,
            slot,
        )?;
        subscribers.push(rng.clone());
        devices.entropy = Some(rng);
        slot += 1;
        cmdline.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    if let Some(b) = resources.balloon() {
        let config = BalloonConfig {
            amount_mib: b.amount_mib,
            deflate_on_oom: b.deflate_on_oom,
            stats_polling_interval_s: b.stats_polling_interval_s,
            free_page_hinting: b.free_page_hinting,
            free_page_reporting: b.free_page_reporting,
            host_page_size: resources.machine_config.huge_pages.page_size(),
            metrics: metrics.balloon.clone(),
        };
        let balloon = Balloon::new(&config).map_err(BuildError::EventFd)?;
        let balloon = Arc::new(Mutex::new(balloon));
        let (addr, irq) = attach_virtio(
            vm,
            mem,
            &mut mmio,
            &mut devices,
            balloon.clone(),
            window + slot,
            slot,
        )?;
        subscribers.push(balloon.clone());
        devices.balloon = Some(balloon);
        slot += 1;
        cmdline.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    if let Some((config, listener)) = resources.vsock() {
        let listener = listener.try_clone().map_err(BuildError::Vsock)?;
        let config = VsockConfig {
            guest_cid: u64::from(config.guest_cid),
            uds_path: config.uds_path.clone().into(),
            listener,
            metrics: metrics.vsock.clone(),
        };
        let vsock = Vsock::new(config).map_err(BuildError::Vsock)?;
        let vsock = Arc::new(Mutex::new(vsock));
        let (addr, irq) = attach_virtio(
            vm,
            mem,
            &mut mmio,
            &mut devices,
            vsock.clone(),
            window + slot,
            slot,
        )?;
        subscribers.push(vsock.clone());
        devices.vsock = Some(vsock);
        cmdline.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    Ok(Attached {
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        subscribers,
        devices,
        i8042,
        kernel_args: cmdline,
    })
}

fn load_kernel(mem: &GuestMemory, path: &str) -> Result<KernelEntry, BuildError> {
    let mut file =
        hostfile::open(Path::new(path), hostfile::Kind::Regular, false).map_err(|source| {
            BuildError::OpenKernel {
                path: path.to_string(),
                source,
            }
        })?;
    Ok(arch::loader::load_kernel(mem, &mut file)?)
}

/// COM1 on IRQ 4 and the i8042 on IRQ 1; the i8042's reset line is watched by the event
/// loop. Returns the i8042, which also takes keys from the API (`SendCtrlAltDel`).
fn attach_legacy(
    vm: &Vm,
    pio: &mut Bus,
    subscribers: &mut Vec<Subscriber>,
    devices: &mut Devices,
    (console, saved, serial_config): (&Console, Option<&SerialSnapshot>, Option<&SerialConfig>),
    exit: &Arc<ExitSignal>,
    metrics: &telemetry::Metrics,
) -> Result<Arc<Mutex<I8042>>, BuildError> {
    let serial_irq = eventfd()?;
    vm.register_irqfd(&serial_irq, SERIAL_IRQ)?;
    // `PUT /serial` sends the output to a file (and the guest gets no input), as in
    // Firecracker; otherwise it is ember's stdout and stdin.
    let out_path = serial_config.and_then(|c| c.serial_out_path.as_ref());
    let (output, input) = match out_path {
        Some(path) => {
            let file = hostfile::open_output(Path::new(path)).map_err(|source| {
                BuildError::SerialOutput {
                    path: path.clone(),
                    source,
                }
            })?;
            (file, None)
        }
        None => {
            let output = console.output.try_clone().map_err(BuildError::Console)?;
            let input = match &console.input {
                Some(f) => Some(f.try_clone().map_err(BuildError::Console)?),
                None => None,
            };
            (output, input)
        }
    };
    let limit = serial_config
        .and_then(|c| c.rate_limiter.as_ref())
        .and_then(|b| b.spec());
    let output = SerialOutput::new(output, metrics.uart.clone()).with_limit(limit);
    let serial = match saved {
        Some(saved) => Serial::restored(serial_irq, Box::new(output), input, saved)
            .map_err(BuildError::SerialState)?,
        None => Serial::new(serial_irq, Box::new(output), input).map_err(BuildError::EventFd)?,
    };
    let serial = Arc::new(Mutex::new(serial));
    pio.insert(COM1_BASE, COM1_LEN, serial.clone())?;
    subscribers.push(serial.clone());
    devices.serial = Some(serial);

    let reset = eventfd()?;
    let kbd_irq = eventfd()?;
    vm.register_irqfd(&kbd_irq, I8042_IRQ)?;
    let i8042 = I8042::new(reset.try_clone().map_err(BuildError::EventFd)?, kbd_irq);
    let i8042 = Arc::new(Mutex::new(i8042));
    pio.insert(I8042_BASE, i8042::PORT_RANGE, i8042.clone())?;
    subscribers.push(Arc::new(Mutex::new(ResetWatcher {
        reset,
        exit: exit.clone(),
    })));
    Ok(i8042)
}

/// What the block device for `drive` needs.
fn block_config(drive: &DriveConfig, metrics: &telemetry::Metrics) -> BlockConfig {
    BlockConfig {
        id: drive.drive_id.clone(),
        path: drive.path_on_host.clone().into(),
        read_only: drive.is_read_only,
        cache: match drive.cache_type {
            config::CacheType::Unsafe => CacheType::Unsafe,
            config::CacheType::Writeback => CacheType::Writeback,
        },
        engine: match drive.io_engine {
            config::IoEngine::Sync => IoEngine::Sync,
            config::IoEngine::Async => IoEngine::Async,
        },
        limiter: RateLimiterConfig::spec(drive.rate_limiter.as_ref()),
        metrics: metrics.block(&drive.drive_id),
    }
}

/// What the net device for `iface` needs, with the MMDS if the interface reaches it.
fn net_config(
    iface: &NetworkInterfaceConfig,
    resources: &VmResources,
    store: &mmds::SharedStore,
    metrics: &telemetry::Metrics,
) -> NetConfig {
    let mmds = resources
        .mmds_config
        .as_ref()
        .filter(|m| m.network_interfaces.contains(&iface.iface_id))
        .map(|m| MmdsLink {
            ip: m.ipv4_address,
            store: store.clone(),
        });
    NetConfig {
        id: iface.iface_id.clone(),
        tap: iface.host_dev_name.clone(),
        guest_mac: iface.guest_mac.map(|m| m.0),
        mtu: iface.mtu.map(|m| m as u16),
        mmds,
        rx_limiter: RateLimiterConfig::spec(iface.rx_rate_limiter.as_ref()),
        tx_limiter: RateLimiterConfig::spec(iface.tx_rate_limiter.as_ref()),
        metrics: metrics.net(&iface.iface_id),
    }
}

/// Puts one virtio device in MMIO window `window` on the `index`th virtio interrupt line,
/// with an ioeventfd per queue; returns the window's address and the line.
fn attach_virtio(
    vm: &Vm,
    mem: &GuestMemory,
    mmio: &mut Bus,
    devices: &mut Devices,
    device: Arc<Mutex<dyn VirtioDevice>>,
    window: u32,
    index: u32,
) -> Result<(u64, u32), BuildError> {
    let irq = FIRST_VIRTIO_IRQ + index;
    if irq > layout::LAST_VIRTIO_IRQ {
        return Err(BuildError::TooManyDevices);
    }
    let addr = layout::virtio_mmio_addr(window);
    for (queue, evt) in devices::bus::lock(&device)
        .queue_events()
        .iter()
        .enumerate()
    {
        vm.register_mmio_ioevent(evt, addr + REG_QUEUE_NOTIFY, queue as u32)?;
    }
    let irq_evt = eventfd()?;
    vm.register_irqfd(&irq_evt, irq)?;
    let transport = MmioTransport::new(device, mem.clone(), Arc::new(IrqTrigger::new(irq_evt)));
    let transport = Arc::new(Mutex::new(transport));
    mmio.insert(addr, layout::VIRTIO_MMIO_SIZE, transport.clone())?;
    devices.transports.push(transport);
    Ok((addr, irq))
}

/// Firecracker's root-device arguments.
fn root_args(drive: &DriveConfig) -> String {
    let mode = if drive.is_read_only { "ro" } else { "rw" };
    match &drive.partuuid {
        Some(uuid) => format!(" root=PARTUUID={uuid} {mode}"),
        None => format!(" root=/dev/vda {mode}"),
    }
}

fn write_cmdline(mem: &GuestMemory, cmdline: &str) -> Result<(), BuildError> {
    if cmdline.len() + 1 > CMDLINE_MAX_SIZE {
        return Err(BuildError::CmdlineTooLong { len: cmdline.len() });
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))?;
    Ok(())
}

fn write_boot_info(
    mem: &GuestMemory,
    kernel: &KernelEntry,
    initrd: Option<InitrdPlacement>,
    vcpus: u8,
    mem_bytes: u64,
    cmdline_size: usize,
) -> Result<(), BuildError> {
    let e820 = boot_params::e820_map(&layout::ram_regions(mem_bytes));
    match kernel.protocol {
        BootProtocol::Linux64 => {
            let params = boot_params::zero_page(kernel.setup_header, cmdline_size, initrd, &e820)?;
            boot_params::write_zero_page(mem, &params)?;
        }
        BootProtocol::Pvh => boot_params::write_pvh_info(mem, initrd, &e820)?,
    }
    arch::mptable::write(mem, vcpus)?;
    let gdt = arch::gdt::table(kernel.protocol == BootProtocol::Linux64);
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(layout::GDT_ADDR + 8 * i as u64))?;
    }
    mem.write_obj(0u64, GuestAddress(layout::IDT_ADDR))?;
    Ok(())
}
