//! The guest's memory statistics as the balloon's statistics queue carries them: entries of
//! a 16-bit tag and a 64-bit value (10 bytes, packed, little-endian), shown under
//! Firecracker's names.

use serde::Serialize;
use vm_memory::{Address, Bytes, GuestAddress};

use crate::virtio::GuestMemory;

const ENTRY: u32 = 10;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BalloonStats {
    pub target_pages: u32,
    pub actual_pages: u32,
    pub target_mib: u32,
    pub actual_mib: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stall: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scan: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_scan: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_reclaim: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_reclaim: Option<u64>,
}

impl BalloonStats {
    /// Reads the entries in `[addr, addr + len)`; unknown tags are skipped. False if nothing
    /// could be read.
    pub fn read_from(&mut self, mem: &GuestMemory, addr: GuestAddress, len: u32) -> bool {
        let mut read_any = false;
        for i in 0..len / ENTRY {
            let Some(at) = addr.checked_add(u64::from(i * ENTRY)) else {
                break;
            };
            let mut entry = [0u8; ENTRY as usize];
            if mem.read_slice(&mut entry, at).is_err() {
                break;
            }
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let mut value = [0u8; 8];
            value.copy_from_slice(&entry[2..]);
            self.set(tag, u64::from_le_bytes(value));
            read_any = true;
        }
        read_any
    }

    /// The virtio spec's tags (VIRTIO_BALLOON_S_*).
    fn set(&mut self, tag: u16, value: u64) {
        let slot = match tag {
            0 => &mut self.swap_in,
            1 => &mut self.swap_out,
            2 => &mut self.major_faults,
            3 => &mut self.minor_faults,
            4 => &mut self.free_memory,
            5 => &mut self.total_memory,
            6 => &mut self.available_memory,
            7 => &mut self.disk_caches,
            8 => &mut self.hugetlb_allocations,
            9 => &mut self.hugetlb_failures,
            10 => &mut self.oom_kill,
            11 => &mut self.alloc_stall,
            12 => &mut self.async_scan,
            13 => &mut self.direct_scan,
            14 => &mut self.async_reclaim,
            15 => &mut self.direct_reclaim,
            _ => return,
        };
        *slot = Some(value);
    }
}
