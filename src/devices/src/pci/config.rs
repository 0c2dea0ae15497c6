//! A PCI function's configuration space as the guest reads and writes it (PCI Local Bus 3.0,
//! chapter 6): the type-0 header, memory BARs with the sizing protocol, and a chain of
//! capabilities. Writes reach only the bits a real device lets software change; everything
//! else (read-only fields, reserved registers, offsets past the 256-byte header) reads as
//! hardware would and ignores writes, so no guest value can break the layout.

use std::mem::offset_of;

/// The size of the conventional configuration space; ECAM gives each function 4 KiB, and
/// what lies past this reads as zero (no extended capabilities).
pub const CONFIG_SIZE: usize = 256;

/// Who the function says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub vendor: u16,
    pub device: u16,
    pub revision: u8,
    /// Class, subclass and programming interface.
    pub class: u32,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
}

/// A 64-bit, prefetchable memory BAR of `size` bytes (a power of two, at least 4 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    pub size: u64,
}

/// The type-0 header (PCI Local Bus 3.0, 6.1), whose layout gives the registers' offsets.
#[allow(dead_code, reason = "only the layout is used, through offset_of!")]
#[repr(C)]
struct Header {
    vendor_id: u16,
    device_id: u16,
    command: u16,
    status: u16,
    revision: u8,
    class_code: [u8; 3],
    cache_line_size: u8,
    latency_timer: u8,
    header_type: u8,
    bist: u8,
    bars: [u32; 6],
    cardbus_cis: u32,
    subsystem_vendor_id: u16,
    subsystem_id: u16,
    expansion_rom: u32,
    capabilities_pointer: u8,
    reserved: [u8; 7],
    interrupt_line: u8,
    interrupt_pin: u8,
    min_grant: u8,
    max_latency: u8,
}

const COMMAND: usize = offset_of!(Header, command);
const STATUS: usize = offset_of!(Header, status);
const BAR0: usize = offset_of!(Header, bars);
const CAPABILITIES_POINTER: usize = offset_of!(Header, capabilities_pointer);
/// Where capabilities may start: after the header.
const FIRST_CAPABILITY: usize = size_of::<Header>();
const _: () = assert!(FIRST_CAPABILITY == 0x40);

/// Command bits software may set: memory space, bus master, INTx disable.
const COMMAND_WRITABLE: u16 = COMMAND_MEMORY | (1 << 2) | (1 << 10);
const COMMAND_MEMORY: u16 = 1 << 1;
const STATUS_CAPABILITIES: u16 = 1 << 4;
const BAR_64BIT: u32 = 0b100;
const BAR_PREFETCHABLE: u32 = 0b1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    /// Per byte, the bits a guest write may change.
    writable: [u8; CONFIG_SIZE],
    bars: Vec<Bar>,
    /// The end of the capabilities written so far, and the last one's offset.
    caps_end: usize,
    last_cap: Option<usize>,
}

