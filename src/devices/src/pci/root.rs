//! The PCI root bus, segment 0 bus 0: a host bridge at 00.0 and one single-function device
//! per slot from 01.0 on. The guest reaches configuration space two ways, both decoded here:
//! configuration mechanism #1 (the address latch at port 0xcf8, data at 0xcfc; what a
//! kernel without ACPI uses) and ECAM (4 KiB per function in an MMIO window, announced by
//! the MCFG table). Each function's memory BAR decodes inside one MMIO window, looked up by
//! where the guest has the BAR now, so a BAR the guest moves needs no change to the buses.
//! Absent functions read as all ones, as on real hardware.

use std::sync::{Arc, Mutex};

use super::config::{ConfigSpace, Ids};
use crate::bus::{lock, BusDevice};

/// Slots 1 to 31 hold devices (slot 0 is the host bridge).
pub const MAX_DEVICES: usize = 31;
/// ECAM: one bus of 32 devices × 8 functions × 4 KiB.
pub const ECAM_SIZE: u64 = 32 * 8 * 4096;
const CONFIG_ADDRESS_ENABLE: u32 = 1 << 31;

/// The host bridge's identity: Red Hat's PCIe host bridge ID, as virtual machines commonly
/// use, class "host bridge".
const HOST_BRIDGE: Ids = Ids {
    vendor: 0x1b36,
    device: 0x0008,
    revision: 0,
    class: 0x06_00_00,
    subsystem_vendor: 0x1b36,
    subsystem: 0,
};

/// A function on the bus (a virtio-pci transport): its configuration space and its one
/// memory BAR.
pub trait PciFunction: Send {
    fn config_read(&self, offset: u64, data: &mut [u8]);
    fn config_write(&mut self, offset: u64, data: &[u8]);
    /// Where the BAR decodes now (address, size): None while the guest has memory decoding
    /// off or the BAR unplaced.
    fn bar(&self) -> Option<(u64, u64)>;
    fn bar_read(&mut self, offset: u64, data: &mut [u8]);
    fn bar_write(&mut self, offset: u64, data: &[u8]);
}

/// Told when the guest places a function's BAR somewhere new, so that what KVM decodes
/// there itself (the queue-notify ioeventfds) moves with it.
pub trait BarMoved: Send {
    fn moved(&mut self, from: u64, to: u64);
}

struct Slot {
    function: Arc<Mutex<dyn PciFunction>>,
    /// Where the BAR was last decoding (kept while decoding is off: a BAR is sized with
    /// decoding off and usually put back where it was).
    placed: Option<u64>,
    on_move: Option<Box<dyn BarMoved>>,
}

impl Slot {
    /// If the function's BAR now decodes somewhere new, what KVM decodes there moves too.
    /// While decoding is off the BAR stays placed where it was.
    fn follow_bar(&mut self) {
        let Some(to) = lock(&self.function).bar().map(|(addr, _)| addr) else {
            return;
        };
        if let (Some(from), Some(on_move)) = (self.placed, self.on_move.as_mut()) {
            if from != to {
                on_move.moved(from, to);
            }
        }
        self.placed = Some(to);
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the PCI bus is full: at most {MAX_DEVICES} devices")]
pub struct BusFull;

pub struct PciRoot {
    bridge: ConfigSpace,
    slots: Vec<Slot>,
}

impl std::fmt::Debug for PciRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciRoot")
            .field("devices", &self.slots.len())
            .finish()
    }
}

impl Default for PciRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl PciRoot {
    pub fn new() -> Self {
        PciRoot {
            bridge: ConfigSpace::new(HOST_BRIDGE, &[]),
            slots: Vec::new(),
        }
    }

    /// Puts `function` in the next free slot; returns the slot (the device number).
    pub fn add(
        &mut self,
        function: Arc<Mutex<dyn PciFunction>>,
        on_move: Option<Box<dyn BarMoved>>,
    ) -> Result<u8, BusFull> {
        if self.slots.len() == MAX_DEVICES {
            return Err(BusFull);
        }
        let placed = lock(&function).bar().map(|(addr, _)| addr);
        self.slots.push(Slot {
            function,
            placed,
            on_move,
        });
        Ok(self.slots.len() as u8)
    }

    /// A configuration read of device `device`, function `function` on bus 0.
    pub fn config_read(&self, device: u8, function: u8, offset: u64, data: &mut [u8]) {
        match (device, function) {
            (0, 0) => self.bridge.read(offset, data),
            (d, 0) if usize::from(d) <= self.slots.len() => {
                lock(&self.slots[usize::from(d) - 1].function).config_read(offset, data);
            }
            _ => data.fill(0xff),
        }
    }

