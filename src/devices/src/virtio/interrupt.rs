//! How a virtio device interrupts its driver, whatever the transport: the [`Interrupt`]
//! trait a device calls, and the virtio-mmio transport's [`IrqTrigger`] (the
//! InterruptStatus bits the guest reads and acknowledges, and the irqfd that raises the
//! line).

use std::sync::atomic::{AtomicU32, Ordering};

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use vmm_sys_util::eventfd::EventFd;

/// Why the device interrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptKind {
    /// The device put buffers in the used ring of this queue (a transport with a vector per
    /// queue interrupts that queue's; virtio-mmio has one line for all).
    Queue(u16),
    /// The configuration space (or the device status) changed.
    Config,
}

/// What a device holds to interrupt its driver; the transport decides how.
pub trait Interrupt: Send + Sync + std::fmt::Debug {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()>;
}

#[derive(Debug)]
pub struct IrqTrigger {
    status: AtomicU32,
    irqfd: EventFd,
}

impl IrqTrigger {
    pub fn new(irqfd: EventFd) -> Self {
        IrqTrigger {
            status: AtomicU32::new(0),
            irqfd,
        }
    }

    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }

    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Raises the status bits `bits` without interrupting (a restored device's pending ones).
    pub fn set(&self, bits: u32) {
        self.status.fetch_or(
            bits & (VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG),
            Ordering::SeqCst,
        );
    }

    pub fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
    }
}

impl Interrupt for IrqTrigger {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        let bit = match kind {
            InterruptKind::Queue(_) => VIRTIO_MMIO_INT_VRING,
            InterruptKind::Config => VIRTIO_MMIO_INT_CONFIG,
        };
        self.status.fetch_or(bit, Ordering::SeqCst);
        self.irqfd.write(1)
    }
}
