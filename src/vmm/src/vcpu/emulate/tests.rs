//! Emulation against a hand-built guest: 4-level page tables in a small guest memory, code
//! and data pages mapped at kernel-like addresses.

use super::walk::{Paging, WalkError};
use super::*;
use vm_memory::{Bytes, GuestAddress};

const MIB: u64 = 1 << 20;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const PT: u64 = 0x4000;
/// Linear addresses of the test pages.
const CODE: u64 = 0xffff_ffff_8100_0000;
const DATA: u64 = 0xffff_ffff_8100_1000;
const RODATA: u64 = 0xffff_ffff_8100_2000;
const HOLE: u64 = 0xffff_ffff_8100_3000;
const BEYOND_RAM: u64 = 0xffff_ffff_8100_4000;
/// Their frames.
const CODE_GPA: u64 = 0x10_0000;
const DATA_GPA: u64 = 0x10_1000;
const RODATA_GPA: u64 = 0x10_2000;

const P: u64 = 1;
const W: u64 = 2;

fn guest() -> (GuestMemory, Paging) {
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), 2 * MIB as usize)]).unwrap();
    let put = |addr: u64, v: u64| mem.write_obj(v, GuestAddress(addr)).unwrap();
    put(PML4 + 511 * 8, PDPT | P | W);
    put(PDPT + 510 * 8, PD | P | W);
    put(PD + 8 * 8, PT | P | W);
    put(PT, CODE_GPA | P);
    put(PT + 8, DATA_GPA | P | W);
    put(PT + 16, RODATA_GPA | P);
    put(PT + 32, 0x4000_0000 | P | W);
    let paging = Paging {
        cr0: 0x8005_0033,
        cr3: PML4,
        cr4: 0x20,
        efer: 0xd01,
    };
    (mem, paging)
}

fn cpu(paging: Paging, code: &[u8], mem: &GuestMemory) -> CpuState {
    mem.write_slice(code, GuestAddress(CODE_GPA)).unwrap();
    CpuState {
        gpr: [0; 16],
        rip: CODE,
        rflags: 0x246,
        long_mode: true,
        cs_base: 0,
        fs_base: 0,
        gs_base: 0,
        gdt_base: DATA + 0x800,
        gdt_limit: 16 * 8 - 1,
        cpl: 0,
        paging,
    }
}

#[test]
fn the_walk_follows_4k_2m_and_1g_pages() {
    let (mem, paging) = guest();
    let non_canonical = 0x0000_8000_0000_0000;
    for (gva, write, gpa) in [
        (DATA + 0x123, true, Ok(DATA_GPA + 0x123)),
        (RODATA, true, Err(WalkError::ReadOnly(RODATA))),
        (RODATA + 8, false, Ok(RODATA_GPA + 8)),
        (HOLE, false, Err(WalkError::NotPresent(HOLE))),
        (
            non_canonical,
            false,
            Err(WalkError::NonCanonical(non_canonical)),
        ),
    ] {
        assert_eq!(paging.translate(&mem, gva, write), gpa, "{gva:#x}");
    }
    // A 2 MiB page in the PD and a 1 GiB page in the PDPT.
    mem.write_obj(0x20_0000u64 | P | W | 0x80, GuestAddress(PD + 9 * 8))
        .unwrap();
    assert_eq!(
        paging.translate(&mem, 0xffff_ffff_8121_2345, false),
        Ok(0x21_2345)
    );
    mem.write_obj(0x4000_0000u64 | P | 0x80, GuestAddress(PDPT + 511 * 8))
        .unwrap();
    assert_eq!(
        paging.translate(&mem, 0xffff_ffff_c000_0042, false),
        Ok(0x4000_0042)
    );
    // CR0.WP clear: supervisor writes ignore read-only entries.
    let no_wp = Paging {
        cr0: paging.cr0 & !(1 << 16),
        ..paging
    };
    assert_eq!(no_wp.translate(&mem, RODATA, true), Ok(RODATA_GPA));
    // Paging off: linear is physical.
    let off = Paging {
        cr0: 0x11,
        ..paging
    };
    assert_eq!(off.translate(&mem, 0x1234, true), Ok(0x1234));
}

#[test]
fn the_walk_refuses_tables_outside_memory_and_other_modes() {
    let (mem, paging) = guest();
    let far = Paging {
        cr3: 0x8000_0000,
        ..paging
    };
    assert_eq!(
        far.translate(&mem, DATA, false),
        Err(WalkError::TableOutsideMemory(0x8000_0000 + 511 * 8))
    );
    let legacy = Paging { efer: 0, ..paging };
    assert_eq!(
        legacy.translate(&mem, DATA, false),
        Err(WalkError::UnsupportedMode)
    );
}

