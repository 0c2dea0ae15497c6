//! What Ember does when KVM stops a vCPU because the host could not emulate a guest
//! instruction (KVM_EXIT_INTERNAL_ERROR with an emulation suberror). On PVM hosts
//! (`kvm_pvm`) the guest kernel runs deprivileged and the host emulates what traps; its
//! emulator gives up on a few instructions that hardware runs natively. Ember reads the
//! instruction at RIP through the guest's page tables and does what the CPU would:
//! INT3 becomes a #BP for the guest, CMPXCHG8B/16B is performed atomically on guest RAM,
//! FWAIT completes (the guest's x87 state lives in KVM and has no pending exceptions to
//! deliver here: Linux runs FWAIT only to drop such exceptions), LSL reads a segment limit
//! from the guest's GDT (Linux's NMI entry reads its CPU number so).
//! Anything else stops the VM with the instruction's bytes and registers in the error.
//! Every byte, table entry and address involved is guest-controlled and bounds-checked.

pub mod atomic;
pub mod decode;
pub mod walk;

use std::sync::atomic::{AtomicU64, Ordering};

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;
use decode::Op;
use walk::{Paging, WalkError};

/// The longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

const VECTOR_BP: u8 = 3;
const VECTOR_GP: u8 = 13;
const VECTOR_PF: u8 = 14;
const RFLAGS_ZF: u64 = 1 << 6;
const PF_PRESENT: u32 = 1;
const PF_WRITE: u32 = 1 << 1;
const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;

/// An exception the emulated instruction raises in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exception {
    pub vector: u8,
    pub error_code: Option<u32>,
    /// The faulting address, for #PF.
    pub cr2: Option<u64>,
}

/// What an emulated instruction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Registers updated; the guest resumes after the instruction.
    Done,
    /// The guest takes this exception (RIP already set as the CPU would push it).
    Raise(Exception),
}

/// The kinds of instruction Ember emulated, for the exit statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int3,
    Fwait,
    CmpXchg8b,
    CmpXchg16b,
    Lsl,
}

const KINDS: [Kind; 5] = [
    Kind::Int3,
    Kind::Fwait,
    Kind::CmpXchg8b,
    Kind::CmpXchg16b,
    Kind::Lsl,
];

/// How many instructions of each kind Ember emulated in this process (one VM per process).
static EMULATED: [AtomicU64; KINDS.len()] = [const { AtomicU64::new(0) }; KINDS.len()];

