//! virtio over MMIO: the transport ([`mmio`]) speaks the virtio 1.x register protocol to the
//! guest and hands each activated device ([`device::VirtioDevice`]) its queues, guest memory
//! and an interrupt line ([`interrupt`]).

pub mod balloon;
pub mod block;
pub mod common;
pub mod device;
pub mod interrupt;
pub mod mmio;
pub mod net;
pub mod pci;
pub mod rng;
pub mod snapshot;
#[cfg(test)]
mod test_utils;
pub mod transport_state;
pub mod vsock;
pub mod watch;

pub use common::{Active, VirtioCommon};
pub(crate) use device::common_accessors;
pub use device::{ActivateError, VirtioDevice};
pub use interrupt::{Interrupt, InterruptKind, IrqTrigger};
pub use mmio::MmioTransport;

/// Guest memory as devices see it. Each region's bitmap records the pages the VMM writes
/// (KVM logs the guest's own writes), for diff snapshots.
pub type GuestMemory = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;
