//! A decoder for the few instructions Ember performs itself when the host's emulator cannot:
//! INT3, FWAIT and CMPXCHG8B/CMPXCHG16B. Everything else decodes to an error naming the opcode, so
//! that a stop is reported precisely. The bytes come from guest memory: the decoder never
//! reads past the slice it is given.

/// A general-purpose register, numbered as in ModRM/SIB (with REX extension bits).
pub type Gpr = u8;

/// A memory operand `[base + index * scale + disp]` (or RIP-relative), before segmentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemOperand {
    pub base: Option<Gpr>,
    pub index: Option<Gpr>,
    pub scale: u8,
    pub disp: i64,
    /// `[rip + disp]`: relative to the address of the next instruction.
    pub rip_relative: bool,
    /// An FS or GS override (the only segments with a base in 64-bit mode).
    pub segment: Segment,
    /// The 0x67 prefix: the address is computed in 32 bits.
    pub addr32: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    Flat,
    Fs,
    Gs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `int3` (0xCC): a breakpoint trap.
    Int3,
    /// `fwait` (0x9B): waits for pending x87 exceptions.
    Fwait,
    /// `cmpxchg8b m64` or, with REX.W, `cmpxchg16b m128`; `width` is 8 or 16 bytes.
    CmpXchg { width: u8, mem: MemOperand },
    /// `lsl reg, reg` (0x0F 0x03, register form): the limit of the segment whose selector is
    /// in `src` goes to `dst` (`size` bytes). Linux's NMI and paranoid entry read the CPU
    /// number this way (the limit of its CPUNODE segment).
    Lsl { dst: usize, src: usize, size: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub op: Op,
    /// Its length in bytes, prefixes included.
    pub len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the instruction bytes end early")]
    Truncated,
    #[error("Ember does not emulate this instruction (opcode {0})")]
    Unsupported(String),
    #[error("the instruction is invalid (it would raise #UD)")]
    Invalid,
}

const MAX_LEN: usize = 15;

/// Decodes the instruction at the start of `bytes`, as a CPU in 64-bit mode (`long_mode`) or
/// in a 32-bit code segment would.
pub fn decode(bytes: &[u8], long_mode: bool) -> Result<Insn, DecodeError> {
    let bytes = &bytes[..bytes.len().min(MAX_LEN)];
    let mut at = 0;
    let mut segment = Segment::Flat;
    let mut addr32 = !long_mode;
    let mut rex = 0u8;
    let mut lock = false;
    let mut opsize16 = false;
    let next = |at: &mut usize| -> Result<u8, DecodeError> {
        let b = *bytes.get(*at).ok_or(DecodeError::Truncated)?;
        *at += 1;
        Ok(b)
    };
    // Legacy prefixes, then (in 64-bit mode) one REX prefix directly before the opcode.
    let mut op = loop {
        let b = next(&mut at)?;
        match b {
            0xf0 => lock = true,
            0x66 => opsize16 = true,
            0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 => {}
            0x64 => segment = Segment::Fs,
            0x65 => segment = Segment::Gs,
            0x67 => addr32 = long_mode,
            0x40..=0x4f if long_mode => {
                rex = b;
                break next(&mut at)?;
            }
            _ => break b,
        }
    };
    if (0x40..=0x4f).contains(&op) && long_mode {
        // A REX prefix followed by another prefix or REX is ignored; be strict instead.
        return Err(DecodeError::Unsupported(format!("{op:#04x} after REX")));
    }
    let insn = |op: Op, at: usize| Insn { op, len: at as u8 };
    match op {
        0xcc => {
            if lock {
                return Err(DecodeError::Invalid);
            }
            Ok(insn(Op::Int3, at))
        }
        0x9b => {
            if lock {
                return Err(DecodeError::Invalid);
            }
            Ok(insn(Op::Fwait, at))
        }
        0x0f => {
            op = next(&mut at)?;
            if op == 0x03 {
                let modrm = next(&mut at)?;
                if lock {
                    return Err(DecodeError::Invalid);
                }
                if modrm >> 6 != 3 {
                    return Err(DecodeError::Unsupported(
                        "0x0f 0x03 with a memory operand".into(),
                    ));
                }
                let dst = usize::from((modrm >> 3) & 7) | usize::from(rex & 0x04) << 1;
                let src = usize::from(modrm & 7) | usize::from(rex & 0x01) << 3;
                let size = match (rex & 0x08 != 0, opsize16) {
                    (true, _) => 8,
                    (false, true) => 2,
                    (false, false) => 4,
                };
                return Ok(insn(Op::Lsl { dst, src, size }, at));
            }
            if op != 0xc7 {
                return Err(DecodeError::Unsupported(format!("0x0f {op:#04x}")));
            }
            let modrm = next(&mut at)?;
            let reg = (modrm >> 3) & 7;
            if reg != 1 {
                return Err(DecodeError::Unsupported(format!("0x0f 0xc7 /{reg}")));
            }
            if modrm >> 6 == 3 {
                return Err(DecodeError::Invalid);
            }
            let mem = decode_mem(bytes, &mut at, modrm, rex, long_mode, segment, addr32)?;
            let width = if rex & 0x08 != 0 { 16 } else { 8 };
            Ok(insn(Op::CmpXchg { width, mem }, at))
        }
        other => Err(DecodeError::Unsupported(format!("{other:#04x}"))),
    }
}

