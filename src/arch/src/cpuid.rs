//! The CPUID each vCPU sees: KVM's supported set, with this vCPU's APIC ID and the VM's
//! topology written in, the hypervisor bit set, and the PMU hidden.

use kvm_bindings::kvm_cpuid_entry2;

/// How the vCPUs are arranged: `count` logical CPUs in one socket, two threads per core
/// when `smt` is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    pub cpu_index: u8,
    pub count: u8,
    pub smt: bool,
}

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE: u32 = 0x4;
const LEAF_PMU: u32 = 0xa;
const LEAF_TOPOLOGY: u32 = 0xb;
const LEAF_TOPOLOGY_V2: u32 = 0x1f;
const ECX_HYPERVISOR: u32 = 1 << 31;
const EDX_HTT: u32 = 1 << 28;
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;

impl Topology {
    fn threads_per_core(self) -> u32 {
        if self.smt {
            2
        } else {
            1
        }
    }

    /// Bits of the APIC ID that number the threads within a core.
    fn smt_shift(self) -> u32 {
        u32::from(self.smt)
    }

    /// Bits of the APIC ID that number every logical CPU in the socket.
    fn package_shift(self) -> u32 {
        u32::from(self.count).next_power_of_two().trailing_zeros()
    }
}

/// Rewrites `entries` (KVM's supported CPUID) for one vCPU.
pub fn filter(entries: &mut [kvm_cpuid_entry2], topo: Topology) {
    let apic_id = u32::from(topo.cpu_index);
    let count = u32::from(topo.count);
    let cores = (count / topo.threads_per_core()).max(1);
    for entry in entries.iter_mut() {
        match entry.function {
            LEAF_FEATURES => {
                entry.ebx = (entry.ebx & 0x0000_ffff) | (apic_id << 24) | (count << 16);
                entry.ecx |= ECX_HYPERVISOR;
                if count > 1 {
                    entry.edx |= EDX_HTT;
                } else {
                    entry.edx &= !EDX_HTT;
                }
            }
            LEAF_CACHE => {
                let level = (entry.eax >> 5) & 0x7;
                let sharing = if level >= 3 {
                    count
                } else {
                    topo.threads_per_core()
                };
                entry.eax =
                    (entry.eax & 0x3fff) | ((sharing - 1) << 14) | ((cores - 1).min(63) << 26);
            }
            LEAF_PMU => {
                (entry.eax, entry.ebx, entry.ecx, entry.edx) = (0, 0, 0, 0);
            }
            LEAF_TOPOLOGY | LEAF_TOPOLOGY_V2 => {
                entry.edx = apic_id;
                entry.ecx = entry.index & 0xff;
                match entry.index {
                    0 => {
                        entry.eax = topo.smt_shift();
                        entry.ebx = topo.threads_per_core();
                        entry.ecx |= LEVEL_SMT << 8;
                    }
                    1 => {
                        entry.eax = topo.package_shift();
                        entry.ebx = count;
                        entry.ecx |= LEVEL_CORE << 8;
                    }
                    _ => {
                        entry.eax = 0;
                        entry.ebx = 0;
                    }
                }
            }
            _ => {}
        }
    }
}

/// CPUID.1:ECX bit 24: the local APIC's TSC-deadline timer mode.
const ECX_TSC_DEADLINE: u32 = 1 << 24;

/// Offers the TSC-deadline timer, which KVM emulates (KVM_CAP_TSC_DEADLINE_TIMER) but leaves
/// out of its supported CPUID. Linux then arms the local APIC timer by deadline and needs
/// neither the PIT nor a calibration of the APIC timer at boot.
pub fn offer_tsc_deadline_timer(entries: &mut [kvm_cpuid_entry2]) {
    for entry in entries.iter_mut().filter(|e| e.function == LEAF_FEATURES) {
        entry.ecx |= ECX_TSC_DEADLINE;
    }
}

/// KVM's paravirtual feature leaf.
const LEAF_KVM_FEATURES: u32 = 0x4000_0001;

