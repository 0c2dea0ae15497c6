//! MSI-X (PCI Local Bus 3.0, 6.8.2): the capability's control word, the vector table and
//! the pending-bit array, as the guest programs them. A vector fires as a message (an
//! address and data the VMM hands to KVM) only when MSI-X is enabled and neither the
//! function nor the vector is masked; otherwise its pending bit is set and it fires when
//! unmasked, as hardware does. Table and PBA accesses of a wrong size or offset read zero
//! and change nothing.

/// The capability's ID and its size in configuration space.
pub const CAPABILITY_ID: u8 = 0x11;
pub const CAPABILITY_LEN: usize = 12;
const ENABLE: u16 = 1 << 15;
const FUNCTION_MASK: u16 = 1 << 14;
const ENTRY_LEN: usize = 16;
const VECTOR_MASKED: u32 = 1;
/// The vector number meaning "none" in virtio's `*_msix_vector` fields.
pub const NO_VECTOR: u16 = 0xffff;

/// What the device raises for a vector: a write of `data` to `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub addr: u64,
    pub data: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Msix {
    /// Per vector: address low, address high, data, vector control.
    table: Vec<[u32; 4]>,
    pending: Vec<bool>,
    control: u16,
}

impl Msix {
    /// `vectors` vectors (1 to 2048), all masked, MSI-X disabled: the reset state.
    pub fn new(vectors: u16) -> Self {
        assert!((1..=2048).contains(&vectors));
        Msix {
            table: vec![[0, 0, 0, VECTOR_MASKED]; usize::from(vectors)],
            pending: vec![false; usize::from(vectors)],
            control: vectors - 1,
        }
    }

    pub fn vectors(&self) -> u16 {
        self.table.len() as u16
    }

    /// Takes a snapshot's table, pending bits and control word, if they fit this function
    /// (as many vectors); the control word keeps only what the guest can set.
    pub fn restore(&mut self, saved: &Msix) -> Result<(), String> {
        if saved.table.len() != self.table.len() || saved.pending.len() != self.pending.len() {
            return Err(format!(
                "{} MSI-X vectors where this device has {}",
                saved.table.len(),
                self.table.len()
            ));
        }
        self.table.clone_from(&saved.table);
        self.pending.clone_from(&saved.pending);
        self.control =
            (self.control & !(ENABLE | FUNCTION_MASK)) | (saved.control & (ENABLE | FUNCTION_MASK));
        Ok(())
    }

    /// The capability's bytes for configuration space (ID, next, control, table and PBA
    /// locations in BAR `bar`), and the bits the guest may write (enable, function mask).
    pub fn capability(&self, bar: u8, table_offset: u32, pba_offset: u32) -> ([u8; 12], [u8; 4]) {
        let mut c = [0u8; CAPABILITY_LEN];
        c[0] = CAPABILITY_ID;
        c[2..4].copy_from_slice(&self.control.to_le_bytes());
        c[4..8].copy_from_slice(&(table_offset | u32::from(bar)).to_le_bytes());
        c[8..12].copy_from_slice(&(pba_offset | u32::from(bar)).to_le_bytes());
        (c, [0, 0, 0, 0xc0])
    }

    pub fn table_len(&self) -> u64 {
        (self.table.len() * ENTRY_LEN) as u64
    }

    pub fn pba_len(&self) -> u64 {
        (self.table.len().div_ceil(64) * 8) as u64
    }

    pub fn enabled(&self) -> bool {
        self.control & ENABLE != 0
    }

    /// The guest wrote the capability's control word (as configuration space now holds
    /// it); the vectors whose pending message may now go out.
    pub fn set_control(&mut self, control: u16) -> Vec<(u16, Message)> {
        self.control =
            (self.control & !(ENABLE | FUNCTION_MASK)) | (control & (ENABLE | FUNCTION_MASK));
        self.flush_pending()
    }

    fn deliverable(&self, vector: usize) -> bool {
        self.enabled()
            && self.control & FUNCTION_MASK == 0
            && self.table[vector][3] & VECTOR_MASKED == 0
    }

    fn message(&self, vector: usize) -> Message {
        let e = self.table[vector];
        Message {
            addr: (u64::from(e[1]) << 32) | u64::from(e[0]),
            data: e[2],
        }
    }

    fn flush_pending(&mut self) -> Vec<(u16, Message)> {
        let mut out = Vec::new();
        for v in 0..self.table.len() {
            if self.pending[v] && self.deliverable(v) {
                self.pending[v] = false;
                out.push((v as u16, self.message(v)));
            }
        }
        out
    }

    /// The device raises `vector`: its message, or None if it is masked (now pending) or
    /// out of range (ignored).
    pub fn fire(&mut self, vector: u16) -> Option<Message> {
        let v = usize::from(vector);
        if v >= self.table.len() {
            return None;
        }
        if self.deliverable(v) {
            Some(self.message(v))
        } else {
            self.pending[v] = true;
            None
        }
    }

    /// The message vector `vector` would send now, if deliverable (for the VMM's routes).
    pub fn route(&self, vector: u16) -> Option<Message> {
        let v = usize::from(vector);
        (v < self.table.len() && self.deliverable(v)).then(|| self.message(v))
    }

