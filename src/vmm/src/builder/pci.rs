//! `--enable-pci`: the PCI root bus (configuration mechanism #1 on the I/O ports, ECAM and
//! the BAR window on the MMIO bus) and how a virtio device joins it as a virtio-pci
//! function: a BAR placed as firmware would, an MSI-X vector per queue and one for
//! configuration changes, each an irqfd on a GSI of its own, and an ioeventfd per queue.

use std::sync::{Arc, Mutex};

use arch::layout;
use devices::pci::root::{PciBarWindow, PciConfigIo, PciEcam, PciRoot, ECAM_SIZE};
use devices::virtio::pci::{PciInterrupt, PciTransport, BAR_SIZE};
use devices::virtio::VirtioDevice;
use devices::Bus;

use super::attach::eventfd;
use super::BuildError;
use crate::memory::GuestMemory;
use crate::msi::{DeviceRoutes, GsiRoutes, NotifyEvents};
use crate::vm::{self, Vm};

pub(super) struct PciWiring {
    pub root: Arc<Mutex<PciRoot>>,
    routes: Arc<GsiRoutes>,
    pub transports: Vec<Arc<Mutex<PciTransport>>>,
}

impl PciWiring {
    /// The root bus with its host bridge, reachable at its ports and windows.
    pub fn new(vm: &Vm, pio: &mut Bus, mmio: &mut Bus) -> Result<Self, BuildError> {
        const _: () = assert!(ECAM_SIZE == layout::PCI_ECAM_SIZE);
        let root = Arc::new(Mutex::new(PciRoot::new()));
        let ports = layout::PCI_CONFIG_PORTS;
        pio.insert(
            ports.base.into(),
            ports.len.into(),
            Arc::new(Mutex::new(PciConfigIo::new(root.clone()))),
        )?;
        mmio.insert(
            layout::PCI_ECAM_START,
            layout::PCI_ECAM_SIZE,
            Arc::new(Mutex::new(PciEcam::new(root.clone()))),
        )?;
        let window = PciBarWindow::new(root.clone(), layout::PCI_BAR_WINDOW_START);
        mmio.insert(
            layout::PCI_BAR_WINDOW_START,
            layout::PCI_BAR_WINDOW_SIZE,
            Arc::new(Mutex::new(window)),
        )?;
        Ok(PciWiring {
            root,
            routes: Arc::new(GsiRoutes::new(vm.shared_fd())),
            transports: Vec::new(),
        })
    }

    /// Puts `device` in the next slot, its BAR at the next 32 KiB of the window.
    pub fn attach(
        &mut self,
        vm: &Vm,
        mem: &GuestMemory,
        device: Arc<Mutex<dyn VirtioDevice>>,
    ) -> Result<(), BuildError> {
        let bar = layout::PCI_BAR_WINDOW_START + self.transports.len() as u64 * BAR_SIZE;
        let events = {
            let d = devices::bus::lock(&device);
            d.queue_events()
                .iter()
                .map(|e| e.try_clone())
                .collect::<Result<Vec<_>, _>>()
                .map_err(BuildError::EventFd)?
        };
        let queues = events.len();
        let first = self.routes.allocate(queues + 1);
        let irqfds = (0..=queues)
            .map(|_| eventfd())
            .collect::<Result<Vec<_>, _>>()?;
        for (i, fd) in irqfds.iter().enumerate() {
            vm.register_irqfd(fd, first + i as u32)?;
        }
        let router = DeviceRoutes {
            routes: self.routes.clone(),
            first,
        };
        let irq = Arc::new(PciInterrupt::new(queues, irqfds, Box::new(router)));
        let mut transport = PciTransport::new(device, mem.clone(), irq);
        transport.set_bar_address(bar);
        let notify = NotifyEvents {
            vm: vm.shared_fd(),
            events,
        };
        notify.register(bar).map_err(vm::Error::EventFd)?;
        let transport = Arc::new(Mutex::new(transport));
        devices::bus::lock(&self.root)
            .add(transport.clone(), Some(Box::new(notify)))
            .map_err(BuildError::PciBusFull)?;
        self.transports.push(transport);
        Ok(())
    }
}
