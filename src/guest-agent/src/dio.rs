//! `ember-agent dio`: direct I/O (O_DIRECT) on a block device, so that every read or write
//! is one request to the device, timed in the guest.
//!
//!   ember-agent dio read|write|randread|randwrite DEV BS COUNT [SKIP]
//!
//! prints `dio MODE bytes B ops N us T rate_bps R`, where the time, the count and the rate
//! are those of the requests after the first SKIP (which spend a rate limiter's initial
//! tokens: timing them in the same process leaves no gap for the bucket to refill).

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use super::{number, Result};

const ALIGN: usize = 4096;

/// A buffer at a 4 KiB boundary, as O_DIRECT needs.
struct Aligned {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let storage = vec![0x5au8; len + ALIGN];
        let offset = storage.as_ptr().align_offset(ALIGN);
        Aligned {
            storage,
            offset,
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

pub fn run(mode: &str, dev: &str, bs: &str, count: &str, skip: &str) -> Result<String> {
    let (bs, count, skip) = (number(bs)? as usize, number(count)?, number(skip)?);
    if bs == 0 || bs % 512 != 0 {
        return Err(format!("BS {bs} must be a non-zero multiple of 512"));
    }
    let write = match mode {
        "read" | "randread" => false,
        "write" | "randwrite" => true,
        _ => {
            return Err(format!(
                "unknown mode {mode}; use read, write, randread or randwrite"
            ))
        }
    };
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(|e| format!("open {dev}: {e}"))?;
    // A block device's metadata says 0 bytes; its end says its size.
    let size = std::io::Seek::seek(&mut &file, std::io::SeekFrom::End(0))
        .map_err(|e| format!("size of {dev}: {e}"))?;
    let blocks = size / bs as u64;
    if blocks == 0 {
        return Err(format!("{dev} holds no block of {bs} bytes"));
    }
    let mut buf = Aligned::new(bs);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut started = Instant::now();
    for i in 0..skip + count {
        if i == skip {
            started = Instant::now();
        }
        let block = match mode {
            "randread" | "randwrite" => {
                // xorshift: a different block each time, spread over the whole device.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % blocks
            }
            _ => i % blocks,
        };
        let at = block * bs as u64;
        let done = match write {
            true => file.write_all_at(buf.bytes(), at),
            false => file.read_exact_at(buf.bytes(), at),
        };
        done.map_err(|e| format!("{mode} at {at}: {e}"))?;
    }
    let us = started.elapsed().as_micros().max(1) as u64;
    let bytes = count * bs as u64;
    Ok(format!(
        "dio {mode} bytes {bytes} ops {count} us {us} rate_bps {}",
        u128::from(bytes) * 1_000_000 / u128::from(us)
    ))
}