impl ConfigSpace {
    /// A type-0 header with `bars` (in BAR0/1, BAR2/3, … as 64-bit pairs, at most three),
    /// no I/O space and no legacy interrupt pin (MSI-X only).
    pub fn new(ids: Ids, bars: &[Bar]) -> Self {
        assert!(bars.len() <= 3, "three 64-bit BARs fill the header");
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            bars: bars.to_vec(),
            caps_end: FIRST_CAPABILITY,
            last_cap: None,
        };
        c.put(offset_of!(Header, vendor_id), &ids.vendor.to_le_bytes());
        c.put(offset_of!(Header, device_id), &ids.device.to_le_bytes());
        c.put(offset_of!(Header, revision), &[ids.revision]);
        c.put(
            offset_of!(Header, class_code),
            &ids.class.to_le_bytes()[..3],
        );
        c.put(offset_of!(Header, header_type), &[0]);
        c.put(
            offset_of!(Header, subsystem_vendor_id),
            &ids.subsystem_vendor.to_le_bytes(),
        );
        c.put(
            offset_of!(Header, subsystem_id),
            &ids.subsystem.to_le_bytes(),
        );
        c.allow(COMMAND, &COMMAND_WRITABLE.to_le_bytes());
        for (i, bar) in bars.iter().enumerate() {
            assert!(
                bar.size.is_power_of_two() && bar.size >= 4096,
                "BAR size {:#x}",
                bar.size
            );
            let at = BAR0 + 8 * i;
            let mask = !(bar.size - 1);
            c.put(at, &(BAR_64BIT | BAR_PREFETCHABLE).to_le_bytes());
            c.allow(at, &(mask as u32).to_le_bytes());
            c.allow(at + 4, &((mask >> 32) as u32).to_le_bytes());
        }
        c.allow(offset_of!(Header, interrupt_line), &[0xff]);
        c.put(offset_of!(Header, interrupt_pin), &[0]);
        c
    }

    fn put(&mut self, at: usize, bytes: &[u8]) {
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn allow(&mut self, at: usize, mask: &[u8]) {
        self.writable[at..at + mask.len()].copy_from_slice(mask);
    }

    /// Appends a capability: `body` starts with its ID and a placeholder next pointer;
    /// `writable` gives, per byte of it, the bits the guest may change. Returns its offset.
    pub fn add_capability(&mut self, body: &[u8], writable: &[u8]) -> usize {
        assert!(body.len() >= 2 && writable.len() <= body.len());
        let at = self.caps_end.next_multiple_of(4);
        assert!(
            at + body.len() <= CONFIG_SIZE,
            "capabilities overflow the header"
        );
        self.put(at, body);
        self.bytes[at + 1] = 0;
        self.allow(at, writable);
        match self.last_cap {
            None => {
                self.bytes[CAPABILITIES_POINTER] = at as u8;
                let status = u16::from_le_bytes([self.bytes[STATUS], self.bytes[STATUS + 1]]);
                self.put(STATUS, &(status | STATUS_CAPABILITIES).to_le_bytes());
            }
            Some(prev) => self.bytes[prev + 1] = at as u8,
        }
        self.last_cap = Some(at);
        self.caps_end = at + body.len();
        at
    }

    /// A read of `data.len()` bytes (1, 2 or 4, aligned) at `offset`; anything else, and
    /// the extended space, reads as zeros.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(at) = checked(offset, data.len()) {
            data.copy_from_slice(&self.bytes[at..at + data.len()]);
        }
    }

    /// A write; only the writable bits change.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(at) = checked(offset, data.len()) else {
            return;
        };
        for (i, b) in data.iter().enumerate() {
            let m = self.writable[at + i];
            self.bytes[at + i] = (self.bytes[at + i] & !m) | (b & m);
        }
    }

    /// The 16-bit value at `at` (a capability's control word, the command register).
    pub fn word(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    /// Where BAR `index` is, if the guest has placed it (any non-zero address).
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        self.bars.get(index)?;
        let at = BAR0 + 8 * index;
        let lo = u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap());
        let hi = u32::from_le_bytes(self.bytes[at + 4..at + 8].try_into().unwrap());
        let addr = (u64::from(hi) << 32) | u64::from(lo & !0xf);
        (addr != 0).then_some(addr)
    }

    /// Places BAR `index` at `addr` and turns memory decoding on (the firmware's job, which
    /// Ember does before boot).
    pub fn set_bar_address(&mut self, index: usize, addr: u64) {
        let size = self.bars[index].size;
        assert_eq!(addr % size, 0, "BAR {index} misaligned");
        let at = BAR0 + 8 * index;
        let lo = (addr as u32) | BAR_64BIT | BAR_PREFETCHABLE;
        self.put(at, &lo.to_le_bytes());
        self.put(at + 4, &((addr >> 32) as u32).to_le_bytes());
        let command = self.word(COMMAND) | COMMAND_MEMORY;
        self.put(COMMAND, &command.to_le_bytes());
    }

    /// Whether the function answers in its memory BARs (the command register's bit 1).
    pub fn memory_enabled(&self) -> bool {
        self.word(COMMAND) & COMMAND_MEMORY != 0
    }

    /// The whole space, for a snapshot.
    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.bytes
    }

    /// Puts back a snapshot's bytes, if they are this function's: every bit the guest
    /// cannot write (identity, BAR types, capability layout) must be as here.
    pub fn restore_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() != CONFIG_SIZE {
            return Err(format!(
                "{} bytes of configuration space, not {CONFIG_SIZE}",
                bytes.len()
            ));
        }
        let differs =
            (0..CONFIG_SIZE).find(|&i| (bytes[i] ^ self.bytes[i]) & !self.writable[i] != 0);
        if let Some(at) = differs {
            return Err(format!(
                "configuration space differs from this device's at read-only byte {at:#x}"
            ));
        }
        self.bytes.copy_from_slice(bytes);
        Ok(())
    }
}

