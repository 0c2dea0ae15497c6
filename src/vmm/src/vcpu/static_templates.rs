//! The static CPU templates' CPUID and MSR bitmaps: the values of Firecracker v1.16.1's T2,
//! T2S, T2CL, C3 (Intel) and T2A (AMD) templates, so that a guest sees the same CPU under
//! Ember as under Firecracker. Each row: leaf, subleaf, KVM flags, register, bitmap (`0`/`1`
//! set the bit, `x` keeps the host's), most significant bit first. A template's CPUID is a
//! list of row lists, so that the T2 family's common rows are written once.

use crate::config::CpuidRegister::{self, Eax, Ebx, Ecx, Edx};

/// One CPUID register change of a static template.
pub type CpuidRow = (u32, u32, u32, CpuidRegister, &'static str);
/// One MSR change of a static template.
pub type MsrRow = (u32, &'static str);

/// Leaves 1, 7 and 0xd, the same in T2, T2S, T2CL and T2A.
const T2_FAMILY: &[CpuidRow] = &[
    (0x1, 0x0, 0, Eax, "xxxx000000000011xx00011011110010"),
    (0x1, 0x0, 0, Ecx, "xxxxxxxxxxxxx0xx00xx00x0000000xx"),
    (0x1, 0x0, 0, Edx, "000x0xxxx00xx0xxxxx1xxxx1xxxxxxx"),
    (0x7, 0x0, 1, Ebx, "00000000000x000000x00x1xxxx0x0xx"),
    (0x7, 0x0, 1, Ecx, "x0xxxxxxx0xxxxx0x0x00000x0x0000x"),
    (0x7, 0x0, 1, Edx, "xxxxxxxxxxxxxxxxxxxxxxx0xxx000xx"),
    (0xd, 0x0, 1, Eax, "xxxxxxxxxxxxxxxxxxxxxx0x00000xxx"),
    (0xd, 0x1, 1, Eax, "xxxxxxxxxxxxxxxxxxxxxxxxxxxx000x"),
];

pub const T2_CPUID: &[&[CpuidRow]] = &[
    T2_FAMILY,
    &[
        (0x80000001, 0x0, 0, Ecx, "xx0xxxxxxxxxxxxxxxxxxxx0xxxxxxxx"),
        (0x80000001, 0x0, 0, Edx, "xxxxx0xxxxxxxxxxxxxxxxxxxxxxxxxx"),
        (0x80000008, 0x0, 0, Ebx, "xxxxxxxxxxxxxxxxxxxxxx0xxxxxxxxx"),
    ],
];
pub const T2_MSRS: &[MsrRow] = &[];

/// T2's CPUID, with an MSR of its own.
pub const T2S_CPUID: &[&[CpuidRow]] = T2_CPUID;

pub const T2S_MSRS: &[MsrRow] = &[(
    0x10a,
    "0000000000000000000000000000000000001100000010000000110001001100",
)];

pub const T2CL_CPUID: &[&[CpuidRow]] = &[
    T2_FAMILY,
    &[
        (0x80000001, 0x0, 0, Ecx, "xx0xxxxxxxxxxxxxxxxxxxx000xxxxxx"),
        (0x80000001, 0x0, 0, Edx, "xxxxx00000xxxxxxxxxxxxxxxxxxxxxx"),
        (0x80000008, 0x0, 0, Ebx, "xxxxxxxxxxxxxxxxxxxxxx0xxxxxxxxx"),
    ],
];
pub const T2CL_MSRS: &[MsrRow] = &[(
    0x10a,
    "00000000000000000000000000000000000xxx0x0000x0x0xxx0000xxxxxxxxx",
)];

pub const C3_CPUID: &[&[CpuidRow]] = &[&[
    (0x1, 0x0, 0, Eax, "xxxx000000000011xx00011011100100"),
    (0x1, 0x0, 0, Ecx, "xxxxxxxxx0xxxxxx00x000x0xx0000xx"),
    (0x1, 0x0, 0, Edx, "0x0x0xxxx00xx0xxxxx1xxxx1xxxxxxx"),
    (0x7, 0x0, 1, Ebx, "000000000x0x000000x000x0xx0000xx"),
    (0x7, 0x0, 1, Ecx, "x0xxxxxxx0xxxxx0x0xx0xxxxxx0000x"),
    (0x7, 0x0, 1, Edx, "xxxxxxxxxxxxxxxxxxxxxxxxxxxx00xx"),
    (0xd, 0x0, 1, Eax, "xxxxxxxxxxxxxxxxxxxxxx0x00000xxx"),
    (0xd, 0x1, 1, Eax, "xxxxxxxxxxxxxxxxxxxxxxxxxxxx000x"),
    (0x80000001, 0x0, 0, Ecx, "xxxxxxxxxxxxxxxxxxxxxxx0xx0xxxxx"),
    (0x80000001, 0x0, 0, Edx, "xxxxx0xxxxxxxxxxxxxxxxxxxxxxxxxx"),
]];
pub const C3_MSRS: &[MsrRow] = &[];

pub const T2A_CPUID: &[&[CpuidRow]] = &[
    T2_FAMILY,
    &[
        (0x80000001, 0x0, 0, Ecx, "xx0xxxxxxxxxxxxxxxxxxxx000xxx0xx"),
        (0x80000001, 0x0, 0, Edx, "xxxxx00xx0xxxxxxxxxxxxxxxxxxxxxx"),
        (0x80000008, 0x0, 0, Ebx, "xxxxxxxxxxx111xxxxxxxx0xxxxxx1x0"),
    ],
];
pub const T2A_MSRS: &[MsrRow] = &[];
