//! Every device of a microVM on its bus: the serial port and the i8042 on the I/O ports, and
//! each virtio device in a virtio-mmio window of its own (or on the PCI bus) through
//! [`Wiring::attach_virtio`], the one place that wires a virtio device to KVM, the event loop
//! and the kernel command line. Which virtio devices there are, and how each is made from
//! its configuration, is the configuration's business ([`VirtioSpec`]): a new kind of device
//! needs no line here.

use std::path::Path;
use std::sync::{Arc, Mutex};

use arch::layout::{self, FIRST_VIRTIO_IRQ, I8042_AUX_IRQ, I8042_IRQ, SERIAL_IRQ};
use devices::legacy::{
    i8042, BootTimer, Serial, SerialOutput, SerialSnapshot, SleepControl, I8042,
};
use devices::virtio::mmio::REG_QUEUE_NOTIFY;
use devices::virtio::{IrqTrigger, MmioTransport, VirtioDevice};
use devices::Bus;
use event_manager::MutEventSubscriber;
use vmm_sys_util::eventfd::EventFd;

use super::pci::PciWiring;
use super::{BuildError, Console, Context};
use crate::config::SerialConfig;
use crate::device_set::Devices;
use crate::event_loop::{ExitLine, Subscriber};
use crate::resources::VmResources;
use crate::{ExitSignal, VmExit};

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

/// A virtio device's configuration: how its device is made and attached. Each device's
/// config module implements it, and `VmResources::virtio_devices` lists them in attach order.
pub(crate) trait VirtioSpec {
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError>;
}

/// The buses, event subscribers and kernel arguments while devices are attached.
pub(crate) struct Wiring<'a> {
    ctx: &'a Context<'a>,
    devices: Devices,
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
    /// The microVM's configuration.
    pub fn resources(&self) -> &VmResources {
        self.ctx.resources
    }

    pub fn metrics(&self) -> &telemetry::Metrics {
        self.ctx.host.metrics
    }

    /// The MMDS data store, for interfaces that reach the MMDS.
    pub fn mmds(&self) -> &mmds::SharedStore {
        self.ctx.host.mmds
    }

    /// Adds `args` (with its leading space) to the kernel command line.
    pub fn kernel_args(&mut self, args: &str) {
        self.kernel_args.push_str(args);
    }

    /// How a virtio device joins the VM: an MMIO window and an interrupt line of its own, a
    /// KVM ioeventfd per queue and an irqfd for the line, the transport on the MMIO bus, the
    /// device in the event loop, and the `virtio_mmio.device=` word and DSDT entry that tell
    /// the kernel; under `--enable-pci`, a slot on the root bus instead. The API finds the
    /// device afterwards by its type and `id`.
    pub fn attach_virtio<D>(&mut self, id: &str, device: D) -> Result<(), BuildError>
    where
        D: VirtioDevice + MutEventSubscriber + Send + 'static,
    {
        let device = Arc::new(Mutex::new(device));
        self.devices.add(id, device.clone());
        self.subscribers.push(device.clone());
        match self.pci.as_mut() {
            Some(pci) => Ok(pci.attach(self.ctx.vm, self.ctx.mem, device)?),
            None => self.attach_mmio(device),
        }
    }

    /// A virtio-mmio window and an interrupt line of its own.
    fn attach_mmio(&mut self, device: Arc<Mutex<dyn VirtioDevice>>) -> Result<(), BuildError> {
        let irq = FIRST_VIRTIO_IRQ + self.next_line;
        if irq > layout::LAST_VIRTIO_IRQ {
            return Err(BuildError::TooManyDevices);
        }
        let addr = layout::virtio_mmio_addr(self.next_window);
        for (queue, evt) in devices::bus::lock(&device)
            .queue_events()
            .iter()
            .enumerate()
        {
            self.ctx
                .vm
                .register_mmio_ioevent(evt, addr + REG_QUEUE_NOTIFY, queue as u32)?;
        }
        let irq_evt = eventfd()?;
        self.ctx.vm.register_irqfd(&irq_evt, irq)?;
        let irq_trigger = Arc::new(IrqTrigger::new(irq_evt));
        let transport = MmioTransport::new(device, self.ctx.mem.clone(), irq_trigger);
        let transport = Arc::new(Mutex::new(transport));
        self.mmio
            .insert(addr, layout::VIRTIO_MMIO_SIZE, transport.clone())?;
        self.transports.push(transport);
        self.kernel_args
            .push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
        self.virtio_mmio.push(arch::acpi::VirtioMmio {
            addr,
            len: layout::VIRTIO_MMIO_SIZE,
            gsi: irq,
        });
        self.next_window += 1;
        self.next_line += 1;
        Ok(())
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
        ctx,
        devices: Devices::default(),
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
    let i8042 = attach_legacy(
        &mut w,
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
    for spec in resources.virtio_devices() {
        spec.attach(&mut w)?;
    }
    let mut devices = w.devices;
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

/// COM1 on IRQ 4, the i8042 on IRQs 1 and 12 and the ACPI sleep control register; the
/// i8042's reset line and the power-off line are watched by the event loop. Returns the
/// i8042, which also takes keys from the API (`SendCtrlAltDel`).
fn attach_legacy(
    w: &mut Wiring,
    (console, saved, serial_config): (&Console, Option<&SerialSnapshot>, Option<&SerialConfig>),
    exit: &Arc<ExitSignal>,
    metrics: &telemetry::Metrics,
) -> Result<Arc<Mutex<I8042>>, BuildError> {
    let serial_irq = eventfd()?;
    w.ctx.vm.register_irqfd(&serial_irq, SERIAL_IRQ)?;
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
    let com1 = layout::COM1_PORTS;
    w.pio
        .insert(com1.base.into(), com1.len.into(), serial.clone())?;
    w.subscribers.push(serial.clone());
    w.devices.serial = Some(serial);

    let reset = eventfd()?;
    let kbd_irq = eventfd()?;
    w.ctx.vm.register_irqfd(&kbd_irq, I8042_IRQ)?;
    let aux_irq = eventfd()?;
    w.ctx.vm.register_irqfd(&aux_irq, I8042_AUX_IRQ)?;
    let reset_line = reset.try_clone().map_err(BuildError::EventFd)?;
    let i8042 = I8042::new(reset_line, kbd_irq, aux_irq);
    let i8042 = Arc::new(Mutex::new(i8042));
    w.pio
        .insert(layout::I8042_PORT.into(), i8042::PORT_RANGE, i8042.clone())?;
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
