//! Firecracker's boot timer (`--boot-timer`): the guest writes the magic byte 123 to offset 0
//! of this MMIO window when it has booted, and ember logs the time since it started.

use std::time::Instant;

use crate::bus::BusDevice;

/// The byte a guest writes to say "booted".
pub const MAGIC: u8 = 123;

#[derive(Debug)]
pub struct BootTimer {
    start: Instant,
    /// The guest boots once: later writes (a guest can write in a loop) are not logged.
    logged: bool,
}

impl BootTimer {
    /// `start` is when the ember process started.
    pub fn new(start: Instant) -> Self {
        BootTimer {
            start,
            logged: false,
        }
    }
}

impl BusDevice for BootTimer {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == 0 && data.first() == Some(&MAGIC) && !self.logged {
            self.logged = true;
            let elapsed = self.start.elapsed();
            log::info!(
                "Guest-boot-time = {:>6} us {} ms",
                elapsed.as_micros(),
                elapsed.as_millis()
            );
        }
    }
}
