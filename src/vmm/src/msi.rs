//! KVM's side of the virtio-pci devices: the GSI routing table that turns each MSI-X vector's
//! irqfd into the message the guest programmed, and the queue-notify ioeventfds that follow
//! a BAR the guest moves.
//!
//! KVM_SET_GSI_ROUTING replaces the whole table, the in-kernel PIC and IOAPIC lines
//! included, so the table here always holds KVM's default irqchip routes for GSIs 0-23 and
//! every vector's route from GSI 24 up.

use std::sync::{Arc, Mutex};

use devices::pci::msix::Message;
use devices::pci::root::BarMoved;
use devices::virtio::pci::{notify_offset, MsiRouter};
use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

/// The first GSI past the IOAPIC's pins: MSI routes start here.
pub const FIRST_MSI_GSI: u32 = arch::layout::IOAPIC_PINS as u32;

/// Every MSI route of the VM, by GSI from [`FIRST_MSI_GSI`].
#[derive(Debug)]
pub struct GsiRoutes {
    vm: Arc<VmFd>,
    msi: Mutex<Vec<Option<Message>>>,
}

impl GsiRoutes {
    pub fn new(vm: Arc<VmFd>) -> Self {
        GsiRoutes {
            vm,
            msi: Mutex::new(Vec::new()),
        }
    }

    /// Reserves `count` GSIs for one device's vectors; returns the first.
    pub fn allocate(&self, count: usize) -> u32 {
        let mut msi = self.msi.lock().unwrap_or_else(|e| e.into_inner());
        let used = msi.len();
        msi.resize(used + count, None);
        FIRST_MSI_GSI + used as u32
    }

    /// Sets the routes of GSIs `first..first + messages.len()` and hands KVM the table.
    fn set(&self, first: u32, messages: &[Option<Message>]) -> std::io::Result<()> {
        let mut msi = self.msi.lock().unwrap_or_else(|e| e.into_inner());
        let at = (first - FIRST_MSI_GSI) as usize;
        let Some(slots) = msi.get_mut(at..at + messages.len()) else {
            return Err(std::io::Error::other(
                "MSI routes outside the device's GSIs",
            ));
        };
        slots.copy_from_slice(messages);
        let entries = routing_entries(&msi);
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|e| std::io::Error::other(format!("GSI routing table: {e:?}")))?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }
}

/// KVM's default routes (PIC and IOAPIC for GSIs 0-15, the IOAPIC alone for 16-23), then
/// an MSI route for every vector that has a message.
fn routing_entries(msi: &[Option<Message>]) -> Vec<kvm_irq_routing_entry> {
    let irqchip = |gsi: u32, chip: u32, pin: u32| {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_IRQCHIP,
            ..Default::default()
        };
        e.u.irqchip.irqchip = chip;
        e.u.irqchip.pin = pin;
        e
    };
    let mut entries = Vec::new();
    for gsi in 0..FIRST_MSI_GSI {
        entries.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
        if gsi < 16 {
            let pic = if gsi < 8 {
                KVM_IRQCHIP_PIC_MASTER
            } else {
                KVM_IRQCHIP_PIC_SLAVE
            };
            entries.push(irqchip(gsi, pic, gsi % 8));
        }
    }
    for (i, message) in msi.iter().enumerate() {
        if let Some(m) = message {
            let mut e = kvm_irq_routing_entry {
                gsi: FIRST_MSI_GSI + i as u32,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi.address_lo = m.addr as u32;
            e.u.msi.address_hi = (m.addr >> 32) as u32;
            e.u.msi.data = m.data;
            entries.push(e);
        }
    }
    entries
}

/// One device's share of the routes: its vectors are GSIs `first..`.
#[derive(Debug)]
pub struct DeviceRoutes {
    pub routes: Arc<GsiRoutes>,
    pub first: u32,
}

impl MsiRouter for DeviceRoutes {
    fn route(&self, messages: &[Option<Message>]) -> std::io::Result<()> {
        self.routes.set(self.first, messages)
    }
}

/// A device's queue-notify ioeventfds, at [`notify_offset`] in its BAR, moved
/// when the guest moves the BAR.
#[derive(Debug)]
pub struct NotifyEvents {
    pub vm: Arc<VmFd>,
    pub events: Vec<EventFd>,
}

/// Where queue `queue`'s notification lands for a BAR at `bar`.
pub fn notify_addr(bar: u64, queue: usize) -> u64 {
    bar + notify_offset(queue)
}

impl NotifyEvents {
    /// Any write at the queue's own address signals it (the driver writes the queue index
    /// there, of whatever width; each queue has its own address, so no data match).
    pub fn register(&self, bar: u64) -> Result<(), kvm_ioctls::Error> {
        for (queue, evt) in self.events.iter().enumerate() {
            let addr = IoEventAddress::Mmio(notify_addr(bar, queue));
            self.vm.register_ioevent(evt, &addr, NoDatamatch)?;
        }
        Ok(())
    }

    fn unregister(&self, bar: u64) -> Result<(), kvm_ioctls::Error> {
        for (queue, evt) in self.events.iter().enumerate() {
            let addr = IoEventAddress::Mmio(notify_addr(bar, queue));
            self.vm.unregister_ioevent(evt, &addr, NoDatamatch)?;
        }
        Ok(())
    }
}

impl BarMoved for NotifyEvents {
    fn moved(&mut self, from: u64, to: u64) {
        // A failure leaves notifications arriving as MMIO exits, which the transport
        // handles too: slower, never lost.
        if let Err(e) = self.unregister(from).and_then(|()| self.register(to)) {
            log::warn!("virtio-pci: cannot move the queue notifications to {to:#x}: {e}");
        }
    }
}
