//! A virtio-pci device's interrupts: MSI-X, one vector per queue and one for configuration
//! changes as the driver assigns them. A vector's message goes to KVM as a GSI route that
//! the VMM keeps equal to the MSI-X table ([`MsiRouter`]); firing a vector is a write to
//! that route's irqfd. The ISR status byte is kept too (virtio's legacy-interrupt register,
//! which a driver may read even with MSI-X).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

use crate::pci::msix::{Message, Msix, NO_VECTOR};
use crate::virtio::{Interrupt, InterruptKind};

const ISR_QUEUE: u8 = 1;
const ISR_CONFIG: u8 = 2;

/// How the VMM keeps KVM's routes equal to the guest's MSI-X table.
pub trait MsiRouter: Send + Sync + std::fmt::Debug {
    /// Points each vector's route at its message, or removes it (None: masked, disabled).
    /// All at once, as KVM replaces its whole routing table in one call.
    fn route(&self, messages: &[Option<Message>]) -> std::io::Result<()>;
}

/// Which vector each queue and configuration changes use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Vectors {
    pub config: u16,
    pub queues: Vec<u16>,
}

#[derive(Debug)]
pub struct PciInterrupt {
    pub msix: Mutex<Msix>,
    pub vectors: Mutex<Vectors>,
    /// One per MSI-X vector, each the irqfd of that vector's route.
    irqfds: Vec<EventFd>,
    isr: AtomicU8,
    router: Box<dyn MsiRouter>,
}

impl PciInterrupt {
    /// `irqfds` gives the number of vectors; every vector starts masked and unassigned.
    pub fn new(queues: usize, irqfds: Vec<EventFd>, router: Box<dyn MsiRouter>) -> Self {
        let count = u16::try_from(irqfds.len()).expect("at most 2048 vectors");
        PciInterrupt {
            msix: Mutex::new(Msix::new(count)),
            vectors: Mutex::new(Vectors {
                config: NO_VECTOR,
                queues: vec![NO_VECTOR; queues],
            }),
            irqfds,
            isr: AtomicU8::new(0),
            router,
        }
    }

    pub fn vector_count(&self) -> u16 {
        self.irqfds.len() as u16
    }

    /// The ISR status, cleared by the read (virtio 4.1.4.5).
    pub fn read_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::SeqCst)
    }

    /// After the guest changed the MSI-X table or control: every vector's route again, then
    /// the messages that were pending on a vector now unmasked.
    pub fn update_routes(&self, released: Vec<(u16, Message)>) {
        let msix = self.msix.lock().unwrap_or_else(|e| e.into_inner());
        let messages: Vec<_> = (0..self.vector_count()).map(|v| msix.route(v)).collect();
        drop(msix);
        if let Err(e) = self.router.route(&messages) {
            log::warn!("virtio-pci: cannot route the MSI-X vectors: {e}");
        }
        for (v, _) in released {
            let _ = self.irqfds[usize::from(v)].write(1);
        }
    }

    fn fire(&self, vector: u16) -> std::io::Result<()> {
        if vector == NO_VECTOR || usize::from(vector) >= self.irqfds.len() {
            return Ok(());
        }
        let message = self
            .msix
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fire(vector);
        match message {
            Some(_) => self.irqfds[usize::from(vector)].write(1),
            None => Ok(()),
        }
    }

    /// The ISR status without clearing it (a snapshot's).
    pub fn isr(&self) -> u8 {
        self.isr.load(Ordering::SeqCst)
    }

    /// Takes a snapshot's MSI-X state, vector assignments and ISR byte, and routes the
    /// vectors in KVM as the table says. Nothing in them is trusted: a table of another
    /// size or assignments for another number of queues are refused, and a vector number
    /// past the table is as good as none (it never fires).
    pub fn restore(&self, msix: &Msix, vectors: &Vectors, isr: u8) -> Result<(), String> {
        let mut v = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        if vectors.queues.len() != v.queues.len() {
            return Err(format!(
                "MSI-X vectors for {} queues where the device has {}",
                vectors.queues.len(),
                v.queues.len()
            ));
        }
        self.msix
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restore(msix)?;
        *v = vectors.clone();
        drop(v);
        self.isr
            .store(isr & (ISR_QUEUE | ISR_CONFIG), Ordering::SeqCst);
        self.update_routes(Vec::new());
        Ok(())
    }

    /// Forgets every assignment and pending bit (a device reset; the table stays, as on
    /// hardware the function's MSI-X table survives a virtio reset).
    pub fn reset(&self) {
        let mut v = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        v.config = NO_VECTOR;
        v.queues.fill(NO_VECTOR);
        self.isr.store(0, Ordering::SeqCst);
    }
}

impl Interrupt for PciInterrupt {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        let vectors = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        let (bit, vector) = match kind {
            InterruptKind::Queue(q) => (
                ISR_QUEUE,
                vectors
                    .queues
                    .get(usize::from(q))
                    .copied()
                    .unwrap_or(NO_VECTOR),
            ),
            InterruptKind::Config => (ISR_CONFIG, vectors.config),
        };
        drop(vectors);
        self.isr.fetch_or(bit, Ordering::SeqCst);
        self.fire(vector)
    }
}
