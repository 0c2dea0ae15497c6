//! Model-specific registers every vCPU starts with.

pub const IA32_SYSENTER_CS: u32 = 0x174;
pub const IA32_SYSENTER_ESP: u32 = 0x175;
pub const IA32_SYSENTER_EIP: u32 = 0x176;
pub const IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MTRR_DEF_TYPE: u32 = 0x2ff;
pub const STAR: u32 = 0xc000_0081;
pub const LSTAR: u32 = 0xc000_0082;
pub const CSTAR: u32 = 0xc000_0083;
pub const SYSCALL_MASK: u32 = 0xc000_0084;
pub const KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRRs enabled, write-back by default.
const MTRR_ENABLED_WRITE_BACK: u64 = (1 << 11) | 6;

/// `(index, value)` pairs for the boot MSRs. The VMM keeps only those KVM says it supports.
pub fn boot_msrs() -> Vec<(u32, u64)> {
    vec![
        (IA32_SYSENTER_CS, 0),
        (IA32_SYSENTER_ESP, 0),
        (IA32_SYSENTER_EIP, 0),
        (STAR, 0),
        (CSTAR, 0),
        (KERNEL_GS_BASE, 0),
        (SYSCALL_MASK, 0),
        (LSTAR, 0),
        (IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MTRR_DEF_TYPE, MTRR_ENABLED_WRITE_BACK),
    ]
}
