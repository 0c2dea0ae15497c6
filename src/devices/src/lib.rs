//! Ember's guest-visible devices. Everything here is driven by untrusted guest writes, so every
//! path answers bad input with a device error for the guest, never a panic.
//!
//! - [`bus`]: the address map from port or MMIO address to device.
//! - [`legacy`]: the 8250 serial console and the i8042 controller (whose reset ends the VM).
//! - [`virtio`]: the virtio-mmio transport and the virtio devices behind it.
//! - [`rate_limiter`]: the token buckets that bound a device's I/O.

pub mod bus;
pub mod legacy;
pub mod pci;
pub mod rate_limiter;
mod sys;
pub mod virtio;

pub use bus::{Bus, BusDevice};
