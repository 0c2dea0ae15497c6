//! KVM's own per-vCPU counters (KVM_GET_STATS_FD): how many exits of each kind a vCPU took,
//! inside the kernel and out to Ember. Read once when the VM stops, and logged at Info, so
//! that the cost of a boot can be broken down by exit reason (see docs/pvm.md).

use std::fs::File;
use std::os::unix::fs::FileExt;

use kvm_ioctls::VcpuFd;

/// The file KVM_GET_STATS_FD opened for one vCPU.
#[derive(Debug)]
pub struct VcpuStats {
    file: File,
}

/// Counters with this many values or fewer are read; histograms are skipped.
const SCALAR: u16 = 1;
/// Every file so far is a few KiB; this bounds a read of a misbehaving one.
const MAX_FILE: usize = 1 << 20;

impl VcpuStats {
    /// Opens the counters of `vcpu`, or None when this KVM has none (before Linux 5.14).
    pub fn open(vcpu: &VcpuFd) -> Option<Self> {
        let file = crate::sys::vcpu_stats_file(vcpu)?;
        Some(VcpuStats { file })
    }

    /// The scalar counters that are not zero, by name.
    pub fn read(&self) -> Vec<(String, u64)> {
        let mut blob = Vec::new();
        let mut chunk = [0u8; 4096];
        while blob.len() < MAX_FILE {
            match self.file.read_at(&mut chunk, blob.len() as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => blob.extend_from_slice(&chunk[..n]),
            }
        }
        parse(&blob).into_iter().filter(|(_, v)| *v != 0).collect()
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parses the binary stats format: a header, `num_desc` descriptors (16 bytes and a
/// `name_size`-byte name each), and the data block. Anything out of bounds is dropped.
pub fn parse(b: &[u8]) -> Vec<(String, u64)> {
    let (Some(name_size), Some(num_desc), Some(desc_offset), Some(data_offset)) =
        (u32_at(b, 4), u32_at(b, 8), u32_at(b, 16), u32_at(b, 20))
    else {
        return Vec::new();
    };
    let (name_size, desc_offset, data_offset) = (
        name_size as usize,
        desc_offset as usize,
        data_offset as usize,
    );
    let desc_len = 16 + name_size;
    let mut out = Vec::new();
    for i in 0..num_desc as usize {
        let at = desc_offset.saturating_add(i.saturating_mul(desc_len));
        let (Some(size), Some(offset)) = (u16_at(b, at + 6), u32_at(b, at + 8)) else {
            break;
        };
        let Some(name) = b.get(at + 16..at + desc_len) else {
            break;
        };
        if size != SCALAR {
            continue;
        }
        let name_end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        let name = String::from_utf8_lossy(&name[..name_end]).into_owned();
        if let Some(value) = u64_at(b, data_offset.saturating_add(offset as usize)) {
            out.push((name, value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(stats: &[(&str, u16, u64)]) -> Vec<u8> {
        let name_size = 8usize;
        let desc_offset = 24usize;
        let data_offset = desc_offset + stats.len() * (16 + name_size);
        let mut b = Vec::new();
        for v in [
            0u32,
            name_size as u32,
            stats.len() as u32,
            0,
            desc_offset as u32,
            data_offset as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let mut data: Vec<u64> = Vec::new();
        for (name, size, value) in stats {
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&0i16.to_le_bytes());
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&(data.len() as u32 * 8).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            let mut n = name.as_bytes().to_vec();
            n.resize(name_size, 0);
            b.extend_from_slice(&n);
            data.push(*value);
            data.extend(std::iter::repeat_n(0, usize::from(*size) - 1));
        }
        for d in data {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b
    }

    #[test]
    fn scalars_by_name_histograms_skipped() {
        let b = blob(&[("exits", 1, 42), ("hist", 4, 9), ("io_exits", 1, 7)]);
        assert_eq!(
            parse(&b),
            vec![("exits".to_string(), 42), ("io_exits".to_string(), 7)]
        );
    }

    #[test]
    fn truncated_files_give_what_is_there() {
        let b = blob(&[("exits", 1, 42), ("io_exits", 1, 7)]);
        assert_eq!(parse(&b[..b.len() - 8]), vec![("exits".to_string(), 42)]);
        assert!(parse(&b[..10]).is_empty());
        assert!(parse(&[]).is_empty());
    }
}
