//! CPU templates made concrete for this host: which CPUID register bits and MSR bits every
//! vCPU gets, checked against what the host's KVM offers before any vCPU runs, with
//! Firecracker's checks and sentences (a static template needs its vendor and one of its CPU
//! models; every leaf and MSR a template changes must be one KVM has).

use kvm_bindings::kvm_cpuid_entry2;

use super::static_templates as table;
use crate::config::{Bitmap, CpuTemplate, CpuidRegister, KvmCapability, StaticCpuTemplate};
use crate::vm::HostCaps;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error(
        "Failed to get CPU template: CPU vendor mismatched between actual CPU and CPU template."
    )]
    VendorMismatch,
    #[error("Failed to get CPU template: The current CPU model is not permitted to apply the CPU template.")]
    CpuModel,
    #[error("Template changes a CPUID entry not supported by KVM: Leaf: {0:#x}, Subleaf: {1:#x}")]
    CpuidNotSupported(u32, u32),
    #[error("Template changes an MSR entry not supported by KVM: Register Address: {0:#x}")]
    MsrNotSupported(u32),
    #[error("Missing KVM capabilities: {0:?}")]
    MissingCapabilities(Vec<u32>),
}

/// One CPUID register change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuidChange {
    pub leaf: u32,
    pub subleaf: u32,
    pub flags: u32,
    pub register: CpuidRegister,
    pub bitmap: Bitmap<32>,
}

/// What a template does to every vCPU. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestCpu {
    pub cpuid: Vec<CpuidChange>,
    pub msrs: Vec<(u32, Bitmap<64>)>,
}

const INTEL: &[u8; 12] = b"GenuineIntel";
const AMD: &[u8; 12] = b"AuthenticAMD";

/// Leaf 1 EAX (family, model, stepping) of the CPUs each static template was made for.
const SKYLAKE: u32 = 0x0005_0654;
const CASCADE_LAKE: u32 = 0x0005_0657;
const ICE_LAKE: u32 = 0x0006_06a6;
const MILAN: u32 = 0x00a0_0f11;

/// What a static template needs and does: its vendor, the CPU models it was made for (leaf
/// 1 EAX's family, model and stepping) and its bitmaps.
struct StaticTemplate {
    vendor: &'static [u8; 12],
    models: &'static [u32],
    cpuid: &'static [&'static [table::CpuidRow]],
    msrs: &'static [table::MsrRow],
}

fn static_template(t: StaticCpuTemplate) -> Option<StaticTemplate> {
    use StaticCpuTemplate::*;
    let (vendor, models, cpuid, msrs): (_, &'static [u32], _, _) = match t {
        C3 => (
            INTEL,
            &[SKYLAKE, CASCADE_LAKE, ICE_LAKE],
            table::C3_CPUID,
            table::C3_MSRS,
        ),
        T2 => (
            INTEL,
            &[SKYLAKE, CASCADE_LAKE, ICE_LAKE],
            table::T2_CPUID,
            table::T2_MSRS,
        ),
        T2S => (
            INTEL,
            &[SKYLAKE, CASCADE_LAKE],
            table::T2S_CPUID,
            table::T2S_MSRS,
        ),
        T2CL => (
            INTEL,
            &[CASCADE_LAKE, ICE_LAKE],
            table::T2CL_CPUID,
            table::T2CL_MSRS,
        ),
        T2A => (AMD, &[MILAN], table::T2A_CPUID, table::T2A_MSRS),
        None => return Option::None,
    };
    Some(StaticTemplate {
        vendor,
        models,
        cpuid,
        msrs,
    })
}

/// The CPU vendor string of leaf 0 (EBX, EDX, ECX).
fn vendor(cpuid: &[kvm_cpuid_entry2]) -> [u8; 12] {
    let mut v = [0u8; 12];
    if let Some(e) = cpuid.iter().find(|e| e.function == 0) {
        v[..4].copy_from_slice(&e.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&e.edx.to_le_bytes());
        v[8..].copy_from_slice(&e.ecx.to_le_bytes());
    }
    v
}

