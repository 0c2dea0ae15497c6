//! The boot vCPU's registers for each entry protocol, and the local APIC's LINT pins.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_sregs};

use crate::gdt::{self, CODE_SELECTOR, DATA_SELECTOR, TSS_SELECTOR};
use crate::layout::{BOOT_STACK_TOP, GDT_ADDR, IDT_ADDR, PVH_INFO_ADDR, ZERO_PAGE_ADDR};
use crate::BootProtocol;

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 0x10;
const CR0_PG: u64 = 0x8000_0000;
const CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;
/// Bit 1 of RFLAGS is reserved and reads as one.
const RFLAGS_RESERVED: u64 = 0x2;

/// General-purpose registers at the entry point.
pub fn boot_regs(protocol: BootProtocol, entry: u64) -> kvm_regs {
    let mut regs = kvm_regs {
        rflags: RFLAGS_RESERVED,
        rip: entry,
        ..Default::default()
    };
    match protocol {
        BootProtocol::Linux64 => {
            regs.rsp = BOOT_STACK_TOP;
            regs.rbp = BOOT_STACK_TOP;
            regs.rsi = ZERO_PAGE_ADDR;
        }
        BootProtocol::Pvh => regs.rbx = PVH_INFO_ADDR,
    }
    regs
}

/// Segment and control registers at the entry point: long mode with paging through the
/// identity tables at `cr3` for Linux64, flat 32-bit protected mode without paging for PVH.
pub fn boot_sregs(protocol: BootProtocol, sregs: &mut kvm_sregs, cr3: u64) {
    let long_mode = protocol == BootProtocol::Linux64;
    let table = gdt::table(long_mode);
    let code = gdt::segment(table[1], CODE_SELECTOR);
    let data = gdt::segment(table[2], DATA_SELECTOR);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = gdt::segment(table[3], TSS_SELECTOR);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (std::mem::size_of_val(&table) - 1) as u16;
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    if long_mode {
        sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
        sregs.cr3 = cr3;
        sregs.cr4 = CR4_PAE;
        sregs.efer = EFER_LME | EFER_LMA;
    } else {
        sregs.cr0 = CR0_PE | CR0_ET;
        sregs.cr3 = 0;
        sregs.cr4 = 0;
        sregs.efer = 0;
    }
}

/// The x87 and SSE control words after FNINIT/reset.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const DELIVERY_EXTINT: u32 = 0x7;
const DELIVERY_NMI: u32 = 0x4;

/// Wires LINT0 as ExtINT (the PIC) and LINT1 as NMI, as the MP table says.
pub fn set_lint_pins(lapic: &mut kvm_lapic_state) {
    for (offset, mode) in [(APIC_LVT0, DELIVERY_EXTINT), (APIC_LVT1, DELIVERY_NMI)] {
        let old = lapic_reg(lapic, offset);
        lapic_set_reg(lapic, offset, (old & !0x700) | (mode << 8));
    }
}

fn lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[offset + i] as u8);
    u32::from_le_bytes(bytes)
}

fn lapic_set_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().into_iter().enumerate() {
        lapic.regs[offset + i] = byte as _;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux64_enters_long_mode_with_the_zero_page_in_rsi() {
        let regs = boot_regs(BootProtocol::Linux64, 0x100_0000);
        assert_eq!(
            (regs.rip, regs.rsi, regs.rflags),
            (0x100_0000, ZERO_PAGE_ADDR, 2)
        );
        let mut sregs = kvm_sregs::default();
        boot_sregs(BootProtocol::Linux64, &mut sregs, 0x9000);
        assert_eq!(sregs.efer & EFER_LMA, EFER_LMA);
        assert_eq!(sregs.cr0 & (CR0_PG | CR0_PE), CR0_PG | CR0_PE);
        assert_eq!(
            (sregs.cs.l, sregs.cs.selector, sregs.cr3),
            (1, CODE_SELECTOR, 0x9000)
        );
    }

    #[test]
    fn pvh_enters_protected_mode_with_start_info_in_rbx() {
        let regs = boot_regs(BootProtocol::Pvh, 0x100_1000);
        assert_eq!(regs.rbx, PVH_INFO_ADDR);
        let mut sregs = kvm_sregs {
            cr0: 0x6000_0010,
            ..Default::default()
        };
        boot_sregs(BootProtocol::Pvh, &mut sregs, 0);
        assert_eq!(sregs.cr0 & CR0_PG, 0);
        assert_eq!(sregs.cr0 & 0x6000_0000, 0, "caches stay enabled");
        assert_eq!((sregs.cs.db, sregs.cs.l, sregs.efer), (1, 0, 0));
    }

    #[test]
    fn lint_pins_are_extint_and_nmi() {
        let mut lapic = kvm_lapic_state::default();
        lapic_set_reg(&mut lapic, APIC_LVT0, 0x0001_0000);
        set_lint_pins(&mut lapic);
        assert_eq!(lapic_reg(&lapic, APIC_LVT0), 0x0001_0700);
        assert_eq!(lapic_reg(&lapic, APIC_LVT1) & 0x700, 0x400);
    }
}
