//! An address map from guest port or MMIO addresses to devices. Built once before the vCPUs
//! start and then only read, so vCPU threads share it without a lock; each device has its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device reached through port I/O or MMIO. `offset` is relative to its base address.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the device range {base:#x}+{len:#x} overlaps another device or wraps around")]
    Overlap { base: u64, len: u64 },
}

type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Non-overlapping `[base, base + len)` ranges, each with its device.
#[derive(Default)]
pub struct Bus {
    ranges: BTreeMap<u64, (u64, SharedDevice)>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.ranges.iter().map(|(b, (l, _))| (b, l)))
            .finish()
    }
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), Error> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(Error::Overlap { base, len })?;
        let before = self.ranges.range(..end).next_back();
        if let Some((&b, &(l, _))) = before {
            if b + l > base {
                return Err(Error::Overlap { base, len });
            }
        }
        self.ranges.insert(base, (len, device));
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(u64, &SharedDevice)> {
        let (&base, (len, device)) = self.ranges.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(size as u64)? <= *len).then_some((offset, device))
    }

    /// Reads from the device at `addr`; false when nothing is mapped there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((offset, device)) => {
                lock(device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Writes to the device at `addr`; false when nothing is mapped there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((offset, device)) => {
                lock(device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device; a poisoned lock (a thread panicked holding it) still gives the device,
/// whose state is plain data, so one failure does not cascade into every vCPU.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn routes_by_range_and_offset() {
        let dev = Arc::new(Mutex::new(Echo(vec![])));
        let mut bus = Bus::new();
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fd, &mut b));
        assert_eq!(b[0], 5);
        assert!(bus.write(0x3f8, &[7]));
        assert!(!bus.read(0x400, &mut b));
        assert!(
            !bus.read(0x3ff, &mut [0u8; 2]),
            "access running past the end"
        );
        assert_eq!(dev.lock().unwrap().0, vec![(0, vec![7])]);
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let dev = Arc::new(Mutex::new(Echo(vec![])));
        let mut bus = Bus::new();
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        assert!(bus.insert(0x108, 0x10, dev.clone()).is_err());
        assert!(bus.insert(0xf8, 0x10, dev.clone()).is_err());
        assert!(bus.insert(0x200, 0, dev.clone()).is_err());
        assert!(bus.insert(u64::MAX, 2, dev.clone()).is_err());
        bus.insert(0x110, 0x10, dev).unwrap();
    }
}
