//! Where the test guest images are, built by `build.rs` from `guest/`.

/// The ELF with a PVH note: entered in 32-bit protected mode with `hvm_start_info`.
pub const PVH_ELF: &str = concat!(env!("OUT_DIR"), "/guest-pvh.elf");
/// The same guest without the note: entered in long mode with the zero page.
pub const LINUX64_ELF: &str = concat!(env!("OUT_DIR"), "/guest-linux64.elf");
/// The same guest as a bzImage: 64-bit entry 0x200 past the protected-mode code.
pub const BZIMAGE: &str = concat!(env!("OUT_DIR"), "/guest.bzImage");