impl Kind {
    fn count(self) {
        EMULATED[self as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// The instructions Ember emulated so far, by kind, leaving out kinds it never met.
pub fn emulated_counts() -> Vec<(Kind, u64)> {
    KINDS
        .iter()
        .map(|&k| (k, EMULATED[k as usize].load(Ordering::Relaxed)))
        .filter(|&(_, n)| n != 0)
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmulateError {
    #[error("KVM reported internal error {suberror} (data {data:x?}), not an emulation failure")]
    NotEmulation { suberror: u32, data: Vec<u64> },
    #[error("cannot read the vCPU's state: {0}")]
    State(String),
    #[error("{reason}; the instruction at rip {rip:#x} is {bytes:02x?}")]
    Insn {
        reason: String,
        rip: u64,
        bytes: Vec<u8>,
    },
}

/// The vCPU state an emulated instruction reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuState {
    /// RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8..R15: ModRM order.
    pub gpr: [u64; 16],
    pub rip: u64,
    pub rflags: u64,
    pub long_mode: bool,
    pub cs_base: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    /// The GDT's linear address and limit, and the current privilege level (for LSL).
    pub gdt_base: u64,
    pub gdt_limit: u16,
    pub cpl: u8,
    pub paging: Paging,
}

/// Reads up to 15 bytes at `gva`, stopping where the guest's mapping or its RAM ends: one
/// page walk for each page the bytes lie in (at most two).
pub fn read_insn_bytes(mem: &GuestMemory, paging: &Paging, gva: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_INSN_LEN);
    while out.len() < MAX_INSN_LEN {
        let at = gva.wrapping_add(out.len() as u64);
        let Ok(gpa) = paging.translate(mem, at, false) else {
            break;
        };
        let to_page_end = 0x1000 - (at & 0xfff) as usize;
        let mut chunk = vec![0u8; to_page_end.min(MAX_INSN_LEN - out.len())];
        if mem.read_slice(&mut chunk, GuestAddress(gpa)).is_err() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    out
}

/// Decodes and performs the instruction at the vCPU's RIP, updating `cpu` and guest memory.
pub fn step(cpu: &mut CpuState, mem: &GuestMemory) -> Result<(Kind, Effect), EmulateError> {
    let rip_linear = cpu.rip.wrapping_add(cpu.cs_base);
    let bytes = read_insn_bytes(mem, &cpu.paging, rip_linear);
    let fail = |reason: String| EmulateError::Insn {
        reason,
        rip: cpu.rip,
        bytes: bytes.clone(),
    };
    let insn = decode::decode(&bytes, cpu.long_mode).map_err(|e| fail(e.to_string()))?;
    let next_rip = cpu.rip.wrapping_add(u64::from(insn.len));
    match insn.op {
        Op::Int3 => {
            // A trap: the guest's handler sees RIP after the INT3.
            cpu.rip = next_rip;
            Ok((
                Kind::Int3,
                Effect::Raise(Exception {
                    vector: VECTOR_BP,
                    error_code: None,
                    cr2: None,
                }),
            ))
        }
        Op::Fwait => {
            cpu.rip = next_rip;
            Ok((Kind::Fwait, Effect::Done))
        }
        Op::CmpXchg {
            width,
            mem: operand,
        } => {
            let kind = if width == 16 {
                Kind::CmpXchg16b
            } else {
                Kind::CmpXchg8b
            };
            let gva = operand.address(&cpu.gpr, next_rip, cpu.fs_base, cpu.gs_base);
            if width == 16 && gva % 16 != 0 {
                return Ok((kind, Effect::Raise(general_protection())));
            }
            let gpa = match translate_span(mem, &cpu.paging, gva, u64::from(width)) {
                Ok(gpa) => gpa,
                Err(WalkError::NonCanonical(_)) => {
                    return Ok((kind, Effect::Raise(general_protection())))
                }
                Err(WalkError::NotPresent(at)) => {
                    return Ok((kind, Effect::Raise(write_page_fault(at, false))))
                }
                Err(WalkError::ReadOnly(at)) => {
                    return Ok((kind, Effect::Raise(write_page_fault(at, true))))
                }
                Err(e) => return Err(fail(e.to_string())),
            };
            let (lo_mask, half) = if width == 16 {
                (u64::MAX, 64)
            } else {
                (0xffff_ffff, 32)
            };
            let pair =
                |hi: u64, lo: u64| (u128::from(hi & lo_mask) << half) | u128::from(lo & lo_mask);
            let expected = pair(cpu.gpr[2], cpu.gpr[0]);
            let new = pair(cpu.gpr[1], cpu.gpr[3]);
            let (stored, old) = atomic::compare_exchange(mem, gpa, width, expected, new)
                .map_err(|e| fail(e.to_string()))?;
            if stored {
                cpu.rflags |= RFLAGS_ZF;
            } else {
                cpu.rflags &= !RFLAGS_ZF;
                // 32-bit results zero-extend into the 64-bit registers.
                cpu.gpr[0] = (old as u64) & lo_mask;
                cpu.gpr[2] = ((old >> half) as u64) & lo_mask;
            }
            cpu.rip = next_rip;
            Ok((kind, Effect::Done))
        }
        Op::Lsl { dst, src, size } => {
            let selector = cpu.gpr[src] as u16;
            match segment_limit(cpu, mem, selector) {
                Some(limit) => {
                    cpu.gpr[dst] = match size {
                        2 => (cpu.gpr[dst] & !0xffff) | (limit & 0xffff),
                        _ => limit,
                    };
                    cpu.rflags |= RFLAGS_ZF;
                }
                None => cpu.rflags &= !RFLAGS_ZF,
            }
            cpu.rip = next_rip;
            Ok((Kind::Lsl, Effect::Done))
        }
    }
}

/// What LSL finds for `selector`: the byte-granular limit of its GDT descriptor, or None
/// where the CPU clears ZF (a null or LDT selector, one past the GDT's limit or outside
/// the guest's memory, a descriptor type LSL refuses, or one the privilege levels hide).
fn segment_limit(cpu: &CpuState, mem: &GuestMemory, selector: u16) -> Option<u64> {
    let index = u64::from(selector & !7);
    if index == 0 || selector & 4 != 0 || index + 7 > u64::from(cpu.gdt_limit) {
        return None;
    }
    let gpa = cpu
        .paging
        .translate(mem, cpu.gdt_base.wrapping_add(index), false)
        .ok()?;
    let desc: u64 = mem.read_obj(GuestAddress(gpa)).ok()?;
    let kind = (desc >> 40) & 0xf;
    let code_or_data = desc & (1 << 44) != 0;
    let dpl = ((desc >> 45) & 3) as u8;
    let conforming_code = code_or_data && kind & 0b1100 == 0b1100;
    let allowed = match code_or_data {
        true => conforming_code || (dpl >= cpu.cpl && dpl >= (selector & 3) as u8),
        // An LDT, or an available or busy 64-bit TSS.
        false => matches!(kind, 2 | 9 | 11),
    };
    if !allowed {
        return None;
    }
    let raw = (desc & 0xffff) | ((desc >> 32) & 0xf_0000);
    Some(match desc & (1 << 55) != 0 {
        true => (raw << 12) | 0xfff,
        false => raw,
    })
}

/// The physical address of `len` bytes at `gva`, which must not straddle a page boundary
/// onto a different frame (the emulated access is one host operation).
fn translate_span(
    mem: &GuestMemory,
    paging: &Paging,
    gva: u64,
    len: u64,
) -> Result<u64, WalkError> {
    let first = paging.translate(mem, gva, true)?;
    let last_gva = gva.wrapping_add(len - 1);
    let last = paging.translate(mem, last_gva, true)?;
    if last != first.wrapping_add(len - 1) {
        // Only a misaligned CMPXCHG8B can land on two frames; one host instruction cannot
        // do that atomically, so it is refused (a fault on either page is still the guest's).
        return Err(WalkError::SplitAccess(gva));
    }
    Ok(first)
}

fn general_protection() -> Exception {
    Exception {
        vector: VECTOR_GP,
        error_code: Some(0),
        cr2: None,
    }
}

/// The #PF of a supervisor write to `addr`, which is mapped read-only if `present`.
fn write_page_fault(addr: u64, present: bool) -> Exception {
    let code = PF_WRITE | if present { PF_PRESENT } else { 0 };
    Exception {
        vector: VECTOR_PF,
        error_code: Some(code),
        cr2: Some(addr),
    }
}

impl CpuState {
    pub fn from_kvm(regs: &kvm_regs, sregs: &kvm_sregs) -> Self {
        CpuState {
            gpr: [
                regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi,
                regs.r8, regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
            ],
            rip: regs.rip,
            rflags: regs.rflags,
            long_mode: sregs.cs.l != 0 && sregs.efer & (1 << 10) != 0,
            cs_base: sregs.cs.base,
            fs_base: sregs.fs.base,
            gs_base: sregs.gs.base,
            gdt_base: sregs.gdt.base,
            gdt_limit: sregs.gdt.limit,
            cpl: (sregs.cs.selector & 3) as u8,
            paging: Paging {
                cr0: sregs.cr0,
                cr3: sregs.cr3,
                cr4: sregs.cr4,
                efer: sregs.efer,
            },
        }
    }

    /// Writes the registers an emulated instruction may change back into `regs`.
    pub fn store(&self, regs: &mut kvm_regs) {
        let g = &self.gpr;
        (regs.rax, regs.rcx, regs.rdx, regs.rbx) = (g[0], g[1], g[2], g[3]);
        (regs.rsp, regs.rbp, regs.rsi, regs.rdi) = (g[4], g[5], g[6], g[7]);
        (regs.r8, regs.r9, regs.r10, regs.r11) = (g[8], g[9], g[10], g[11]);
        (regs.r12, regs.r13, regs.r14, regs.r15) = (g[12], g[13], g[14], g[15]);
        regs.rip = self.rip;
        regs.rflags = self.rflags;
    }
}

/// Handles an internal-error exit: emulates the instruction and applies the result to the
/// vCPU, or explains why it cannot.
pub fn handle_internal_error(fd: &mut VcpuFd, mem: &GuestMemory) -> Result<Kind, EmulateError> {
    let (suberror, data) = internal_error_data(fd);
    if suberror != KVM_INTERNAL_ERROR_EMULATION {
        return Err(EmulateError::NotEmulation { suberror, data });
    }
    let state_err = |e: kvm_ioctls::Error| EmulateError::State(e.to_string());
    let mut regs = fd.get_regs().map_err(state_err)?;
    let mut sregs = fd.get_sregs().map_err(state_err)?;
    let mut cpu = CpuState::from_kvm(&regs, &sregs);
    let (kind, effect) = step(&mut cpu, mem)?;
    kind.count();
    cpu.store(&mut regs);
    fd.set_regs(&regs).map_err(state_err)?;
    if let Effect::Raise(exc) = effect {
        if let Some(cr2) = exc.cr2 {
            sregs.cr2 = cr2;
            fd.set_sregs(&sregs).map_err(state_err)?;
        }
        let mut events = fd.get_vcpu_events().map_err(state_err)?;
        events.exception.injected = 1;
        events.exception.pending = 0;
        events.exception.nr = exc.vector;
        events.exception.has_error_code = u8::from(exc.error_code.is_some());
        events.exception.error_code = exc.error_code.unwrap_or(0);
        fd.set_vcpu_events(&events).map_err(state_err)?;
    }
    Ok(kind)
}

/// The suberror and data words KVM left in kvm_run for an internal-error exit.
fn internal_error_data(fd: &mut VcpuFd) -> (u32, Vec<u64>) {
    crate::sys::internal_error_data(fd.get_kvm_run())
}

#[cfg(test)]
mod tests;
