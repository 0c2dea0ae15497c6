//! CPU templates: what the guest's CPUID and MSRs show. A static template is a name in
//! `machine-config.cpu_template` (Firecracker's T2, T2S, T2CL, C3 for Intel, T2A for AMD); a
//! custom one is `PUT /cpu-config` (or the config file's `cpu-config`, inline or a path),
//! in Firecracker's format: CPUID leaf/register and MSR modifiers, each a bitmap of `0`, `1`
//! and `x` (keep the host's bit), plus KVM capabilities to require (`"N"`) or not (`"!N"`).

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `machine-config.cpu_template`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
pub enum StaticCpuTemplate {
    C3,
    T2,
    T2S,
    T2CL,
    T2A,
    #[default]
    None,
}

impl fmt::Display for StaticCpuTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A custom CPU template (Firecracker's x86_64 `CpuConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuTemplate {
    #[serde(default)]
    pub kvm_capabilities: Vec<KvmCapability>,
    #[serde(default)]
    pub cpuid_modifiers: Vec<CpuidLeafModifier>,
    #[serde(default)]
    pub msr_modifiers: Vec<MsrModifier>,
}

/// The config file's `cpu-config`: the template itself, or the path of a file holding it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum CpuConfig {
    Path(String),
    Template(CpuTemplate),
}

/// A KVM capability the template needs (`"N"`) or does not need (`"!N"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmCapability {
    Add(u32),
    Remove(u32),
}

impl Serialize for KvmCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvmCapability::Add(n) => s.serialize_str(&n.to_string()),
            KvmCapability::Remove(n) => s.serialize_str(&format!("!{n}")),
        }
    }
}

impl<'de> Deserialize<'de> for KvmCapability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let (remove, number) = match text.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let n = number.parse::<u32>().map_err(|e| {
            D::Error::custom(format!(
                "Failed to parse string [{text}] as a kvm capability - can not convert to numeric: {e}"
            ))
        })?;
        Ok(if remove {
            KvmCapability::Remove(n)
        } else {
            KvmCapability::Add(n)
        })
    }
}

/// One CPUID leaf and subleaf and what changes in its registers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidLeafModifier {
    #[serde(with = "prefixed_u32")]
    pub leaf: u32,
    #[serde(with = "prefixed_u32")]
    pub subleaf: u32,
    /// KVM's CPUID entry flags (1: the subleaf matters).
    pub flags: u32,
    pub modifiers: Vec<CpuidRegisterModifier>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidRegisterModifier {
    pub register: CpuidRegister,
    pub bitmap: Bitmap<32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuidRegister {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

impl Serialize for CpuidRegister {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            CpuidRegister::Eax => "eax",
            CpuidRegister::Ebx => "ebx",
            CpuidRegister::Ecx => "ecx",
            CpuidRegister::Edx => "edx",
        })
    }
}

impl<'de> Deserialize<'de> for CpuidRegister {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match String::deserialize(d)?.as_str() {
            "eax" => CpuidRegister::Eax,
            "ebx" => CpuidRegister::Ebx,
            "ecx" => CpuidRegister::Ecx,
            "edx" => CpuidRegister::Edx,
            _ => {
                return Err(D::Error::custom(
                    "Invalid CPUID register. Must be one of [eax, ebx, ecx, edx]",
                ))
            }
        })
    }
}

/// One MSR and what changes in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MsrModifier {
    #[serde(with = "prefixed_u32")]
    pub addr: u32,
    pub bitmap: Bitmap<64>,
}

/// Which bits of a register a template sets (`mask`) and to what (`value`); written as a
/// string of `0`, `1` and `x` (keep), most significant bit first, with an optional `0b`
/// prefix and `_` separators; missing leading bits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bitmap<const BITS: u32> {
    pub mask: u64,
    pub value: u64,
}

impl<const BITS: u32> Bitmap<BITS> {
    pub fn apply(&self, register: u64) -> u64 {
        (register & !self.mask) | self.value
    }

    pub fn apply32(&self, register: u32) -> u32 {
        // BITS is 32 for CPUID registers, so nothing above bit 31 is set.
        self.apply(u64::from(register)) as u32
    }
}

impl<const BITS: u32> Serialize for Bitmap<BITS> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = String::from("0b");
        for bit in (0..BITS).rev() {
            text.push(match (self.mask >> bit & 1, self.value >> bit & 1) {
                (0, _) => 'x',
                (_, 0) => '0',
                _ => '1',
            });
        }
        s.serialize_str(&text)
    }
}