/// Clears `leaf1_ecx` in leaf 1 and `kvm_eax` in KVM's feature leaf: features the VMM must
/// keep from the guest on this host.
pub fn hide_features(entries: &mut [kvm_cpuid_entry2], leaf1_ecx: u32, kvm_eax: u32) {
    for entry in entries.iter_mut() {
        match entry.function {
            LEAF_FEATURES => entry.ecx &= !leaf1_ecx,
            LEAF_KVM_FEATURES => entry.eax &= !kvm_eax,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: 0xffff_ffff,
            ebx: 0xffff_ffff,
            ecx: 0,
            edx: 0,
            ..Default::default()
        }
    }

    fn fixture() -> Vec<kvm_cpuid_entry2> {
        vec![
            leaf(0, 0),
            leaf(1, 0),
            leaf(4, 0),
            leaf(0xa, 0),
            leaf(0xb, 0),
            leaf(0xb, 1),
            leaf(0xb, 2),
        ]
    }

    #[test]
    fn the_tsc_deadline_timer_is_offered_in_leaf_1_only() {
        let mut entries = fixture();
        offer_tsc_deadline_timer(&mut entries);
        for e in &entries {
            assert_eq!(
                e.ecx & ECX_TSC_DEADLINE != 0,
                e.function == 1,
                "leaf {:#x}",
                e.function
            );
        }
    }

    #[test]
    fn hidden_features_leave_the_rest() {
        let mut entries = fixture();
        entries.push(leaf(LEAF_KVM_FEATURES, 0));
        entries[1].ecx = 0x8000_2001;
        entries[7].eax = 0x0100_2881;
        hide_features(&mut entries, 1 << 13, (1 << 11) | (1 << 7));
        assert_eq!(entries[1].ecx, 0x8000_0001);
        assert_eq!(entries[7].eax, 0x0100_2001);
        assert_eq!(entries[0], leaf(0, 0));
    }

    #[test]
    fn apic_id_and_count_in_leaf_1() {
        let mut entries = fixture();
        filter(
            &mut entries,
            Topology {
                cpu_index: 3,
                count: 4,
                smt: false,
            },
        );
        let l1 = entries[1];
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0xffff, "CLFLUSH size and brand kept");
        assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
        assert_ne!(l1.edx & EDX_HTT, 0);
        assert_eq!(entries[0], leaf(0, 0), "unrelated leaves untouched");
    }

    #[test]
    fn extended_topology_without_smt() {
        let mut entries = fixture();
        filter(
            &mut entries,
            Topology {
                cpu_index: 2,
                count: 3,
                smt: false,
            },
        );
        let (smt, core, end) = (entries[4], entries[5], entries[6]);
        assert_eq!((smt.eax, smt.ebx, smt.ecx, smt.edx), (0, 1, 0x100, 2));
        assert_eq!((core.eax, core.ebx, core.ecx, core.edx), (2, 3, 0x201, 2));
        assert_eq!((end.eax, end.ebx, end.ecx), (0, 0, 2));
    }

    #[test]
    fn smt_pairs_threads() {
        let mut entries = fixture();
        filter(
            &mut entries,
            Topology {
                cpu_index: 1,
                count: 4,
                smt: true,
            },
        );
        assert_eq!((entries[4].eax, entries[4].ebx), (1, 2));
        assert_eq!((entries[5].eax, entries[5].ebx), (2, 4));
        assert_eq!(entries[2].eax >> 26, 1, "two cores");
    }

    #[test]
    fn single_cpu_has_no_htt_and_pmu_is_hidden() {
        let mut entries = fixture();
        entries[1].edx = EDX_HTT;
        filter(
            &mut entries,
            Topology {
                cpu_index: 0,
                count: 1,
                smt: false,
            },
        );
        assert_eq!(entries[1].edx & EDX_HTT, 0);
        assert_eq!((entries[3].eax, entries[3].ebx), (0, 0));
    }
}
