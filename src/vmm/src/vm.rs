//! The KVM VM: its file descriptor, the memory slots, the in-kernel irqchip and PIT, and the
//! eventfds that connect devices to it (ioeventfd for queue kicks, irqfd for interrupts).

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES,
    KVM_MEM_LOG_DIRTY_PAGES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, IoEventAddress, Kvm, VcpuFd, VmFd};
use std::sync::Arc;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use vmm_sys_util::eventfd::EventFd;

use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open /dev/kvm: {0}")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("the host KVM lacks a capability Ember needs: {0}")]
    MissingCapability(&'static str),
    #[error("cannot create the KVM VM: {0}")]
    CreateVm(#[source] kvm_ioctls::Error),
    #[error("cannot set up the in-kernel interrupt controller: {0}")]
    Irqchip(#[source] kvm_ioctls::Error),
    #[error("cannot register guest memory with KVM at {addr:#x} ({size} bytes): {source}")]
    MemorySlot {
        addr: u64,
        size: u64,
        source: kvm_ioctls::Error,
    },
    #[error("cannot read the CPUID that KVM supports: {0}")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    #[error("cannot read the MSRs that KVM supports: {0}")]
    MsrList(#[source] kvm_ioctls::Error),
    #[error("cannot connect a device eventfd to KVM: {0}")]
    EventFd(#[source] kvm_ioctls::Error),
    #[error("cannot create vCPU {index}: {source}")]
    CreateVcpu {
        index: u8,
        source: kvm_ioctls::Error,
    },
}

/// What the host KVM offers every vCPU, read once per VM.
#[derive(Debug)]
pub struct HostCaps {
    pub supported_cpuid: CpuId,
    pub msr_indices: Vec<u32>,
    /// The host's KVM is kvm_pvm ([`crate::pvm`]).
    pub pvm: bool,
    /// KVM emulates the local APIC's TSC-deadline timer (KVM_CAP_TSC_DEADLINE_TIMER).
    pub tsc_deadline: bool,
}

#[derive(Debug)]
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
}

/// How often KVM_CREATE_VM is tried when a signal interrupts it.
const CREATE_VM_ATTEMPTS: u32 = 5;

/// KVM_CREATE_VM, tried again when a signal interrupts it (the kernel gives up with EINTR
/// when one is pending): that is no reason to fail a start, and QEMU and Firecracker retry
/// too. Bounded, so that a storm of signals still ends in an error.
fn create_vm(kvm: &Kvm) -> Result<VmFd, Error> {
    let mut attempt = 1;
    loop {
        match kvm.create_vm() {
            Err(e) if e.errno() == libc::EINTR && attempt < CREATE_VM_ATTEMPTS => {
                log::info!("KVM_CREATE_VM was interrupted (attempt {attempt}); trying again");
                attempt += 1;
            }
            result => return result.map_err(Error::CreateVm),
        }
    }
}

impl Vm {
    /// Opens KVM and creates a VM on guest memory `mem` (see [`Vm::register_memory`]), with an
    /// in-kernel irqchip (PIC, IOAPIC, local APICs) and PIT.
    ///
    /// The memory goes in before the irqchip: on the kvm_pvm host a first memory slot took
    /// 4 to 16 ms after KVM_CREATE_IRQCHIP and 0.1 ms before it (the irqchip then 0.03 ms),
    /// which is most of a snapshot restore.
    pub fn new(mem: &GuestMemory, track_dirty: bool) -> Result<Self, Error> {
        let kvm = Kvm::new().map_err(Error::OpenKvm)?;
        for (cap, name) in [
            (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
            (Cap::Ioeventfd, "KVM_CAP_IOEVENTFD"),
            (Cap::Irqfd, "KVM_CAP_IRQFD"),
            (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(Error::MissingCapability(name));
            }
        }
        let fd = create_vm(&kvm)?;
        let vm = Vm {
            kvm,
            fd: Arc::new(fd),
        };
        vm.register_memory(mem, track_dirty)?;
        let fd = &vm.fd;
        fd.set_tss_address(arch::layout::KVM_TSS_ADDR as usize)
            .map_err(Error::Irqchip)?;
        fd.create_irq_chip().map_err(Error::Irqchip)?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(Error::Irqchip)?;
        Ok(vm)
    }

    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// The VM's fd for what changes KVM's view after boot (MSI routes, moved ioeventfds).
    pub fn shared_fd(&self) -> Arc<VmFd> {
        self.fd.clone()
    }

    /// KVM_CHECK_EXTENSION of capability number `n` (a CPU template's `kvm_capabilities`).
    pub fn has_capability(&self, n: u32) -> bool {
        self.kvm.check_extension_raw(libc::c_ulong::from(n)) > 0
    }

    pub fn host_caps(&self) -> Result<HostCaps, Error> {
        let supported_cpuid = self
            .kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(Error::SupportedCpuid)?;
        let msr_indices = self
            .kvm
            .get_msr_index_list()
            .map_err(Error::MsrList)?
            .as_slice()
            .to_vec();
        Ok(HostCaps {
            supported_cpuid,
            msr_indices,
            pvm: crate::pvm::host_is_pvm(),
            tsc_deadline: self.kvm.check_extension(Cap::TscDeadlineTimer),
        })
    }

    /// Gives every region of `mem` to the guest, one KVM slot each; with `track_dirty`, KVM
    /// logs the pages the guest writes (for diff snapshots).
    fn register_memory(&self, mem: &GuestMemory, track_dirty: bool) -> Result<(), Error> {
        for (slot, region) in mem.iter().enumerate() {
            let region_info = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: if track_dirty {
                    KVM_MEM_LOG_DIRTY_PAGES
                } else {
                    0
                },
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
            };
            // SAFETY: the host range [as_ptr, as_ptr + len) is a live mapping owned by `mem`,
            // which the VMM keeps alive (the builder moves it into `Vmm`) for as long as the VM
            // runs; slots do not overlap because guest memory regions do not.
            unsafe { self.fd.set_user_memory_region(region_info) }.map_err(|source| {
                Error::MemorySlot {
                    addr: region_info.guest_phys_addr,
                    size: region_info.memory_size,
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// Signals `evt` instead of exiting when the guest writes `datamatch` to MMIO `addr`.
    pub fn register_mmio_ioevent(
        &self,
        evt: &EventFd,
        addr: u64,
        datamatch: u32,
    ) -> Result<(), Error> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), datamatch)
            .map_err(Error::EventFd)
    }

    /// Raises interrupt line `gsi` whenever `evt` is written.
    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), Error> {
        self.fd.register_irqfd(evt, gsi).map_err(Error::EventFd)
    }

    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, Error> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|source| Error::CreateVcpu { index, source })
    }
}
