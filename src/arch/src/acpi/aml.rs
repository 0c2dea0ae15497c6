//! The few ACPI Machine Language (AML) terms Ember's DSDT needs, encoded by hand (ACPI 6.5,
//! chapter 20): names, integers, strings, packages, devices, scopes and resource templates.
//! Data objects (integers, strings, packages, buffers) are returned as bytes; names and the
//! terms that hold others (`Name`, `Scope`, `Device`) are appended to the caller's vector.

/// `\_SB_.COM1` style paths: an optional root `\`, then 1 to 4 character segments joined by
/// dots, each of `A-Z`, `0-9` and `_` and not starting with a digit.
pub fn name(out: &mut Vec<u8>, path: &str) {
    let (root, rest) = match path.strip_prefix('\\') {
        Some(rest) => (true, rest),
        None => (false, path),
    };
    if root {
        out.push(b'\\');
    }
    let segments: Vec<&str> = rest.split('.').collect();
    match segments.len() {
        1 => {}
        2 => out.push(0x2e),
        n => {
            out.push(0x2f);
            out.push(n as u8);
        }
    }
    for segment in segments {
        debug_assert!(
            !segment.is_empty()
                && segment.len() <= 4
                && !segment.as_bytes()[0].is_ascii_digit()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
            "bad AML name segment {segment:?}"
        );
        let mut seg = [b'_'; 4];
        seg[..segment.len()].copy_from_slice(segment.as_bytes());
        out.extend_from_slice(&seg);
    }
}

/// The smallest integer encoding of `value`.
pub fn integer(value: u64) -> Vec<u8> {
    match value {
        0 => vec![0x00],
        1 => vec![0x01],
        2..=0xff => vec![0x0a, value as u8],
        0x100..=0xffff => [&[0x0b][..], &(value as u16).to_le_bytes()].concat(),
        0x1_0000..=0xffff_ffff => dword(value as u32),
        _ => [&[0x0e][..], &value.to_le_bytes()].concat(),
    }
}

/// A 32-bit integer constant, whatever its value (how EISA IDs are written).
pub fn dword(value: u32) -> Vec<u8> {
    [&[0x0c][..], &value.to_le_bytes()].concat()
}

pub fn string(s: &str) -> Vec<u8> {
    [&[0x0d][..], s.as_bytes(), &[0]].concat()
}

/// The compressed EISA ID of a PNP name such as `PNP0501`: three letters of 5 bits each,
/// then four hexadecimal digits, stored big-endian.
pub fn eisa_id(id: &str) -> u32 {
    let b = id.as_bytes();
    assert!(b.len() == 7, "EISA IDs are 7 characters: {id:?}");
    let letter = |c: u8| u32::from(c - b'@') & 0x1f;
    let hex = |c: u8| (c as char).to_digit(16).expect("hexadecimal product ID");
    let vendor = (letter(b[0]) << 10) | (letter(b[1]) << 5) | letter(b[2]);
    let product = (hex(b[3]) << 12) | (hex(b[4]) << 8) | (hex(b[5]) << 4) | hex(b[6]);
    ((vendor << 16) | product).swap_bytes()
}

/// A package length prefix for `len` bytes that follow it (ACPI 20.2.4): the length counts
/// its own 1 to 4 bytes.
fn pkg_length(out: &mut Vec<u8>, len: usize) {
    let total = if len + 1 < 1 << 6 {
        out.push((len + 1) as u8);
        return;
    } else if len + 2 < 1 << 12 {
        len + 2
    } else if len + 3 < 1 << 20 {
        len + 3
    } else {
        assert!(len + 4 < 1 << 28, "AML package too long");
        len + 4
    };
    let extra = match total {
        t if t < 1 << 12 => 1,
        t if t < 1 << 20 => 2,
        _ => 3,
    };
    out.push(((extra as u8) << 6) | (total & 0xf) as u8);
    for i in 0..extra {
        out.push((total >> (4 + 8 * i)) as u8);
    }
}

