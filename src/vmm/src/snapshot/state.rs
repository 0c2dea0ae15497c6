//! What KVM holds of a microVM, captured from a stopped VM and put back into a new one: each
//! vCPU's registers, system registers, FPU/extended state, LAPIC, MSRs, pending events,
//! debug registers and run state, and the VM's interrupt controllers, PIT and clock.
//! Restoring follows the order KVM needs: run state and registers before the LAPIC, MSRs
//! after the LAPIC, events last.

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
    KVM_CLOCK_REALTIME, KVM_CLOCK_TSC_STABLE, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read the {what} of vCPU {index}: {source}")]
    VcpuGet {
        what: &'static str,
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error("cannot restore the {what} of vCPU {index}: {source}")]
    VcpuSet {
        what: &'static str,
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {index} took {set} of its {saved} saved MSRs (the first refused is {first:#x})")]
    Msrs {
        index: u8,
        set: usize,
        saved: usize,
        first: u32,
    },
    #[error("cannot read the VM's {what}: {source}")]
    VmGet {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("cannot restore the VM's {what}: {source}")]
    VmSet {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
}

/// One vCPU as KVM holds it.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub lapic: kvm_lapic_state,
    pub msrs: Vec<kvm_msr_entry>,
    pub events: kvm_vcpu_events,
    pub debugregs: kvm_debugregs,
    pub mp_state: kvm_mp_state,
}

/// The VM-wide state KVM holds: the PICs and IOAPIC, the PIT and the guest clock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

/// Reads `msrs` (indices) from `vcpu`, leaving out any KVM lists but cannot read here.
fn read_msrs(vcpu: &VcpuFd, index: u8, msrs: &[u32]) -> Result<Vec<kvm_msr_entry>, StateError> {
    let mut wanted: Vec<u32> = msrs.to_vec();
    loop {
        let entries: Vec<kvm_msr_entry> = wanted
            .iter()
            .map(|&i| kvm_msr_entry {
                index: i,
                ..Default::default()
            })
            .collect();
        let mut list = Msrs::from_entries(&entries).map_err(|_| StateError::Msrs {
            index,
            set: 0,
            saved: wanted.len(),
            first: 0,
        })?;
        let read = vcpu
            .get_msrs(&mut list)
            .map_err(|source| StateError::VcpuGet {
                what: "MSRs",
                index,
                source,
            })?;
        if read == wanted.len() {
            return Ok(list.as_slice().to_vec());
        }
        // KVM stops at the first MSR it cannot read: leave that one out and read again.
        wanted.remove(read);
    }
}

/// Captures vCPU `index` (stopped: not in KVM_RUN), with the MSRs in `msr_list`.
pub fn save_vcpu(vcpu: &VcpuFd, index: u8, msr_list: &[u32]) -> Result<VcpuState, StateError> {
    let get = |what: &'static str| {
        move |source| StateError::VcpuGet {
            what,
            index,
            source,
        }
    };
    // Events and run state first, as KVM settles them when they are read.
    let mp_state = vcpu.get_mp_state().map_err(get("run state"))?;
    let events = vcpu.get_vcpu_events().map_err(get("pending events"))?;
    Ok(VcpuState {
        regs: vcpu.get_regs().map_err(get("registers"))?,
        sregs: vcpu.get_sregs().map_err(get("system registers"))?,
        xsave: vcpu.get_xsave().map_err(get("extended state (xsave)"))?,
        xcrs: vcpu.get_xcrs().map_err(get("XCRs"))?,
        lapic: vcpu.get_lapic().map_err(get("LAPIC"))?,
        msrs: read_msrs(vcpu, index, msr_list)?,
        events,
        debugregs: vcpu.get_debug_regs().map_err(get("debug registers"))?,
        mp_state,
    })
}

/// Puts `state` into vCPU `index` (new, with its CPUID already set, not yet run).
pub fn restore_vcpu(vcpu: &VcpuFd, index: u8, state: &VcpuState) -> Result<(), StateError> {
    let set = |what: &'static str| {
        move |source| StateError::VcpuSet {
            what,
            index,
            source,
        }
    };
    vcpu.set_mp_state(state.mp_state)
        .map_err(set("run state"))?;
    vcpu.set_regs(&state.regs).map_err(set("registers"))?;
    vcpu.set_sregs(&state.sregs)
        .map_err(set("system registers"))?;
    crate::sys::set_xsave(vcpu, &state.xsave).map_err(set("extended state (xsave)"))?;
    // A host without XSAVE has no XCRs: KVM saves none and refuses to set any.
    if state.xcrs.nr_xcrs > 0 {
        vcpu.set_xcrs(&state.xcrs).map_err(set("XCRs"))?;
    }
    vcpu.set_debug_regs(&state.debugregs)
        .map_err(set("debug registers"))?;
    vcpu.set_lapic(&state.lapic).map_err(set("LAPIC"))?;
    let msrs = Msrs::from_entries(&state.msrs).map_err(|_| StateError::Msrs {
        index,
        set: 0,
        saved: state.msrs.len(),
        first: 0,
    })?;
    let done = vcpu.set_msrs(&msrs).map_err(set("MSRs"))?;
    if done != state.msrs.len() {
        return Err(StateError::Msrs {
            index,
            set: done,
            saved: state.msrs.len(),
            first: state.msrs[done].index,
        });
    }
    vcpu.set_vcpu_events(&state.events)
        .map_err(set("pending events"))
}