/// The memory operand of a ModRM byte whose mod is not 3, with its SIB and displacement.
fn decode_mem(
    bytes: &[u8],
    at: &mut usize,
    modrm: u8,
    rex: u8,
    long_mode: bool,
    segment: Segment,
    addr32: bool,
) -> Result<MemOperand, DecodeError> {
    let mut take = |n: usize| -> Result<&[u8], DecodeError> {
        let s = bytes.get(*at..*at + n).ok_or(DecodeError::Truncated)?;
        *at += n;
        Ok(s)
    };
    let md = modrm >> 6;
    let rm = modrm & 7;
    let rex_b = (rex & 1) << 3;
    let rex_x = ((rex >> 1) & 1) << 3;
    let mut op = MemOperand {
        base: None,
        index: None,
        scale: 1,
        disp: 0,
        rip_relative: false,
        segment,
        addr32,
    };
    let mut disp_len = match md {
        1 => 1,
        2 => 4,
        _ => 0,
    };
    if rm == 4 {
        let sib = take(1)?[0];
        let base = sib & 7;
        let index = ((sib >> 3) & 7) | rex_x;
        op.scale = 1 << (sib >> 6);
        if index != 4 {
            op.index = Some(index);
        }
        if base == 5 && md == 0 {
            disp_len = 4;
        } else {
            op.base = Some(base | rex_b);
        }
    } else if rm == 5 && md == 0 {
        disp_len = 4;
        op.rip_relative = long_mode;
    } else {
        op.base = Some(rm | rex_b);
    }
    op.disp = match disp_len {
        1 => i64::from(take(1)?[0] as i8),
        4 => {
            let d = take(4)?;
            i64::from(i32::from_le_bytes([d[0], d[1], d[2], d[3]]))
        }
        _ => 0,
    };
    Ok(op)
}

