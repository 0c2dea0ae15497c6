//! Every device of a microVM on its bus: the serial port and the i8042 on the I/O ports, and
//! each virtio device in a virtio-mmio window of its own through [`Wiring::attach_virtio`],
//! the one place that wires a virtio device to KVM, the event loop and the kernel command
//! line.

use std::path::Path;
use std::sync::{Arc, Mutex};

use arch::layout::{self, FIRST_VIRTIO_IRQ, I8042_IRQ, SERIAL_IRQ};
use devices::legacy::{
    i8042, BootTimer, Serial, SerialOutput, SerialSnapshot, SleepControl, I8042,
};
use devices::virtio::balloon::{Balloon, BalloonConfig};
use devices::virtio::block::{Block, BlockConfig};
use devices::virtio::mmio::REG_QUEUE_NOTIFY;
use devices::virtio::net::{MmdsLink, Net, NetConfig};
use devices::virtio::rng::{Entropy, EntropyConfig};
use devices::virtio::vsock::{Vsock, VsockConfig};
use devices::virtio::{IrqTrigger, MmioTransport, VirtioDevice};
use devices::Bus;
use event_manager::MutEventSubscriber;
use vmm_sys_util::eventfd::EventFd;

use super::pci::PciWiring;
use super::{BuildError, Console, Context};
use crate::config::{DriveConfig, NetworkInterfaceConfig, SerialConfig};
use crate::event_loop::{ExitLine, Subscriber};
use crate::memory::GuestMemory;
use crate::microvm::Devices;
use crate::resources::VmResources;
use crate::vm::Vm;
use crate::{ExitSignal, VmExit};

const COM1_BASE: u64 = 0x3f8;
const COM1_LEN: u64 = 8;
const I8042_BASE: u64 = 0x60;

pub(super) fn eventfd() -> Result<EventFd, BuildError> {
    EventFd::new(libc::EFD_NONBLOCK).map_err(BuildError::EventFd)
}

/// The devices on their buses, and what the kernel must be told of them.
pub(super) struct Attached {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub subscribers: Vec<Subscriber>,
    pub devices: Devices,
    pub i8042: Arc<Mutex<I8042>>,
    /// The root device's and the virtio-mmio devices' command-line entries.
    pub kernel_args: String,
    /// The virtio-mmio devices, for the DSDT.
    pub virtio_mmio: Vec<arch::acpi::VirtioMmio>,
    /// Under `--enable-pci`, the root bus.
    pub pci_root: Option<Arc<Mutex<devices::pci::root::PciRoot>>>,
}

/// The buses, event subscribers and kernel arguments while devices are attached.
struct Wiring<'a> {
    vm: &'a Vm,
    mem: &'a GuestMemory,
    pio: Bus,
    mmio: Bus,
    subscribers: Vec<Subscriber>,
    /// Every virtio-mmio transport, in the order of their windows.
    transports: Vec<Arc<Mutex<MmioTransport>>>,
    kernel_args: String,
    virtio_mmio: Vec<arch::acpi::VirtioMmio>,
    /// The next free virtio-mmio window, and the next virtio interrupt line (from
    /// [`FIRST_VIRTIO_IRQ`]).
    next_window: u32,
    next_line: u32,
    /// Under `--enable-pci`, the PCI bus that takes the virtio devices instead.
    pci: Option<PciWiring>,
}

