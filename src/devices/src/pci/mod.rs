//! PCI for the virtio-pci transport (issue 24, being built): a function's configuration
//! space and its MSI-X vectors, as pure state machines over the guest's reads and writes.
//! Not yet on any bus: `--enable-pci` is still refused.

pub mod config;
pub mod msix;
