//! What the guest agent and the host tests must agree on: the test data stream and its
//! checksum, so that each side can check bytes the other side made.

/// A reproducible byte stream: 64-bit words from a linear congruential generator.
#[derive(Debug, Clone)]
pub struct Pattern {
    state: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern {
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
            word: [0; 8],
            used: 8,
        }
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            if self.used == 8 {
                self.state = self
                    .state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                self.word = (self.state >> 11 ^ self.state).to_le_bytes();
                self.used = 0;
            }
            *b = self.word[self.used];
            self.used += 1;
        }
    }
}

/// FNV-1a, 64-bit: enough to tell two streams apart, and fast in user mode.
#[derive(Debug, Clone)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.0;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }

    pub fn value(&self) -> u64 {
        self.0
    }
}

/// Writes the first `len` bytes of `Pattern::new(seed)` to `w`; returns their checksum.
pub fn write_pattern(w: &mut impl std::io::Write, len: u64, seed: u64) -> std::io::Result<u64> {
    let mut pattern = Pattern::new(seed);
    let mut sum = Checksum::default();
    let mut buf = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        sum.update(&buf[..n]);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(sum.value())
}

/// Reads `r` to its end, going on from `sum`: the byte count and the checksum.
pub fn read_checksum(r: &mut impl std::io::Read, mut sum: Checksum) -> std::io::Result<(u64, u64)> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok((total, sum.value()));
        }
        sum.update(&buf[..n]);
        total += n as u64;
    }
}

/// The checksum of the first `len` bytes of `Pattern::new(seed)`.
pub fn pattern_checksum(seed: u64, len: u64) -> u64 {
    write_pattern(&mut std::io::sink(), len, seed).expect("the sink takes every byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_does_not_depend_on_how_it_is_cut() {
        let mut whole = vec![0u8; 1000];
        Pattern::new(7).fill(&mut whole);
        let mut pieces = vec![0u8; 1000];
        let mut p = Pattern::new(7);
        for chunk in pieces.chunks_mut(13) {
            p.fill(chunk);
        }
        assert_eq!(whole, pieces);
        let mut sum = Checksum::default();
        sum.update(&whole);
        assert_eq!(sum.value(), pattern_checksum(7, 1000));
        let mut written = Vec::new();
        assert_eq!(write_pattern(&mut written, 1000, 7).unwrap(), sum.value());
        assert_eq!(written, whole);
        let read = read_checksum(&mut &written[..], Checksum::default()).unwrap();
        assert_eq!(read, (1000, sum.value()));
        assert_ne!(pattern_checksum(7, 1000), pattern_checksum(8, 1000));
    }
}