impl Wiring<'_> {
    /// How a virtio device joins the VM: an MMIO window and an interrupt line of its own, a
    /// KVM ioeventfd per queue and an irqfd for the line, the transport on the MMIO bus, the
    /// device in the event loop, and the `virtio_mmio.device=` word and DSDT entry that tell
    /// the kernel.
    fn attach_virtio<D>(&mut self, device: D) -> Result<Arc<Mutex<D>>, BuildError>
    where
        D: VirtioDevice + MutEventSubscriber + 'static,
    {
        if let Some(pci) = &mut self.pci {
            let device = Arc::new(Mutex::new(device));
            pci.attach(self.vm, self.mem, device.clone())?;
            self.subscribers.push(device.clone());
            return Ok(device);
        }
        let irq = FIRST_VIRTIO_IRQ + self.next_line;
        if irq > layout::LAST_VIRTIO_IRQ {
            return Err(BuildError::TooManyDevices);
        }
        let addr = layout::virtio_mmio_addr(self.next_window);
        for (queue, evt) in device.queue_events().iter().enumerate() {
            self.vm
                .register_mmio_ioevent(evt, addr + REG_QUEUE_NOTIFY, queue as u32)?;
        }
        let irq_evt = eventfd()?;
        self.vm.register_irqfd(&irq_evt, irq)?;
        let device = Arc::new(Mutex::new(device));
        let irq_trigger = Arc::new(IrqTrigger::new(irq_evt));
        let transport = MmioTransport::new(device.clone(), self.mem.clone(), irq_trigger);
        let transport = Arc::new(Mutex::new(transport));
        self.mmio
            .insert(addr, layout::VIRTIO_MMIO_SIZE, transport.clone())?;
        self.transports.push(transport);
        self.subscribers.push(device.clone());
        self.kernel_args
            .push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
        self.virtio_mmio.push(arch::acpi::VirtioMmio {
            addr,
            len: layout::VIRTIO_MMIO_SIZE,
            gsi: irq,
        });
        self.next_window += 1;
        self.next_line += 1;
        Ok(device)
    }
}

/// Puts the legacy devices and every configured virtio device on their buses, the serial
/// port in `serial` state if given (a snapshot's). The order is the snapshot's: a restore
/// attaches the same devices to the same windows.
pub(super) fn attach_devices(
    ctx: &Context,
    serial: Option<&SerialSnapshot>,
) -> Result<Attached, BuildError> {
    let (resources, metrics) = (ctx.resources, ctx.host.metrics);
    let mut w = Wiring {
        vm: ctx.vm,
        mem: ctx.mem,
        pio: Bus::new(),
        mmio: Bus::new(),
        subscribers: Vec::new(),
        transports: Vec::new(),
        kernel_args: String::new(),
        virtio_mmio: Vec::new(),
        next_window: 0,
        next_line: 0,
        pci: None,
    };
    let mut devices = Devices::default();
    let i8042 = attach_legacy(
        &mut w,
        &mut devices,
        (ctx.host.console, serial, resources.serial.as_ref()),
        ctx.host.exit,
        metrics,
    )?;
    if resources.pci_enabled {
        w.pci = Some(PciWiring::new(ctx.vm, &mut w.pio, &mut w.mmio)?);
    }
    // Like Firecracker, the boot timer takes the first MMIO window and the drives follow it.
    if let Some(start) = resources.boot_timer {
        let timer = Arc::new(Mutex::new(BootTimer::new(start)));
        w.mmio
            .insert(layout::virtio_mmio_addr(0), layout::VIRTIO_MMIO_SIZE, timer)?;
        w.next_window = 1;
    }
    for drive in resources.drives() {
        let block =
            Block::new(&block_config(drive, metrics)).map_err(|source| BuildError::Drive {
                id: drive.drive_id.clone(),
                source,
            })?;
        if drive.is_root_device {
            w.kernel_args.push_str(&root_args(drive));
        }
        let block = w.attach_virtio(block)?;
        devices.blocks.push((drive.drive_id.clone(), block));
    }
    for iface in resources.network_interfaces() {
        let config = net_config(iface, resources, ctx.host.mmds, metrics);
        let net = Net::new(&config).map_err(|source| BuildError::Net {
            id: iface.iface_id.clone(),
            source,
        })?;
        devices
            .nets
            .push((iface.iface_id.clone(), w.attach_virtio(net)?));
    }
    if let Some(entropy) = resources.entropy() {
        let config = EntropyConfig {
            limiter: entropy.rate_limiter.unwrap_or_default(),
            metrics: metrics.entropy.clone(),
        };
        let rng = Entropy::new(&config).map_err(BuildError::EventFd)?;
        devices.entropy = Some(w.attach_virtio(rng)?);
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
        devices.balloon = Some(w.attach_virtio(balloon)?);
    }
    if let Some((config, listener)) = resources.vsock() {
        let config = VsockConfig {
            guest_cid: u64::from(config.guest_cid),
            uds_path: config.uds_path.clone().into(),
            listener: listener.try_clone().map_err(BuildError::Vsock)?,
            metrics: metrics.vsock.clone(),
        };
        let vsock = Vsock::new(config).map_err(BuildError::Vsock)?;
        devices.vsock = Some(w.attach_virtio(vsock)?);
    }
    devices.transports = w.transports;
    let pci_root = w.pci.as_ref().map(|p| p.root.clone());
    devices.pci_transports = w.pci.map(|p| p.transports).unwrap_or_default();
    Ok(Attached {
        pio: Arc::new(w.pio),
        mmio: Arc::new(w.mmio),
        subscribers: w.subscribers,
        devices,
        i8042,
        kernel_args: w.kernel_args,
        virtio_mmio: w.virtio_mmio,
        pci_root,
    })
}

