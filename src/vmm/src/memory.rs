//! Guest RAM: anonymous, private, not reserved up front (MAP_NORESERVE), laid out around the
//! MMIO gap by [`arch::layout::ram_regions`]. Pages cost host memory only once touched.

use vm_memory::{GuestAddress, GuestMemoryMmap};

pub type GuestMemory = GuestMemoryMmap<()>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{mib} MiB of guest memory cannot be mapped on this host: {reason}")]
    Map { mib: u64, reason: String },
}

/// Maps `mem_bytes` of guest RAM.
pub fn create(mem_bytes: u64) -> Result<GuestMemory, Error> {
    let mib = mem_bytes >> 20;
    let too_large = || Error::Map {
        mib,
        reason: "it does not fit the host's address space".into(),
    };
    let regions = arch::layout::ram_regions(mem_bytes)
        .into_iter()
        .map(|(addr, size)| Ok((addr, usize::try_from(size).map_err(|_| too_large())?)))
        .collect::<Result<Vec<(GuestAddress, usize)>, Error>>()?;
    GuestMemoryMmap::from_ranges(&regions).map_err(|e| Error::Map {
        mib,
        reason: e.to_string(),
    })
}
