//! The boot GDT: flat segments for the 64-bit entry (long-mode code) and for PVH (32-bit
//! protected-mode code), encoded as the CPU reads them and mirrored into `kvm_segment`s.

use kvm_bindings::kvm_segment;

/// Access byte and flags nibble, packed as `0xF0AA` (flags in the high nibble).
pub const CODE64: u16 = 0xa09b;
pub const CODE32: u16 = 0xc09b;
pub const DATA: u16 = 0xc093;
pub const TSS64: u16 = 0x808b;
pub const TSS32: u16 = 0x008b;

/// Selectors: the index of each entry times eight.
pub const CODE_SELECTOR: u16 = 0x08;
pub const DATA_SELECTOR: u16 = 0x10;
pub const TSS_SELECTOR: u16 = 0x18;

/// Encodes one descriptor from its flags, base and (20-bit) limit.
pub fn entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (u64::from(flags), u64::from(base), u64::from(limit));
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The four-entry table (null, code, data, TSS) for a 64-bit or a 32-bit entry.
pub fn table(long_mode: bool) -> [u64; 4] {
    let (code, tss) = if long_mode {
        (CODE64, TSS64)
    } else {
        (CODE32, TSS32)
    };
    [
        0,
        entry(code, 0, 0xfffff),
        entry(DATA, 0, 0xfffff),
        entry(tss, 0, 0xfffff),
    ]
}

/// The hidden part of a segment register, as the CPU would load it from `descriptor`.
pub fn segment(descriptor: u64, selector: u16) -> kvm_segment {
    let bit = |n: u32| ((descriptor >> n) & 1) as u8;
    let base = ((descriptor >> 16) & 0x00ff_ffff) | ((descriptor >> 32) & 0xff00_0000);
    let raw_limit = ((descriptor & 0xffff) | ((descriptor >> 32) & 0x000f_0000)) as u32;
    let granular = bit(55) == 1;
    let present = bit(47);
    kvm_segment {
        base,
        limit: if granular {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector,
        type_: ((descriptor >> 40) & 0xf) as u8,
        present,
        dpl: ((descriptor >> 45) & 0x3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g: bit(55),
        avl: bit(52),
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_mode_code_segment_decodes() {
        let seg = segment(entry(CODE64, 0, 0xfffff), CODE_SELECTOR);
        assert_eq!(
            (seg.l, seg.db, seg.g, seg.s, seg.present, seg.type_),
            (1, 0, 1, 1, 1, 0xb)
        );
        assert_eq!(seg.limit, 0xffff_ffff);
        assert_eq!(seg.base, 0);
    }

    #[test]
    fn base_and_limit_round_trip() {
        let seg = segment(entry(DATA, 0x1234_5678, 0xabcde), DATA_SELECTOR);
        assert_eq!(seg.base, 0x1234_5678);
        assert_eq!(seg.limit, 0xabcd_efff);
        assert_eq!((seg.db, seg.l, seg.type_), (1, 0, 3));
    }

    #[test]
    fn pvh_code_is_32_bit() {
        let gdt = table(false);
        let seg = segment(gdt[1], CODE_SELECTOR);
        assert_eq!((seg.l, seg.db), (0, 1));
        assert_eq!(gdt[0], 0);
    }
}
