//! virtio-net on a host TAP device. Guest frames from the TX queue go to the TAP, or to the
//! MMDS when they are addressed to it; frames from the TAP and the MMDS fill the RX queue.

mod device;
pub mod tap;

pub use device::{Error, MmdsLink, Net, NetConfig, QUEUE_SIZE};
pub use tap::{Tap, TapError};

#[cfg(test)]
mod tests;