#[test]
fn int3_traps_with_rip_after_it() {
    let (mem, paging) = guest();
    let mut c = cpu(paging, &[0xcc, 0x90], &mem);
    let before = c.clone();
    let (kind, effect) = step(&mut c, &mem).unwrap();
    assert_eq!(kind, Kind::Int3);
    assert_eq!(
        effect,
        Effect::Raise(Exception {
            vector: 3,
            error_code: None,
            cr2: None
        })
    );
    assert_eq!(c.rip, CODE + 1);
    assert_eq!(c.gpr, before.gpr);
}

#[test]
fn fwait_completes() {
    let (mem, paging) = guest();
    let mut c = cpu(paging, &[0x9b, 0x65], &mem);
    assert_eq!(step(&mut c, &mem), Ok((Kind::Fwait, Effect::Done)));
    assert_eq!(c.rip, CODE + 1);
}

/// `lock cmpxchg16b [rsi+0x20]`, as in Linux's SLUB.
const CMPXCHG16B_RSI_20: [u8; 6] = [0xf0, 0x48, 0x0f, 0xc7, 0x4e, 0x20];

fn cmpxchg16b_cpu(mem: &GuestMemory, paging: Paging, rsi: u64) -> CpuState {
    let mut c = cpu(paging, &CMPXCHG16B_RSI_20, mem);
    c.gpr[6] = rsi;
    (c.gpr[0], c.gpr[2]) = (0x1111, 0x2222); // RDX:RAX, expected
    (c.gpr[3], c.gpr[1]) = (0x3333, 0x4444); // RCX:RBX, new
    c
}

/// A guest whose 16 aligned bytes at `[rsi+0x20]` hold `in_memory`, and its CPU at
/// [`cmpxchg16b_cpu`].
fn cmpxchg16b_on(in_memory: u128) -> (GuestMemory, CpuState) {
    let (mem, paging) = guest();
    mem.write_obj(in_memory, GuestAddress(DATA_GPA + 0x40))
        .unwrap();
    let c = cmpxchg16b_cpu(&mem, paging, DATA + 0x20);
    (mem, c)
}

#[test]
fn cmpxchg16b_stores_when_equal() {
    let (mem, mut c) = cmpxchg16b_on(0x2222_u128 << 64 | 0x1111);
    c.rflags &= !RFLAGS_ZF;
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg16b, Effect::Done)));
    assert_eq!(
        mem.read_obj::<u128>(GuestAddress(DATA_GPA + 0x40)).unwrap(),
        0x4444_u128 << 64 | 0x3333
    );
    assert_ne!(c.rflags & RFLAGS_ZF, 0);
    assert_eq!((c.gpr[0], c.gpr[2]), (0x1111, 0x2222));
    assert_eq!(c.rip, CODE + 6);
}

#[test]
fn cmpxchg16b_loads_when_different() {
    let (mem, mut c) = cmpxchg16b_on(0x9999_u128 << 64 | 0x8888);
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg16b, Effect::Done)));
    assert_eq!(
        mem.read_obj::<u128>(GuestAddress(DATA_GPA + 0x40)).unwrap(),
        0x9999_u128 << 64 | 0x8888,
        "memory unchanged"
    );
    assert_eq!(c.rflags & RFLAGS_ZF, 0);
    assert_eq!((c.gpr[0], c.gpr[2]), (0x8888, 0x9999));
}

#[test]
fn cmpxchg8b_uses_the_low_halves_and_zero_extends() {
    let (mem, paging) = guest();
    // 0f c7 0f: cmpxchg8b [rdi]
    let mut c = cpu(paging, &[0x0f, 0xc7, 0x0f], &mem);
    c.gpr[7] = DATA + 8;
    mem.write_obj(0xaaaa_bbbb_cccc_ddddu64, GuestAddress(DATA_GPA + 8))
        .unwrap();
    (c.gpr[0], c.gpr[2]) = (0xffff_ffff_0000_0001, 0xffff_ffff_0000_0002);
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg8b, Effect::Done)));
    assert_eq!((c.gpr[0], c.gpr[2]), (0xcccc_dddd, 0xaaaa_bbbb));
    (c.gpr[3], c.gpr[1]) = (0x5, 0x6);
    c.rip = CODE;
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg8b, Effect::Done)));
    assert_eq!(
        mem.read_obj::<u64>(GuestAddress(DATA_GPA + 8)).unwrap(),
        0x6_0000_0005
    );
}

