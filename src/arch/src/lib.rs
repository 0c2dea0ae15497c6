//! x86_64 boot support for Ember: everything the guest finds in memory and in its registers
//! when its first instruction runs. Pure functions over guest memory and KVM register
//! structures; no KVM file descriptors live here, so all of it is unit-tested without a VM.

pub mod acpi;
pub mod boot_params;
mod checksum;
pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod loader;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;

pub use loader::{BootProtocol, KernelEntry};