/// The header offset of an aligned 1-, 2- or 4-byte access inside the 256 bytes.
fn checked(offset: u64, len: usize) -> Option<usize> {
    let at = usize::try_from(offset).ok()?;
    let ok = matches!(len, 1 | 2 | 4) && at % len == 0 && at + len <= CONFIG_SIZE;
    ok.then_some(at)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A virtio block device's identity, for tests.
    pub(crate) const IDS: Ids = Ids {
        vendor: 0x1af4,
        device: 0x1042,
        revision: 1,
        class: 0x01_80_00,
        subsystem_vendor: 0x1af4,
        subsystem: 0x40,
    };

    fn read32(c: &ConfigSpace, at: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn the_header_says_who_the_device_is() {
        let c = ConfigSpace::new(IDS, &[Bar { size: 0x4000 }]);
        assert_eq!(read32(&c, 0), 0x1042_1af4);
        assert_eq!(read32(&c, 8), 0x0180_0001);
        assert_eq!(read32(&c, 0x2c), 0x0040_1af4);
        assert_eq!(read32(&c, 0x0c) >> 16 & 0xff, 0, "type-0 header");
    }

    #[test]
    fn bar_sizing_reads_back_the_size_and_the_type_bits_stay() {
        let mut c = ConfigSpace::new(IDS, &[Bar { size: 0x4000 }]);
        c.write(0x10, &u32::MAX.to_le_bytes());
        c.write(0x14, &u32::MAX.to_le_bytes());
        assert_eq!(read32(&c, 0x10), 0xffff_c00c);
        assert_eq!(read32(&c, 0x14), 0xffff_ffff);
        c.write(0x10, &0xe000_4000u32.to_le_bytes());
        c.write(0x14, &0x1u32.to_le_bytes());
        assert_eq!(c.bar_address(0), Some(0x1_e000_4000));
        // An unused BAR reads as zero and cannot be made to claim anything.
        c.write(0x18, &u32::MAX.to_le_bytes());
        assert_eq!(read32(&c, 0x18), 0);
        assert_eq!(c.bar_address(1), None);
    }

    #[test]
    fn read_only_fields_ignore_writes_and_bad_accesses_read_zero() {
        let mut c = ConfigSpace::new(IDS, &[]);
        c.write(0, &0u32.to_le_bytes());
        assert_eq!(read32(&c, 0), 0x1042_1af4);
        c.write(4, &0xffffu16.to_le_bytes());
        assert_eq!(c.word(COMMAND), COMMAND_WRITABLE);
        let mut b = [0xaau8; 4];
        c.read(2, &mut b); // misaligned
        assert_eq!(b, [0; 4]);
        c.read(0x100, &mut b); // extended space
        assert_eq!(b, [0; 4]);
        let mut three = [0xaau8; 3];
        c.read(0, &mut three);
        assert_eq!(three, [0; 3]);
        c.write(0xfff, &[1]);
        c.write(u64::MAX, &[1, 2, 3, 4]);
    }

    #[test]
    fn capabilities_chain_from_the_pointer_and_keep_their_writable_bits() {
        let mut c = ConfigSpace::new(IDS, &[]);
        let a = c.add_capability(&[0x11, 0xee, 0x07, 0x00], &[0, 0, 0, 0xc0]);
        let b = c.add_capability(&[0x09, 0, 16, 1, 0, 0, 0, 0], &[]);
        assert_eq!(read32(&c, 4) >> 16 & u32::from(STATUS_CAPABILITIES), 0x10);
        let mut p = [0u8];
        c.read(0x34, &mut p);
        assert_eq!(usize::from(p[0]), a);
        c.read(a as u64 + 1, &mut p);
        assert_eq!(usize::from(p[0]), b);
        c.read(b as u64 + 1, &mut p);
        assert_eq!(p[0], 0, "the last one ends the chain");
        c.write(a as u64 + 2, &0xffffu16.to_le_bytes());
        assert_eq!(c.word(a + 2), 0xc007);
    }
}