impl<'de, const BITS: u32> Deserialize<'de> for Bitmap<BITS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let digits = text.strip_prefix("0b").unwrap_or(&text);
        let mut bitmap = Bitmap::default();
        let mut bit = 0;
        for c in digits.bytes().rev() {
            if c == b'_' {
                continue;
            }
            if bit == BITS {
                return Err(D::Error::custom(format!(
                    "Failed to parse string [{text}] as a bitmap - string is too long"
                )));
            }
            match c {
                b'x' => {}
                b'0' => bitmap.mask |= 1 << bit,
                b'1' => {
                    bitmap.mask |= 1 << bit;
                    bitmap.value |= 1 << bit;
                }
                other => {
                    return Err(D::Error::custom(format!(
                        "Failed to parse string [{text}] as a bitmap - unknown character: {other}"
                    )))
                }
            }
            bit += 1;
        }
        Ok(bitmap)
    }
}

/// Numbers written as `0x…` or `0b…` strings, as Firecracker's templates write them.
mod prefixed_u32 {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{n:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let text = String::deserialize(d)?;
        let parsed = if let Some(hex) = text.strip_prefix("0x") {
            u32::from_str_radix(hex, 16)
        } else if let Some(bin) = text.strip_prefix("0b") {
            u32::from_str_radix(bin, 2)
        } else {
            return Err(D::Error::custom(format!(
                "No supported number system prefix found in value [{text}]. Make sure to prefix the number with '0x' for hexadecimal numbers or '0b' for binary numbers."
            )));
        };
        parsed.map_err(|e| {
            D::Error::custom(format!(
                "Failed to parse string [{text}] as a number for CPU template - {e}"
            ))
        })
    }
}

/// A custom template in Firecracker's format, for the unit tests: a capability removed and
/// one added, two bits of leaf 1 ECX (subleaf written in binary) and one bit of an MSR.
#[cfg(test)]
pub const EXAMPLE_TEMPLATE: &str = r#"{"kvm_capabilities": ["!1", "7"],
    "cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0b0", "flags": 0,
        "modifiers": [{"register": "ecx", "bitmap": "0b0x10"}]}],
    "msr_modifiers": [{"addr": "0x10a", "bitmap": "0b1"}]}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps_keep_x_and_set_the_rest() {
        let b: Bitmap<32> = serde_json::from_str(r#""0b1x0_1""#).unwrap();
        assert_eq!((b.mask, b.value), (0b1011, 0b1001));
        assert_eq!(b.apply32(0b0110), 0b1101);
        assert_eq!(serde_json::to_string(&b).unwrap().len(), 2 + 2 + 32);
        let again: Bitmap<32> = serde_json::from_value(serde_json::to_value(b).unwrap()).unwrap();
        assert_eq!(again, b);
        let long = format!("\"0b{}\"", "1".repeat(33));
        let e = serde_json::from_str::<Bitmap<32>>(&long).unwrap_err();
        assert!(e.to_string().contains("string is too long"), "{e}");
        let e = serde_json::from_str::<Bitmap<64>>(r#""0b12""#).unwrap_err();
        assert!(e.to_string().contains("unknown character: 50"), "{e}");
    }

    #[test]
    fn templates_parse_in_firecrackers_format() {
        let t: CpuTemplate = serde_json::from_str(EXAMPLE_TEMPLATE).unwrap();
        assert_eq!(
            t.kvm_capabilities,
            vec![KvmCapability::Remove(1), KvmCapability::Add(7)]
        );
        assert_eq!(t.cpuid_modifiers[0].leaf, 1);
        assert_eq!(
            t.cpuid_modifiers[0].modifiers[0].register,
            CpuidRegister::Ecx
        );
        assert_eq!(t.msr_modifiers[0].addr, 0x10a);
        let e = serde_json::from_str::<CpuTemplate>(
            r#"{"cpuid_modifiers": [{"leaf": "1", "subleaf": "0x0", "flags": 0, "modifiers": []}]}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("No supported number system prefix"),
            "{e}"
        );
        let e = serde_json::from_str::<CpuTemplate>(r#"{"reg_modifiers": []}"#).unwrap_err();
        assert!(
            e.to_string().contains("unknown field `reg_modifiers`"),
            "{e}"
        );
        let e = serde_json::from_str::<CpuTemplate>(
            r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
                "modifiers": [{"register": "rax", "bitmap": "0b1"}]}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("Invalid CPUID register"), "{e}");
    }
}