impl MemOperand {
    /// The linear address, given the registers, the address of the next instruction and the
    /// FS/GS bases.
    pub fn address(&self, gpr: &[u64; 16], next_rip: u64, fs_base: u64, gs_base: u64) -> u64 {
        let mut ea = self.disp as u64;
        if self.rip_relative {
            ea = ea.wrapping_add(next_rip);
        }
        if let Some(b) = self.base {
            ea = ea.wrapping_add(gpr[usize::from(b)]);
        }
        if let Some(i) = self.index {
            ea = ea.wrapping_add(gpr[usize::from(i)].wrapping_mul(u64::from(self.scale)));
        }
        if self.addr32 {
            ea &= 0xffff_ffff;
        }
        match self.segment {
            Segment::Flat => ea,
            Segment::Fs => ea.wrapping_add(fs_base),
            Segment::Gs => ea.wrapping_add(gs_base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(base: Option<Gpr>, index: Option<Gpr>, scale: u8, disp: i64) -> MemOperand {
        MemOperand {
            base,
            index,
            scale,
            disp,
            rip_relative: false,
            segment: Segment::Flat,
            addr32: false,
        }
    }

    #[test]
    fn int3() {
        assert_eq!(
            decode(&[0xcc, 0x90, 0x90], true),
            Ok(Insn {
                op: Op::Int3,
                len: 1
            })
        );
        assert_eq!(decode(&[0xcc], false).unwrap().len, 1);
        assert_eq!(decode(&[0xf0, 0xcc], true), Err(DecodeError::Invalid));
        assert_eq!(
            decode(&[0x9b, 0x65], true),
            Ok(Insn {
                op: Op::Fwait,
                len: 1
            })
        );
    }

    #[test]
    fn lock_cmpxchg16b_with_disp8_as_in_linux_slub() {
        // f0 48 0f c7 4e 20: lock cmpxchg16b [rsi+0x20]
        let bytes = [0xf0, 0x48, 0x0f, 0xc7, 0x4e, 0x20, 0x0f, 0x84];
        let insn = decode(&bytes, true).unwrap();
        assert_eq!(insn.len, 6);
        assert_eq!(
            insn.op,
            Op::CmpXchg {
                width: 16,
                mem: mem(Some(6), None, 1, 0x20)
            }
        );
    }

    #[test]
    fn cmpxchg8b_forms() {
        // 0f c7 0f: cmpxchg8b [rdi]
        let i = decode(&[0x0f, 0xc7, 0x0f], true).unwrap();
        assert_eq!(
            (i.len, i.op),
            (
                3,
                Op::CmpXchg {
                    width: 8,
                    mem: mem(Some(7), None, 1, 0)
                }
            )
        );
        // 41 0f c7 8c 24 00 01 00 00: cmpxchg8b [r12+0x100] (SIB, no index, disp32)
        let i = decode(&[0x41, 0x0f, 0xc7, 0x8c, 0x24, 0, 1, 0, 0], true).unwrap();
        assert_eq!(
            (i.len, i.op),
            (
                9,
                Op::CmpXchg {
                    width: 8,
                    mem: mem(Some(12), None, 1, 0x100)
                }
            )
        );
        // 4a 0f c7 0c c5 f0 ff ff ff: cmpxchg16b [r8*8 - 0x10] (REX.W and REX.X, SIB without base)
        let i = decode(
            &[0x4a, 0x0f, 0xc7, 0x0c, 0xc5, 0xf0, 0xff, 0xff, 0xff],
            true,
        )
        .unwrap();
        assert_eq!(
            (i.len, i.op),
            (
                9,
                Op::CmpXchg {
                    width: 16,
                    mem: mem(None, Some(8), 8, -0x10)
                }
            )
        );
    }

    #[test]
    fn rip_relative_and_segments() {
        // 65 48 0f c7 0d 10 00 00 00: cmpxchg16b gs:[rip+0x10]
        let i = decode(&[0x65, 0x48, 0x0f, 0xc7, 0x0d, 0x10, 0, 0, 0], true).unwrap();
        let Op::CmpXchg { mem, .. } = i.op else {
            panic!()
        };
        assert!(mem.rip_relative);
        assert_eq!(mem.segment, Segment::Gs);
        assert_eq!(mem.address(&[0; 16], 0x1000, 0, 0x5000), 0x6010);
        // In 32-bit code, mod 0 rm 5 is an absolute disp32.
        let i = decode(&[0x0f, 0xc7, 0x0d, 0x10, 0, 0, 0], false).unwrap();
        let Op::CmpXchg { mem, .. } = i.op else {
            panic!()
        };
        assert!(!mem.rip_relative && mem.addr32);
        assert_eq!(mem.address(&[0; 16], 0x1000, 0, 0), 0x10);
    }

    #[test]
    fn address_arithmetic_wraps_and_truncates() {
        let mut gpr = [0u64; 16];
        gpr[3] = u64::MAX;
        gpr[1] = 2;
        let m = mem(Some(3), Some(1), 4, 9);
        assert_eq!(m.address(&gpr, 0, 0, 0), 16);
        let m32 = MemOperand {
            addr32: true,
            ..mem(Some(3), None, 1, 1)
        };
        assert_eq!(m32.address(&gpr, 0, 0, 0), 0);
    }

    #[test]
    fn everything_else_is_named_or_rejected() {
        assert_eq!(decode(&[], true), Err(DecodeError::Truncated));
        assert_eq!(
            decode(&[0xf0, 0x48, 0x0f, 0xc7], true),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode(&[0x0f, 0xc7, 0x4e], true),
            Err(DecodeError::Truncated)
        );
        // cmpxchg8b with a register operand is #UD.
        assert_eq!(decode(&[0x0f, 0xc7, 0xc8], true), Err(DecodeError::Invalid));
        // xrstor [rdi]
        assert!(
            matches!(decode(&[0x48, 0x0f, 0xae, 0x2f], true), Err(DecodeError::Unsupported(s)) if s == "0x0f 0xae")
        );
        // rdrand eax is 0f c7 /6
        assert!(matches!(
            decode(&[0x0f, 0xc7, 0xf0], true),
            Err(DecodeError::Unsupported(_))
        ));
        // Fifteen prefixes and no opcode.
        assert_eq!(decode(&[0x66; 20], true), Err(DecodeError::Truncated));
    }
}