fn chip(vm: &VmFd, chip_id: u32, what: &'static str) -> Result<kvm_irqchip, StateError> {
    let mut c = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut c)
        .map_err(|source| StateError::VmGet { what, source })?;
    Ok(c)
}

/// Captures the VM-wide state (every vCPU stopped).
pub fn save_vm(vm: &VmFd) -> Result<VmState, StateError> {
    let mut clock = vm.get_clock().map_err(|source| StateError::VmGet {
        what: "clock",
        source,
    })?;
    // Only the time itself is given back to KVM.
    clock.flags &= !KVM_CLOCK_TSC_STABLE;
    Ok(VmState {
        pic_master: chip(vm, KVM_IRQCHIP_PIC_MASTER, "master PIC")?,
        pic_slave: chip(vm, KVM_IRQCHIP_PIC_SLAVE, "slave PIC")?,
        ioapic: chip(vm, KVM_IRQCHIP_IOAPIC, "IOAPIC")?,
        pit: vm.get_pit2().map_err(|source| StateError::VmGet {
            what: "PIT",
            source,
        })?,
        clock,
    })
}

/// Puts `state` into a new VM that has its irqchip and PIT. With `realtime`, KVM advances the
/// guest clock by the wall-clock time since the snapshot (where the host recorded it).
pub fn restore_vm(vm: &VmFd, state: &VmState, realtime: bool) -> Result<(), StateError> {
    let set = |what: &'static str| move |source| StateError::VmSet { what, source };
    vm.set_irqchip(&state.pic_master)
        .map_err(set("master PIC"))?;
    vm.set_irqchip(&state.pic_slave).map_err(set("slave PIC"))?;
    vm.set_irqchip(&state.ioapic).map_err(set("IOAPIC"))?;
    vm.set_pit2(&state.pit).map_err(set("PIT"))?;
    let mut clock = state.clock;
    if !realtime {
        clock.flags &= !KVM_CLOCK_REALTIME;
    }
    vm.set_clock(&clock).map_err(set("clock"))
}

#[cfg(test)]
mod tests {
    use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES};
    use kvm_ioctls::Kvm;

    use super::*;
    use crate::snapshot::file;

    /// MSR_LSTAR (the syscall entry point): in KVM's list on every x86 host, PVM included.
    const LSTAR: u32 = 0xc000_0082;
    const ENTRY: u64 = 0xffff_ffff_8100_0000;

    fn vm(kvm: &Kvm) -> (VmFd, VcpuFd) {
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        vm.create_pit2(kvm_pit_config::default()).unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
        vcpu.set_cpuid2(&cpuid).unwrap();
        (vm, vcpu)
    }

    fn msr(vcpu: &VcpuFd, index: u32) -> u64 {
        let mut list = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .unwrap();
        assert_eq!(vcpu.get_msrs(&mut list).unwrap(), 1);
        list.as_slice()[0].data
    }

    #[test]
    fn a_vcpu_and_its_vm_come_back_in_a_new_vm_through_the_snapshot_file() {
        let Ok(kvm) = Kvm::new() else {
            println!("SKIPPED a_vcpu_and_its_vm_come_back_in_a_new_vm: no /dev/kvm");
            return;
        };
        let (vm_a, a) = vm(&kvm);
        let mut regs = a.get_regs().unwrap();
        regs.rip = 0x1234;
        regs.rax = 42;
        regs.rflags = 0x2;
        a.set_regs(&regs).unwrap();
        let mut sregs = a.get_sregs().unwrap();
        sregs.cr3 = 0x9000;
        a.set_sregs(&sregs).unwrap();
        let aux = Msrs::from_entries(&[kvm_msr_entry {
            index: LSTAR,
            data: ENTRY,
            ..Default::default()
        }])
        .unwrap();
        assert_eq!(a.set_msrs(&aux).unwrap(), 1);
        let list = kvm.get_msr_index_list().unwrap();

        let vcpu = save_vcpu(&a, 0, list.as_slice()).unwrap();
        assert!(vcpu
            .msrs
            .iter()
            .any(|m| m.index == LSTAR && m.data == ENTRY));
        let vm_state = save_vm(&vm_a).unwrap();
        // Through the file format and back.
        let bytes = file::encode(&(vcpu, vm_state));
        let (vcpu, vm_state): (VcpuState, VmState) = file::decode("t", &bytes).unwrap();

        let (vm_b, b) = vm(&kvm);
        restore_vm(&vm_b, &vm_state, false).unwrap();
        restore_vcpu(&b, 0, &vcpu).unwrap();
        let back = b.get_regs().unwrap();
        assert_eq!((back.rip, back.rax), (0x1234, 42));
        assert_eq!(b.get_sregs().unwrap().cr3, 0x9000);
        assert_eq!(msr(&b, LSTAR), ENTRY);
        assert_eq!(
            b.get_lapic().unwrap().regs[..0x40],
            a.get_lapic().unwrap().regs[..0x40]
        );
        // The guest clock goes on from where it was, not from zero.
        assert!(vm_b.get_clock().unwrap().clock >= vm_state.clock.clock);
    }
}