/// An opcode, a package length and `body`.
fn wrapped(out: &mut Vec<u8>, opcode: &[u8], body: &[u8]) {
    out.extend_from_slice(opcode);
    pkg_length(out, body.len());
    out.extend_from_slice(body);
}

/// `Name(path, value)`, `value` being the encoding of a data object.
pub fn name_object(out: &mut Vec<u8>, path: &str, value: &[u8]) {
    out.push(0x08);
    name(out, path);
    out.extend_from_slice(value);
}

/// `Scope(path) { body }`.
pub fn scope(out: &mut Vec<u8>, path: &str, body: &[u8]) {
    let mut inner = Vec::new();
    name(&mut inner, path);
    inner.extend_from_slice(body);
    wrapped(out, &[0x10], &inner);
}

/// `Device(path) { body }`.
pub fn device(out: &mut Vec<u8>, path: &str, body: &[u8]) {
    let mut inner = Vec::new();
    name(&mut inner, path);
    inner.extend_from_slice(body);
    wrapped(out, &[0x5b, 0x82], &inner);
}

/// `Package() { elements }`, each element already encoded.
pub fn package(elements: &[Vec<u8>]) -> Vec<u8> {
    let mut inner = vec![elements.len() as u8];
    for e in elements {
        inner.extend_from_slice(e);
    }
    let mut out = Vec::new();
    wrapped(&mut out, &[0x12], &inner);
    out
}

/// `Buffer() { bytes }`.
pub fn buffer(bytes: &[u8]) -> Vec<u8> {
    let mut inner = integer(bytes.len() as u64);
    inner.extend_from_slice(bytes);
    let mut out = Vec::new();
    wrapped(&mut out, &[0x11], &inner);
    out
}

/// The descriptors of a `ResourceTemplate` (ACPI 6.4 "Resource Data Types"), ended by
/// [`Resources::encode`] with the end tag.
#[derive(Debug, Default)]
pub struct Resources(Vec<u8>);

impl Resources {
    /// A 16-bit decoded I/O port range of `len` ports at `base`.
    pub fn io(mut self, base: u16, len: u8) -> Self {
        self.0.extend_from_slice(&[0x47, 0x01]);
        self.0.extend_from_slice(&base.to_le_bytes());
        self.0.extend_from_slice(&base.to_le_bytes());
        self.0.extend_from_slice(&[1, len]);
        self
    }

    /// A read-write 32-bit memory range.
    pub fn memory32(mut self, base: u32, len: u32) -> Self {
        self.0.extend_from_slice(&[0x86, 9, 0, 1]);
        self.0.extend_from_slice(&base.to_le_bytes());
        self.0.extend_from_slice(&len.to_le_bytes());
        self
    }