/// COM1 on IRQ 4, the i8042 on IRQ 1 and the ACPI sleep control register; the i8042's reset
/// line and the power-off line are watched by the event loop. Returns the i8042, which also
/// takes keys from the API (`SendCtrlAltDel`).
fn attach_legacy(
    w: &mut Wiring,
    devices: &mut Devices,
    (console, saved, serial_config): (&Console, Option<&SerialSnapshot>, Option<&SerialConfig>),
    exit: &Arc<ExitSignal>,
    metrics: &telemetry::Metrics,
) -> Result<Arc<Mutex<I8042>>, BuildError> {
    let serial_irq = eventfd()?;
    w.vm.register_irqfd(&serial_irq, SERIAL_IRQ)?;
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
    let limit = serial_config.and_then(|c| c.rate_limiter);
    let output = SerialOutput::new(output, metrics.uart.clone()).with_limit(limit);
    let serial = match saved {
        Some(saved) => Serial::restored(serial_irq, Box::new(output), input, saved)
            .map_err(BuildError::SerialState)?,
        None => Serial::new(serial_irq, Box::new(output), input).map_err(BuildError::EventFd)?,
    };
    let serial = Arc::new(Mutex::new(serial));
    w.pio.insert(COM1_BASE, COM1_LEN, serial.clone())?;
    w.subscribers.push(serial.clone());
    devices.serial = Some(serial);

    let reset = eventfd()?;
    let kbd_irq = eventfd()?;
    w.vm.register_irqfd(&kbd_irq, I8042_IRQ)?;
    let i8042 = I8042::new(reset.try_clone().map_err(BuildError::EventFd)?, kbd_irq);
    let i8042 = Arc::new(Mutex::new(i8042));
    w.pio.insert(I8042_BASE, i8042::PORT_RANGE, i8042.clone())?;
    w.subscribers.push(Arc::new(Mutex::new(ExitLine {
        evt: reset,
        exit: exit.clone(),
        reason: VmExit::Reset,
        what: "i8042 reset line",
    })));

    let power_off = eventfd()?;
    let sleep = SleepControl::new(
        power_off.try_clone().map_err(BuildError::EventFd)?,
        arch::acpi::S5_SLEEP_TYPE,
    );
    w.pio.insert(
        u64::from(layout::ACPI_SLEEP_PORT),
        1,
        Arc::new(Mutex::new(sleep)),
    )?;
    w.subscribers.push(Arc::new(Mutex::new(ExitLine {
        evt: power_off,
        exit: exit.clone(),
        reason: VmExit::PowerOff,
        what: "ACPI power-off line",
    })));
    Ok(i8042)
}

/// What the block device for `drive` needs.
fn block_config(drive: &DriveConfig, metrics: &telemetry::Metrics) -> BlockConfig {
    BlockConfig {
        id: drive.drive_id.clone(),
        path: drive.path_on_host.clone().into(),
        read_only: drive.is_read_only,
        cache: drive.cache_type,
        engine: drive.io_engine,
        limiter: drive.rate_limiter.unwrap_or_default(),
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
        rx_limiter: iface.rx_rate_limiter.unwrap_or_default(),
        tx_limiter: iface.tx_rate_limiter.unwrap_or_default(),
        metrics: metrics.net(&iface.iface_id),
    }
}

/// Firecracker's root-device arguments.
fn root_args(drive: &DriveConfig) -> String {
    let mode = if drive.is_read_only { "ro" } else { "rw" };
    match &drive.partuuid {
        Some(uuid) => format!(" root=PARTUUID={uuid} {mode}"),
        None => format!(" root=/dev/vda {mode}"),
    }
}