    /// A configuration write; if it placed the function's BAR somewhere new, the BAR's
    /// ioeventfds follow.
    pub fn config_write(&mut self, device: u8, function: u8, offset: u64, data: &[u8]) {
        match (device, function) {
            (0, 0) => self.bridge.write(offset, data),
            (d, 0) if usize::from(d) <= self.slots.len() => {
                let slot = &mut self.slots[usize::from(d) - 1];
                lock(&slot.function).config_write(offset, data);
                slot.follow_bar();
            }
            _ => {}
        }
    }

    /// After a restore put back the functions' configuration spaces: BARs the guest had
    /// moved take their ioeventfds along.
    pub fn refresh_bars(&mut self) {
        self.slots.iter_mut().for_each(Slot::follow_bar);
    }

    /// The function whose BAR decodes `addr`, and the offset in it.
    fn decoding(&self, addr: u64, len: usize) -> Option<(&Arc<Mutex<dyn PciFunction>>, u64)> {
        self.slots.iter().find_map(|slot| {
            let (base, size) = lock(&slot.function).bar()?;
            let offset = addr.checked_sub(base)?;
            (offset.checked_add(len as u64)? <= size).then_some((&slot.function, offset))
        })
    }
}

/// `[u8]` of all ones, what a read that nothing decodes returns.
fn all_ones(data: &mut [u8]) {
    data.fill(0xff);
}

/// Configuration mechanism #1 at ports 0xcf8-0xcff.
#[derive(Debug)]
pub struct PciConfigIo {
    root: Arc<Mutex<PciRoot>>,
    address: u32,
}

impl PciConfigIo {
    pub fn new(root: Arc<Mutex<PciRoot>>) -> Self {
        PciConfigIo { root, address: 0 }
    }

    /// The (device, function, register) the latch selects for a data access at byte `byte`
    /// of the data window, if enabled and on bus 0.
    fn target(&self, byte: u64) -> Option<(u8, u8, u64)> {
        let a = self.address;
        let on_bus0 = a & CONFIG_ADDRESS_ENABLE != 0 && (a >> 16) & 0xff == 0;
        on_bus0.then(|| {
            let device = ((a >> 11) & 0x1f) as u8;
            let function = ((a >> 8) & 0x7) as u8;
            (device, function, u64::from(a & 0xfc) + byte)
        })
    }
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match offset {
            0 if data.len() == 4 => data.copy_from_slice(&self.address.to_le_bytes()),
            4..=7 if offset - 4 + data.len() as u64 <= 4 => match self.target(offset - 4) {
                Some((d, f, reg)) => lock(&self.root).config_read(d, f, reg, data),
                None => all_ones(data),
            },
            _ => all_ones(data),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            0 if data.len() == 4 => {
                // Bits 30:24 are reserved and 1:0 select type 0/1: neither is kept.
                let value = u32::from_le_bytes(data.try_into().unwrap_or_default());
                self.address = value & 0x80ff_fffc;
            }
            4..=7 if offset - 4 + data.len() as u64 <= 4 => {
                if let Some((d, f, reg)) = self.target(offset - 4) {
                    lock(&self.root).config_write(d, f, reg, data);
                }
            }
            _ => {}
        }
    }
}

/// ECAM for bus 0: byte `(device << 15) | (function << 12) | register` of the window.
#[derive(Debug)]
pub struct PciEcam {
    root: Arc<Mutex<PciRoot>>,
}

impl PciEcam {
    pub fn new(root: Arc<Mutex<PciRoot>>) -> Self {
        PciEcam { root }
    }
}

fn ecam_target(offset: u64) -> (u8, u8, u64) {
    (
        ((offset >> 15) & 0x1f) as u8,
        ((offset >> 12) & 0x7) as u8,
        offset & 0xfff,
    )
}

impl BusDevice for PciEcam {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let (d, f, reg) = ecam_target(offset);
        lock(&self.root).config_read(d, f, reg, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (d, f, reg) = ecam_target(offset);
        lock(&self.root).config_write(d, f, reg, data);
    }
}

/// The MMIO window the functions' BARs decode in; `base` is where it starts, so that bus
/// offsets become guest addresses again.
#[derive(Debug)]
pub struct PciBarWindow {
    root: Arc<Mutex<PciRoot>>,
    base: u64,
}

impl PciBarWindow {
    pub fn new(root: Arc<Mutex<PciRoot>>, base: u64) -> Self {
        PciBarWindow { root, base }
    }

    fn with_function(&self, offset: u64, len: usize, f: impl FnOnce(&mut dyn PciFunction, u64)) {
        let root = lock(&self.root);
        if let Some((function, at)) = root.decoding(self.base + offset, len) {
            let function = function.clone();
            drop(root);
            f(&mut *lock(&function), at);
        }
    }
}

impl BusDevice for PciBarWindow {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        all_ones(data);
        let len = data.len();
        self.with_function(offset, len, |f, at| f.bar_read(at, data));
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.with_function(offset, data.len(), |f, at| f.bar_write(at, data));
    }
}

#[cfg(test)]
mod tests;