/// Leaf 1 EAX's family, model and stepping (without the processor type and reserved bits).
fn model(cpuid: &[kvm_cpuid_entry2]) -> u32 {
    cpuid
        .iter()
        .find(|e| e.function == 1)
        .map_or(0, |e| e.eax & 0x0fff_0fff)
}

fn parse<const BITS: u32>(bits: &str) -> Bitmap<BITS> {
    serde_json::from_value(serde_json::Value::String(bits.into()))
        .expect("the static templates' bitmaps are well formed")
}

/// The template the microVM asked for, checked against the host: a static one by name, or a
/// custom one; `has_capability` answers KVM_CHECK_EXTENSION.
pub fn resolve(
    static_name: Option<StaticCpuTemplate>,
    custom: Option<&CpuTemplate>,
    caps: &HostCaps,
    has_capability: impl Fn(u32) -> bool,
) -> Result<GuestCpu, TemplateError> {
    let host = caps.supported_cpuid.as_slice();
    let mut guest = GuestCpu::default();
    if let Some(t) = static_name.and_then(static_template) {
        if &vendor(host) != t.vendor {
            return Err(TemplateError::VendorMismatch);
        }
        if !t.models.contains(&model(host)) {
            return Err(TemplateError::CpuModel);
        }
        guest.cpuid = t
            .cpuid
            .iter()
            .flat_map(|rows| rows.iter())
            .map(|&(leaf, subleaf, flags, register, bits)| CpuidChange {
                leaf,
                subleaf,
                flags,
                register,
                bitmap: parse(bits),
            })
            .collect();
        guest.msrs = t
            .msrs
            .iter()
            .map(|&(addr, bits)| (addr, parse(bits)))
            .collect();
    } else if let Some(t) = custom {
        let missing: Vec<u32> = t
            .kvm_capabilities
            .iter()
            .filter_map(|c| match c {
                KvmCapability::Add(n) if !has_capability(*n) => Some(*n),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(TemplateError::MissingCapabilities(missing));
        }
        for leaf in &t.cpuid_modifiers {
            for m in &leaf.modifiers {
                guest.cpuid.push(CpuidChange {
                    leaf: leaf.leaf,
                    subleaf: leaf.subleaf,
                    flags: leaf.flags,
                    register: m.register,
                    bitmap: m.bitmap,
                });
            }
        }
        guest.msrs = t.msr_modifiers.iter().map(|m| (m.addr, m.bitmap)).collect();
    }
    if let Some(c) = guest.cpuid.iter().find(|c| find(host, c).is_none()) {
        return Err(TemplateError::CpuidNotSupported(c.leaf, c.subleaf));
    }
    if let Some((addr, _)) = guest
        .msrs
        .iter()
        .find(|(a, _)| !caps.msr_indices.contains(a))
    {
        return Err(TemplateError::MsrNotSupported(*addr));
    }
    Ok(guest)
}

fn find(entries: &[kvm_cpuid_entry2], c: &CpuidChange) -> Option<usize> {
    entries
        .iter()
        .position(|e| e.function == c.leaf && e.index == c.subleaf)
}

impl GuestCpu {
    /// Changes `entries` (KVM's supported CPUID, before Ember's own adjustments, as
    /// Firecracker orders them). Every leaf was checked by [`resolve`].
    pub fn apply_cpuid(&self, entries: &mut [kvm_cpuid_entry2]) {
        for c in &self.cpuid {
            let Some(i) = find(entries, c) else { continue };
            let e = &mut entries[i];
            e.flags = c.flags;
            let register = match c.register {
                CpuidRegister::Eax => &mut e.eax,
                CpuidRegister::Ebx => &mut e.ebx,
                CpuidRegister::Ecx => &mut e.ecx,
                CpuidRegister::Edx => &mut e.edx,
            };
            *register = c.bitmap.apply32(*register);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::CpuId;

    fn caps(vendor: &[u8; 12], eax1: u32) -> HostCaps {
        let mut leaf0 = kvm_cpuid_entry2 {
            function: 0,
            ..Default::default()
        };
        leaf0.ebx = u32::from_le_bytes(vendor[..4].try_into().unwrap());
        leaf0.edx = u32::from_le_bytes(vendor[4..8].try_into().unwrap());
        leaf0.ecx = u32::from_le_bytes(vendor[8..].try_into().unwrap());
        let mut entries = vec![
            leaf0,
            kvm_cpuid_entry2 {
                function: 1,
                eax: eax1,
                ecx: 0xffff_ffff,
                ..Default::default()
            },
        ];
        for (function, index) in [
            (7, 0),
            (0xd, 0),
            (0xd, 1),
            (0x8000_0001, 0),
            (0x8000_0008, 0),
        ] {
            entries.push(kvm_cpuid_entry2 {
                function,
                index,
                eax: 0xffff_ffff,
                ebx: 0xffff_ffff,
                ecx: 0xffff_ffff,
                edx: 0xffff_ffff,
                ..Default::default()
            });
        }
        HostCaps {
            supported_cpuid: CpuId::from_entries(&entries).unwrap(),
            msr_indices: vec![0x10a],
            pvm: false,
            tsc_deadline: false,
        }
    }

    #[test]
    fn static_templates_need_their_vendor_and_model() {
        let milan = caps(AMD, MILAN);
        let t2a = resolve(Some(StaticCpuTemplate::T2A), None, &milan, |_| true).unwrap();
        assert_eq!(t2a.cpuid.len(), 11);
        let e = resolve(Some(StaticCpuTemplate::T2), None, &milan, |_| true).unwrap_err();
        assert_eq!(e, TemplateError::VendorMismatch);
        let rome = caps(AMD, 0x0083_0f10);
        let e = resolve(Some(StaticCpuTemplate::T2A), None, &rome, |_| true).unwrap_err();
        assert_eq!(e, TemplateError::CpuModel);
        // The reserved bits and the processor type do not count.
        let skylake = caps(INTEL, SKYLAKE | 0xf000_3000);
        let t2s = resolve(Some(StaticCpuTemplate::T2S), None, &skylake, |_| true).unwrap();
        assert_eq!(t2s.msrs.len(), 1);
        let none = resolve(Some(StaticCpuTemplate::None), None, &skylake, |_| true).unwrap();
        assert_eq!(none, GuestCpu::default());
    }

    #[test]
    fn custom_templates_change_only_their_bits_and_name_what_kvm_lacks() {
        let host = caps(INTEL, 0x0009_06a0);
        let template: CpuTemplate = serde_json::from_str(crate::config::EXAMPLE_TEMPLATE).unwrap();
        let guest = resolve(None, Some(&template), &host, |_| true).unwrap();
        let mut entries = host.supported_cpuid.as_slice().to_vec();
        guest.apply_cpuid(&mut entries);
        assert_eq!(entries[1].ecx, 0xffff_fff6);
        assert_eq!(guest.msrs[0].1.apply(0), 1);
        let e = resolve(None, Some(&template), &host, |c| c != 7).unwrap_err();
        assert_eq!(e.to_string(), "Missing KVM capabilities: [7]");
        let mut unknown_leaf = template.clone();
        unknown_leaf.cpuid_modifiers[0].leaf = 0x4000_0001;
        let e = resolve(None, Some(&unknown_leaf), &host, |_| true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Template changes a CPUID entry not supported by KVM: Leaf: 0x40000001, Subleaf: 0x0"
        );
        let mut unknown_msr = template;
        unknown_msr.msr_modifiers[0].addr = 0x1234;
        let e = resolve(None, Some(&unknown_msr), &host, |_| true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Template changes an MSR entry not supported by KVM: Register Address: 0x1234"
        );
    }
}
