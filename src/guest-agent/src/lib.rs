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
    let mut total = 0u64;
    each_read(r, 1 << 16, |data| {
        sum.update(data);
        total += data.len() as u64;
    })?;
    Ok((total, sum.value()))
}

/// What a stream read to its end held, and how fast it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub bytes: u64,
    pub checksum: u64,
    /// Bytes per second of what came after the first `skip` bytes, to the end; 0 if there
    /// were no more.
    pub rate: u64,
}

/// Reads `r` to its end in reads of up to `chunk` bytes; the rate leaves out the first
/// `skip` bytes, which a TCP stream needs to open its window.
pub fn receive(r: &mut impl std::io::Read, skip: u64, chunk: usize) -> std::io::Result<Received> {
    let mut sum = Checksum::default();
    let mut total = 0u64;
    // When the first `skip` bytes were in, and the total then.
    let mut after_skip: Option<(std::time::Instant, u64)> = None;
    each_read(r, chunk, |data| {
        sum.update(data);
        total += data.len() as u64;
        if after_skip.is_none() && total >= skip {
            after_skip = Some((std::time::Instant::now(), total));
        }
    })?;
    let rate = after_skip.map_or(0, |(at, base)| {
        let us = at.elapsed().as_micros().max(1);
        (u128::from(total - base) * 1_000_000 / us) as u64
    });
    Ok(Received {
        bytes: total,
        checksum: sum.value(),
        rate,
    })
}

/// Calls `each` with what every read of `r` returns, until its end.
fn each_read(
    r: &mut impl std::io::Read,
    chunk: usize,
    mut each: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; chunk];
    loop {
        match r.read(&mut buf)? {
            0 => return Ok(()),
            n => each(&buf[..n]),
        }
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
        let got = receive(&mut &written[..], 100, 64).unwrap();
        assert_eq!((got.bytes, got.checksum), (1000, sum.value()));
        let short = receive(&mut &written[..10], 100, 64).unwrap();
        assert_eq!(
            (short.bytes, short.rate),
            (10, 0),
            "no rate for a stream under skip"
        );
        assert_ne!(pattern_checksum(7, 1000), pattern_checksum(8, 1000));
    }
}