#[test]
fn faults_are_the_guests_and_nothing_is_written() {
    let (mem, paging) = guest();
    let gp = Effect::Raise(Exception {
        vector: 13,
        error_code: Some(0),
        cr2: None,
    });
    // Misaligned 16-byte operand: #GP(0).
    let mut c = cmpxchg16b_cpu(&mem, paging, DATA + 0x28);
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg16b, gp)));
    assert_eq!(c.rip, CODE, "a fault leaves RIP on the instruction");
    // Non-canonical: #GP(0).
    let mut c = cmpxchg16b_cpu(&mem, paging, 0x0000_8000_0000_0000);
    assert_eq!(step(&mut c, &mem), Ok((Kind::CmpXchg16b, gp)));
    // Not mapped: #PF, write, not present, CR2 = the address.
    let mut c = cmpxchg16b_cpu(&mem, paging, HOLE - 0x20);
    assert_eq!(
        step(&mut c, &mem),
        Ok((
            Kind::CmpXchg16b,
            Effect::Raise(Exception {
                vector: 14,
                error_code: Some(2),
                cr2: Some(HOLE)
            })
        ))
    );
    // Read-only: #PF, write, present.
    let mut c = cmpxchg16b_cpu(&mem, paging, RODATA - 0x20);
    let Ok((_, Effect::Raise(e))) = step(&mut c, &mem) else {
        panic!("read-only page must fault");
    };
    assert_eq!((e.vector, e.error_code, e.cr2), (14, Some(3), Some(RODATA)));
    assert_eq!(mem.read_obj::<u128>(GuestAddress(RODATA_GPA)).unwrap(), 0);
}

#[test]
fn ram_ends_stop_the_vm_with_the_instruction() {
    let (mem, paging) = guest();
    // Mapped by the guest to 1 GiB, beyond its 2 MiB of RAM.
    let mut c = cmpxchg16b_cpu(&mem, paging, BEYOND_RAM - 0x20);
    let err = step(&mut c, &mem).unwrap_err();
    assert!(err.to_string().contains("not in guest RAM"), "{err}");
    assert!(err.to_string().contains("f0, 48, 0f, c7, 4e, 20"), "{err}");
    // An instruction Ember does not know, and code in an unmapped page.
    let mut c = cpu(paging, &[0x48, 0x0f, 0xae, 0x2f], &mem);
    let err = step(&mut c, &mem).unwrap_err();
    assert!(err.to_string().contains("opcode 0x0f 0xae"), "{err}");
    c.rip = HOLE;
    let err = step(&mut c, &mem).unwrap_err();
    assert!(err.to_string().contains("end early"), "{err}");
}

#[test]
fn a_split_cmpxchg8b_is_refused() {
    let (mem, paging) = guest();
    // DATA's last 4 bytes and RODATA's first 4: different frames, and the second read-only.
    let mut c = cpu(paging, &[0x0f, 0xc7, 0x0f], &mem);
    c.gpr[7] = DATA + 0xffc;
    let Ok((_, Effect::Raise(e))) = step(&mut c, &mem) else {
        panic!("the read-only half must fault");
    };
    assert_eq!(e.cr2, Some(RODATA + 3));
    // Both halves writable but not contiguous in guest-physical memory.
    mem.write_obj(0x10_5000u64 | P | W, GuestAddress(PT + 16))
        .unwrap();
    let err = step(&mut c, &mem).unwrap_err();
    assert!(err.to_string().contains("spans two pages"), "{err}");
}

/// Linux's CPUNODE segment (GDT entry 15, DPL 3): its limit is the CPU (and node) number.
#[test]
fn lsl_reads_a_segment_limit_from_the_gdt() {
    let (mem, paging) = guest();
    let desc: u64 = 0x1005 | (0x3 << 40) | (1 << 44) | (3 << 45) | (1 << 47);
    mem.write_obj(desc, GuestAddress(DATA_GPA + 0x800 + 15 * 8))
        .unwrap();
    // lsl rax, rax (REX.W 0F 03 /r), as Linux's paranoid entry does.
    let lsl_rax = [0x48, 0x0f, 0x03, 0xc0];
    let mut c = cpu(paging, &lsl_rax, &mem);
    c.gpr[0] = 0x7b;
    c.rflags &= !RFLAGS_ZF;
    assert_eq!(step(&mut c, &mem).unwrap(), (Kind::Lsl, Effect::Done));
    assert_eq!((c.gpr[0], c.rip), (0x1005, CODE + 4));
    assert_ne!(c.rflags & RFLAGS_ZF, 0);
    // A null selector, one past the GDT's limit, or an LDT selector: ZF clear, RAX kept.
    for selector in [0u64, 16 << 3, (15 << 3) | 4] {
        let mut c = cpu(paging, &lsl_rax, &mem);
        c.gpr[0] = selector;
        assert_eq!(step(&mut c, &mem).unwrap(), (Kind::Lsl, Effect::Done));
        assert_eq!((c.gpr[0], c.rflags & RFLAGS_ZF), (selector, 0));
    }
    // lsl ecx, eax with the granularity bit: a 4 KiB-granular limit, zero-extended.
    mem.write_obj(desc | (1 << 55), GuestAddress(DATA_GPA + 0x800 + 14 * 8))
        .unwrap();
    let mut c = cpu(paging, &[0x0f, 0x03, 0xc8], &mem);
    (c.gpr[0], c.gpr[1]) = (14 << 3, u64::MAX);
    step(&mut c, &mem).unwrap();
    assert_eq!(c.gpr[1], 0x0100_5fff);
    // A memory operand is not emulated: said, not guessed.
    let mut c = cpu(paging, &[0x0f, 0x03, 0x00], &mem);
    assert!(step(&mut c, &mem).is_err());
}
