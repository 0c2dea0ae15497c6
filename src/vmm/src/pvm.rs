//! PVM hosts: KVM provided by the `kvm_pvm` module (Pagetable-based Virtual Machine), found on
//! cloud VMs without hardware virtualisation. There a stock Linux guest stops or misbehaves
//! where real hardware would not; Ember detects the host and adapts the guest, so that the
//! same command works everywhere. docs/pvm.md explains each adaptation.

use std::path::Path;

/// Added to the kernel command line on PVM hosts, after the user's boot arguments:
/// - `noxsave`: PVM forces XSAVE on in CPUID and then cannot emulate XRSTOR; FXSAVE works.
/// - `clearcpuid=popcnt,smap,erms,fsrm`: CPUID shows the host's POPCNT and SMAP whatever
///   KVM_SET_CPUID2 says, and the host's emulator lacks POPCNT, CLAC and STAC, which the kernel
///   would patch in. Without ERMS and FSRM the kernel copies with `rep movsq` instead of
///   `rep movsb`: the host emulates each repetition, so that is up to 8 times fewer.
/// - `ember_pvm_syscall`: turns on the guest kernel's fix for SYSCALL from user mode
///   (guest/pvm-syscall.patch); kernels without the patch ignore it.
pub const BOOT_ARGS: &str = "noxsave clearcpuid=popcnt,smap,erms,fsrm ember_pvm_syscall";

/// CPUID leaf 1 ECX bits Ember hides on PVM hosts (KVM does pass these on): CMPXCHG16B,
/// which the host cannot emulate and Linux's SLUB would use on every allocation.
pub const HIDDEN_LEAF1_ECX: u32 = 1 << 13;

/// KVM paravirtual features (CPUID 0x40000001 EAX) Ember hides on PVM hosts: the ones whose
/// guest side makes hypercalls. The host answers a guest VMCALL by rewriting the instruction
/// in the guest's kernel text, which is read-only, so the guest takes a #PF in, for instance,
/// its PV IPI path. Hidden: PV_UNHALT (7), PV_SEND_IPI (11), PV_SCHED_YIELD (13).
pub const HIDDEN_KVM_FEATURES: u32 = (1 << 7) | (1 << 11) | (1 << 13);

/// Whether this host's KVM is kvm_pvm. Inside a jail there is no /sys: there a CPU with
/// neither VMX nor SVM that still runs KVM says the same (PVM needs neither).
pub fn host_is_pvm() -> bool {
    match Path::new("/sys/module").exists() {
        true => Path::new("/sys/module/kvm_pvm").exists(),
        false => !cpu_has_hardware_virtualization(),
    }
}

/// CPUID.1:ECX.VMX[bit 5] or CPUID.80000001h:ECX.SVM[bit 2].
fn cpu_has_hardware_virtualization() -> bool {
    use std::arch::x86_64::__cpuid;
    let vmx = __cpuid(1).ecx & (1 << 5) != 0;
    let svm = __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 2) != 0;
    vmx || svm
}
