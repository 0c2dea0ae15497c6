//! PCI for the virtio-pci transport: a function's configuration space and its MSI-X
//! vectors, as pure state machines over the guest's reads and writes, and the root bus that
//! the guest reaches them through.

pub mod config;
pub mod msix;
pub mod root;
