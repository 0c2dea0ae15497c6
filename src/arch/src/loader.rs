//! Puts the kernel and the initrd into guest memory. The format is told by its magic: an ELF
//! vmlinux (entered through PVH when it carries a PVH note, else through the 64-bit entry) or
//! a bzImage (64-bit entry, 0x200 past its protected-mode code).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{GuestAddress, GuestMemoryBackend, ReadVolatile};

use crate::boot_params::InitrdPlacement;
use crate::layout::{HIMEM_START, MMIO_GAP_START};

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const HDRS_OFFSET: u64 = 0x202;
const HDRS: [u8; 4] = *b"HdrS";
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
const PAGE: u64 = 0x1000;

/// How the boot vCPU enters the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootProtocol {
    /// 64-bit Linux boot protocol: long mode, zero page in RSI.
    Linux64,
    /// PVH: 32-bit protected mode, `hvm_start_info` in RBX.
    Pvh,
}

/// The loaded kernel: where to start it and what its boot header said.
#[derive(Debug, Clone, Copy)]
pub struct KernelEntry {
    pub protocol: BootProtocol,
    pub entry: u64,
    /// First byte after the loaded kernel.
    pub end: u64,
    /// The bzImage setup header, copied into the zero page.
    pub setup_header: Option<setup_header>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kernel image: {0}")]
    Read(#[source] std::io::Error),
    #[error("the kernel image is neither an ELF vmlinux nor a bzImage")]
    UnknownFormat,
    #[error("the ELF kernel cannot be loaded: {0}")]
    Elf(#[source] linux_loader::loader::Error),
    #[error("the bzImage kernel cannot be loaded: {0}")]
    BzImage(#[source] linux_loader::loader::Error),
    #[error("cannot read the initrd: {0}")]
    ReadInitrd(#[source] std::io::Error),
    #[error(
        "the initrd ({size} bytes) does not fit in guest memory below {limit:#x} above the kernel"
    )]
    InitrdTooLarge { size: u64, limit: u64 },
    #[error("cannot copy the initrd into guest memory: {0}")]
    InitrdCopy(#[source] vm_memory::GuestMemoryError),
}

/// Which loader the image needs, from its first bytes.
pub fn detect(file: &mut File) -> Result<Option<BootFormat>, Error> {
    let mut magic = [0u8; 4];
    file.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    if file.read_exact(&mut magic).is_ok() && magic == ELF_MAGIC {
        return Ok(Some(BootFormat::Elf));
    }
    file.seek(SeekFrom::Start(HDRS_OFFSET))
        .map_err(Error::Read)?;
    if file.read_exact(&mut magic).is_ok() && magic == HDRS {
        return Ok(Some(BootFormat::BzImage));
    }
    Ok(None)
}

/// Kernel image formats Ember boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootFormat {
    Elf,
    BzImage,
}

/// Loads the kernel at its preferred address (1 MiB or above).
pub fn load_kernel<M: GuestMemoryBackend>(mem: &M, file: &mut File) -> Result<KernelEntry, Error> {
    let format = detect(file)?.ok_or(Error::UnknownFormat)?;
    file.seek(SeekFrom::Start(0)).map_err(Error::Read)?;
    let himem = Some(GuestAddress(HIMEM_START));
    match format {
        BootFormat::Elf => {
            let loaded = Elf::load(mem, None, file, himem).map_err(Error::Elf)?;
            let (protocol, entry) = match loaded.pvh_boot_cap {
                PvhBootCapability::PvhEntryPresent(addr) => (BootProtocol::Pvh, addr.0),
                _ => (BootProtocol::Linux64, loaded.kernel_load.0),
            };
            Ok(KernelEntry {
                protocol,
                entry,
                end: loaded.kernel_end,
                setup_header: None,
            })
        }
        BootFormat::BzImage => {
            let loaded = BzImage::load(mem, None, file, himem).map_err(Error::BzImage)?;
            Ok(KernelEntry {
                protocol: BootProtocol::Linux64,
                entry: loaded.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
                end: loaded.kernel_end,
                setup_header: loaded.setup_header,
            })
        }
    }
}

/// Where an initrd of `size` bytes goes: as high as possible in low memory, page aligned,
/// below `limit` (the end of low RAM, or the kernel's `initrd_addr_max`) and above the kernel.
pub fn initrd_address(size: u64, kernel_end: u64, limit: u64) -> Option<u64> {
    let top = limit.checked_sub(size)?;
    let addr = top & !(PAGE - 1);
    (addr >= kernel_end).then_some(addr)
}

/// Copies the initrd file into guest memory; `low_ram_end` is where RAM below the gap ends.
pub fn load_initrd<M: GuestMemoryBackend>(
    mem: &M,
    file: &mut File,
    kernel: &KernelEntry,
    low_ram_end: u64,
) -> Result<InitrdPlacement, Error> {
    let size = file.metadata().map_err(Error::ReadInitrd)?.len();
    let mut limit = low_ram_end.min(MMIO_GAP_START);
    if let Some(hdr) = kernel.setup_header {
        if hdr.initrd_addr_max != 0 {
            limit = limit.min(u64::from(hdr.initrd_addr_max) + 1);
        }
    }
    let addr =
        initrd_address(size, kernel.end, limit).ok_or(Error::InitrdTooLarge { size, limit })?;
    file.seek(SeekFrom::Start(0)).map_err(Error::ReadInitrd)?;
    let len = usize::try_from(size).map_err(|_| Error::InitrdTooLarge { size, limit })?;
    let mut slice = mem
        .get_slice(GuestAddress(addr), len)
        .map_err(Error::InitrdCopy)?;
    file.read_exact_volatile(&mut slice)
        .map_err(|e| Error::ReadInitrd(std::io::Error::other(e.to_string())))?;
    Ok(InitrdPlacement { addr, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initrd_goes_high_and_page_aligned() {
        assert_eq!(
            initrd_address(0x1800, 0x20_0000, 0x800_0000),
            Some(0x7ff_e000)
        );
    }

    #[test]
    fn initrd_never_overlaps_the_kernel() {
        assert_eq!(initrd_address(0x700_0000, 0x200_0000, 0x800_0000), None);
        assert_eq!(initrd_address(u64::MAX, 0, 0x800_0000), None);
    }
}