    /// The bus numbers `first..=last` a host bridge decodes (WordBusNumber, producer, fixed
    /// minimum and maximum).
    pub fn bus_numbers(mut self, first: u16, last: u16) -> Self {
        self.0.extend_from_slice(&[0x88, 13, 0, 2, 0x0c, 0]);
        for v in [0, first, last, 0, last - first + 1] {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// A 32-bit memory window a host bridge passes on to its devices (DWordMemory,
    /// producer, fixed, non-cacheable, read-write).
    pub fn memory_window(mut self, base: u32, len: u32) -> Self {
        self.0.extend_from_slice(&[0x87, 23, 0, 0, 0x0c, 1]);
        for v in [0, base, base + (len - 1), 0, len] {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// An edge-triggered, active-high, exclusive interrupt the device consumes.
    pub fn interrupt(mut self, gsi: u32) -> Self {
        self.0.extend_from_slice(&[0x89, 6, 0, 0b0011, 1]);
        self.0.extend_from_slice(&gsi.to_le_bytes());
        self
    }

    /// The template as a `Buffer`, with the end tag (a zero checksum means "none").
    pub fn encode(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0x79, 0]);
        buffer(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut v);
        v
    }

    #[test]
    fn names_are_padded_and_prefixed() {
        assert_eq!(enc(|v| name(v, "_HID")), b"_HID");
        assert_eq!(enc(|v| name(v, "V0")), b"V0__");
        assert_eq!(enc(|v| name(v, "\\_SB_.COM1")), b"\\\x2e_SB_COM1");
        assert_eq!(enc(|v| name(v, "\\_SB.A.B")), b"\\\x2f\x03_SB_A___B___");
    }

    #[test]
    fn integers_take_their_smallest_form() {
        assert_eq!(integer(0), [0x00]);
        assert_eq!(integer(1), [0x01]);
        assert_eq!(integer(5), [0x0a, 5]);
        assert_eq!(integer(0x3f8), [0x0b, 0xf8, 0x03]);
        assert_eq!(integer(0x1_0000), [0x0c, 0, 0, 1, 0]);
        assert_eq!(integer(1 << 32), [0x0e, 0, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn eisa_ids_match_the_compiler() {
        // What iasl emits for EisaId("PNP0501") and EisaId("PNP0A08").
        assert_eq!(eisa_id("PNP0501"), 0x0105_d041);
        assert_eq!(eisa_id("PNP0A08"), 0x080a_d041);
        assert_eq!(eisa_id("PNP0303"), 0x0303_d041);
    }

    #[test]
    fn package_lengths_count_themselves() {
        let one = enc(|v| pkg_length(v, 10));
        assert_eq!(one, [11]);
        let two = enc(|v| pkg_length(v, 100));
        // 102 = 0x66: low nibble in the lead byte, the rest in the next.
        assert_eq!(two, [0x40 | 0x6, 0x6]);
        let three = enc(|v| pkg_length(v, 5000));
        let total = 5003usize;
        assert_eq!(
            three,
            [
                0x80 | (total & 0xf) as u8,
                (total >> 4) as u8,
                (total >> 12) as u8
            ]
        );
    }

    #[test]
    fn address_space_descriptors_have_their_lengths_and_ranges() {
        let bus = Resources::default().bus_numbers(0, 0).encode();
        // Buffer op, length, size 16 + 2, then the descriptor: 3 header bytes + 13.
        let d = &bus[bus.len() - 18..bus.len() - 2];
        assert_eq!(&d[..6], &[0x88, 13, 0, 2, 0x0c, 0]);
        assert_eq!(&d[14..16], &[1, 0], "one bus");
        let mem = Resources::default()
            .memory_window(0xc000_0000, 0x1000_0000)
            .encode();
        let d = &mem[mem.len() - 28..mem.len() - 2];
        assert_eq!(&d[..6], &[0x87, 23, 0, 0, 0x0c, 1]);
        assert_eq!(
            u32::from_le_bytes(d[10..14].try_into().unwrap()),
            0xc000_0000
        );
        assert_eq!(
            u32::from_le_bytes(d[14..18].try_into().unwrap()),
            0xcfff_ffff
        );
        assert_eq!(
            u32::from_le_bytes(d[22..26].try_into().unwrap()),
            0x1000_0000
        );
    }

    #[test]
    fn a_resource_template_ends_with_the_end_tag() {
        let v = Resources::default().io(0x60, 1).interrupt(1).encode();
        // Buffer, length, size 8 + 9 + 2 = 19, then the descriptors.
        assert_eq!(&v[..4], &[0x11, 22, 0x0a, 19]);
        assert_eq!(&v[4..12], &[0x47, 1, 0x60, 0, 0x60, 0, 1, 1]);
        assert_eq!(&v[12..21], &[0x89, 6, 0, 3, 1, 1, 0, 0, 0]);
        assert_eq!(&v[21..], &[0x79, 0]);
    }
}
