//! Compare-and-exchange on guest RAM with the host's own locked instructions, so that an
//! emulated CMPXCHG8B/16B stays atomic against the other vCPUs, which keep running.

use std::arch::asm;

use vm_memory::{GuestAddress, GuestMemoryBackend as _};

use crate::memory::GuestMemory;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AtomicError {
    #[error("guest physical address {0:#x} is not in guest RAM")]
    NotRam(u64),
    #[error("the host CPU has no CMPXCHG16B")]
    NoHostCmpxchg16b,
    #[error("a 16-byte compare-exchange at {0:#x} must be 16-byte aligned")]
    Misaligned(u64),
}

/// If the `width` (8 or 16) bytes at `gpa` equal `expected`, stores `new` there. Returns
/// whether it stored, and the value that was there. A misaligned 16-byte operand is refused
/// here too: the host's CMPXCHG16B would fault in ember itself.
pub fn compare_exchange(
    mem: &GuestMemory,
    gpa: u64,
    width: u8,
    expected: u128,
    new: u128,
) -> Result<(bool, u128), AtomicError> {
    let len = usize::from(width);
    // One slice of `len` bytes: the access lies inside a single RAM region.
    let slice = mem
        .get_slice(GuestAddress(gpa), len)
        .map_err(|_| AtomicError::NotRam(gpa))?;
    let guard = slice.ptr_guard_mut();
    let ptr = guard.as_ptr();
    if width == 16 {
        if !gpa.is_multiple_of(16) {
            return Err(AtomicError::Misaligned(gpa));
        }
        if !std::arch::is_x86_feature_detected!("cmpxchg16b") {
            return Err(AtomicError::NoHostCmpxchg16b);
        }
        Ok(cmpxchg16b(ptr, expected, new))
    } else {
        let (ok, old) = cmpxchg8(ptr, expected as u64, new as u64);
        Ok((ok, u128::from(old)))
    }
}

fn cmpxchg8(ptr: *mut u8, expected: u64, new: u64) -> (bool, u64) {
    let old: u64;
    let zf: u8;
    // SAFETY: `ptr` points at 8 bytes of guest RAM that stay mapped while the VM exists
    // (`compare_exchange` got it from a slice of exactly this length). The locked access
    // does not need alignment and touches only those bytes; guest memory is shared with the
    // guest, so it is accessed only through this instruction, never through a Rust reference.
    unsafe {
        asm!(
            "lock cmpxchg qword ptr [{ptr}], {new}",
            "sete {zf}",
            ptr = in(reg) ptr,
            new = in(reg) new,
            zf = out(reg_byte) zf,
            inout("rax") expected => old,
            options(nostack),
        );
    }
    (zf != 0, old)
}

fn cmpxchg16b(ptr: *mut u8, expected: u128, new: u128) -> (bool, u128) {
    let (mut lo, mut hi) = (expected as u64, (expected >> 64) as u64);
    let zf: u8;
    // SAFETY: as in `cmpxchg8`, `ptr` points at 16 bytes of mapped guest RAM;
    // `compare_exchange` checked that the host has CMPXCHG16B and that the guest-physical
    // address is 16-byte aligned (guest regions are page-aligned in the host, so the host
    // pointer is too). RBX is reserved by the compiler, so the low half of
    // the new value is swapped into it and back around the instruction.
    unsafe {
        asm!(
            "xchg {new_lo}, rbx",
            "lock cmpxchg16b xmmword ptr [{ptr}]",
            "sete {zf}",
            "mov rbx, {new_lo}",
            ptr = in(reg) ptr,
            new_lo = inout(reg) new as u64 => _,
            zf = out(reg_byte) zf,
            inout("rax") lo,
            inout("rdx") hi,
            in("rcx") (new >> 64) as u64,
            options(nostack),
        );
    }
    (zf != 0, (u128::from(hi) << 64) | u128::from(lo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn mem() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap()
    }

    #[test]
    fn sixteen_bytes_swap_only_when_equal() {
        let m = mem();
        let v = 0x1111_2222_3333_4444_5555_6666_7777_8888u128;
        m.write_obj(v, GuestAddress(0x100)).unwrap();
        assert_eq!(compare_exchange(&m, 0x100, 16, 1, 2), Ok((false, v)));
        assert_eq!(m.read_obj::<u128>(GuestAddress(0x100)).unwrap(), v);
        assert_eq!(compare_exchange(&m, 0x100, 16, v, 7), Ok((true, v)));
        assert_eq!(m.read_obj::<u128>(GuestAddress(0x100)).unwrap(), 7);
        assert_eq!(
            m.read_obj::<u64>(GuestAddress(0x110)).unwrap(),
            0,
            "nothing beyond"
        );
    }

    #[test]
    fn eight_bytes_even_unaligned() {
        let m = mem();
        m.write_obj(0xaabbu64, GuestAddress(0x203)).unwrap();
        assert_eq!(
            compare_exchange(&m, 0x203, 8, 0xaabb, 5),
            Ok((true, 0xaabb))
        );
        assert_eq!(compare_exchange(&m, 0x203, 8, 0xaabb, 6), Ok((false, 5)));
        assert_eq!(m.read_obj::<u64>(GuestAddress(0x203)).unwrap(), 5);
    }

    #[test]
    fn outside_ram_is_refused() {
        let m = mem();
        assert_eq!(
            compare_exchange(&m, 0x1ff8, 16, 0, 0),
            Err(AtomicError::NotRam(0x1ff8))
        );
        assert_eq!(
            compare_exchange(&m, 0x9000, 8, 0, 0),
            Err(AtomicError::NotRam(0x9000))
        );
        assert_eq!(
            compare_exchange(&m, 0x108, 16, 0, 0),
            Err(AtomicError::Misaligned(0x108))
        );
    }
}