    fn dword_at(&self, offset: u64, len: usize, limit: u64) -> Option<usize> {
        let end = offset.checked_add(len as u64)?;
        let ok = matches!(len, 4 | 8) && offset.is_multiple_of(len as u64) && end <= limit;
        ok.then_some((offset / 4) as usize)
    }

    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = self.dword_at(offset, data.len(), self.table_len()) else {
            return;
        };
        for (i, chunk) in data.chunks_mut(4).enumerate() {
            let d = first + i;
            chunk.copy_from_slice(&self.table[d / 4][d % 4].to_le_bytes());
        }
    }

    /// A table write; the vectors whose pending message may now go out (one unmasked).
    pub fn table_write(&mut self, offset: u64, data: &[u8]) -> Vec<(u16, Message)> {
        let Some(first) = self.dword_at(offset, data.len(), self.table_len()) else {
            return Vec::new();
        };
        for (i, chunk) in data.chunks(4).enumerate() {
            let d = first + i;
            let value = u32::from_le_bytes(chunk.try_into().expect("4-byte chunk"));
            // Only the mask bit of vector control is writable.
            self.table[d / 4][d % 4] = if d % 4 == 3 {
                value & VECTOR_MASKED
            } else {
                value
            };
        }
        self.flush_pending()
    }

    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = self.dword_at(offset, data.len(), self.pba_len()) else {
            return;
        };
        for (i, chunk) in data.chunks_mut(4).enumerate() {
            let bits = (0..32).fold(0u32, |acc, b| {
                let v = (first + i) * 32 + b;
                acc | (u32::from(self.pending.get(v) == Some(&true)) << b)
            });
            chunk.copy_from_slice(&bits.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(
        m: &mut Msix,
        vector: u64,
        addr: u64,
        data: u32,
        masked: bool,
    ) -> Vec<(u16, Message)> {
        let mut entry = Vec::new();
        entry.extend_from_slice(&addr.to_le_bytes());
        entry.extend_from_slice(&data.to_le_bytes());
        entry.extend_from_slice(&u32::from(masked).to_le_bytes());
        let mut out = m.table_write(16 * vector, &entry[..8]);
        out.extend(m.table_write(16 * vector + 8, &entry[8..12]));
        out.extend(m.table_write(16 * vector + 12, &entry[12..]));
        out
    }

    #[test]
    fn a_vector_fires_only_when_enabled_and_unmasked() {
        let mut m = Msix::new(3);
        assert_eq!(m.fire(0), None, "disabled, masked");
        program(&mut m, 1, 0xfee0_0000, 0x41, false);
        assert_eq!(m.fire(1), None, "MSI-X not enabled yet");
        let flushed = m.set_control(ENABLE);
        assert_eq!(
            flushed,
            vec![(
                1,
                Message {
                    addr: 0xfee0_0000,
                    data: 0x41
                }
            )],
            "pending goes out"
        );
        assert_eq!(
            m.fire(1),
            Some(Message {
                addr: 0xfee0_0000,
                data: 0x41
            })
        );
        assert_eq!(m.fire(7), None, "out of range");
    }

    #[test]
    fn masking_holds_a_message_as_pending_until_unmasked() {
        let mut m = Msix::new(2);
        m.set_control(ENABLE);
        program(&mut m, 0, 0xfee0_1000, 0x22, true);
        assert_eq!(m.fire(0), None);
        let mut pba = [0u8; 8];
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 1);
        let out = program(&mut m, 0, 0xfee0_1000, 0x22, false);
        assert_eq!(
            out,
            vec![(
                0,
                Message {
                    addr: 0xfee0_1000,
                    data: 0x22
                }
            )]
        );
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0);
        // The function mask holds every vector.
        m.set_control(ENABLE | FUNCTION_MASK);
        assert_eq!(m.fire(0), None);
        assert_eq!(m.set_control(ENABLE).len(), 1);
    }

    #[test]
    fn bad_table_accesses_read_zero_and_change_nothing() {
        let mut m = Msix::new(1);
        let before = m.clone();
        for (offset, len) in [(2u64, 4usize), (16, 4), (0, 2), (12, 8), (u64::MAX - 3, 4)] {
            assert!(m.table_write(offset, &vec![0xff; len]).is_empty());
            let mut d = vec![0xaa; len];
            m.table_read(offset, &mut d);
            assert!(d.iter().all(|&b| b == 0), "{offset} {len}");
        }
        assert_eq!(m, before);
        // Vector control keeps only its mask bit.
        m.table_write(12, &u32::MAX.to_le_bytes());
        let mut d = [0u8; 4];
        m.table_read(12, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1);
    }

    #[test]
    fn the_capability_names_table_and_pba_and_its_size() {
        let m = Msix::new(5);
        let (cap, writable) = m.capability(2, 0x1000, 0x2000);
        assert_eq!(cap[0], CAPABILITY_ID);
        assert_eq!(
            u16::from_le_bytes([cap[2], cap[3]]),
            4,
            "table size minus one"
        );
        assert_eq!(u32::from_le_bytes(cap[4..8].try_into().unwrap()), 0x1002);
        assert_eq!(u32::from_le_bytes(cap[8..12].try_into().unwrap()), 0x2002);
        assert_eq!(writable, [0, 0, 0, 0xc0]);
        assert_eq!((m.table_len(), m.pba_len()), (80, 8));
    }
}
