//! vCPUs: their boot state (CPUID, MSRs, FPU, LAPIC, and registers for the boot vCPU) and the
//! thread that runs each of them.

pub mod control;
pub mod emulate;
pub mod exit;
mod static_templates;
pub mod stats;
pub mod template;

use std::sync::Arc;

use arch::cpuid::Topology;
use arch::BootProtocol;
use devices::Bus;
use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

use crate::memory::GuestMemory;
use crate::vm::HostCaps;
use crate::{ExitSignal, VcpuFailure, VmExit};
use control::{VcpuControl, VcpuHandle};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot set the CPUID of vCPU {0}: {1}")]
    Cpuid(u8, #[source] kvm_ioctls::Error),
    #[error("cannot set the MSRs of vCPU {0}: {1}")]
    Msrs(u8, String),
    #[error("cannot set the registers of vCPU {0}: {1}")]
    Registers(u8, #[source] kvm_ioctls::Error),
    #[error("cannot start the thread of vCPU {0}: {1}")]
    Spawn(u8, #[source] std::io::Error),
}

/// Where the boot vCPU starts.
#[derive(Debug, Clone, Copy)]
pub struct BootEntry {
    pub protocol: BootProtocol,
    pub entry: u64,
    pub cr3: u64,
}

/// What the vCPUs of a microVM share: where their exits go and what they count.
#[derive(Debug, Clone)]
pub struct VcpuShared {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub exit: Arc<ExitSignal>,
    pub mem: GuestMemory,
    pub metrics: Arc<telemetry::Metrics>,
    /// The MSRs a snapshot saves (KVM's list).
    pub msr_indices: Arc<Vec<u32>>,
}

/// One vCPU, configured and ready to run on its own thread.
#[derive(Debug)]
pub struct Vcpu {
    index: u8,
    fd: VcpuFd,
    shared: VcpuShared,
    control: Arc<VcpuControl>,
}

impl Vcpu {
    /// Gives vCPU `topo.cpu_index` its boot state. Only the boot vCPU gets `boot`; the others
    /// wait in KVM for the guest's INIT/SIPI.
    pub fn configure(
        fd: &VcpuFd,
        topo: Topology,
        caps: &HostCaps,
        cpu: &template::GuestCpu,
        boot: Option<BootEntry>,
    ) -> Result<(), Error> {
        let index = topo.cpu_index;
        let mut cpuid = caps.supported_cpuid.clone();
        cpu.apply_cpuid(cpuid.as_mut_slice());
        arch::cpuid::filter(cpuid.as_mut_slice(), topo);
        if caps.tsc_deadline {
            arch::cpuid::offer_tsc_deadline_timer(cpuid.as_mut_slice());
        }
        if caps.pvm {
            arch::cpuid::hide_features(
                cpuid.as_mut_slice(),
                crate::pvm::HIDDEN_LEAF1_ECX,
                crate::pvm::HIDDEN_KVM_FEATURES,
            );
        }
        fd.set_cpuid2(&cpuid).map_err(|e| Error::Cpuid(index, e))?;

        let entries: Vec<kvm_msr_entry> = arch::msr::boot_msrs()
            .into_iter()
            .filter(|(msr, _)| caps.msr_indices.contains(msr))
            .map(|(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let msrs =
            Msrs::from_entries(&entries).map_err(|e| Error::Msrs(index, format!("{e:?}")))?;
        Self::set_all_msrs(fd, index, &msrs)?;
        Self::apply_template_msrs(fd, index, cpu)?;

        fd.set_fpu(&arch::regs::boot_fpu())
            .map_err(|e| Error::Registers(index, e))?;
        let mut lapic = fd.get_lapic().map_err(|e| Error::Registers(index, e))?;
        arch::regs::set_lint_pins(&mut lapic);
        fd.set_lapic(&lapic)
            .map_err(|e| Error::Registers(index, e))?;

        if let Some(boot) = boot {
            fd.set_regs(&arch::regs::boot_regs(boot.protocol, boot.entry))
                .map_err(|e| Error::Registers(index, e))?;
            let mut sregs = fd.get_sregs().map_err(|e| Error::Registers(index, e))?;
            arch::regs::boot_sregs(boot.protocol, &mut sregs, boot.cr3);
            fd.set_sregs(&sregs)
                .map_err(|e| Error::Registers(index, e))?;
        }
        Ok(())
    }

    /// The template's MSR bits over the values KVM gives the vCPU.
    fn apply_template_msrs(fd: &VcpuFd, index: u8, cpu: &template::GuestCpu) -> Result<(), Error> {
        if cpu.msrs.is_empty() {
            return Ok(());
        }
        let wanted: Vec<kvm_msr_entry> = cpu
            .msrs
            .iter()
            .map(|(addr, _)| kvm_msr_entry {
                index: *addr,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&wanted).map_err(|e| Error::Msrs(index, format!("{e:?}")))?;
        let read = fd
            .get_msrs(&mut msrs)
            .map_err(|e| Error::Msrs(index, e.to_string()))?;
        if read != wanted.len() {
            let failed = wanted[read].index;
            return Err(Error::Msrs(
                index,
                format!("KVM cannot read MSR {failed:#x}"),
            ));
        }
        for (entry, (_, bitmap)) in msrs.as_mut_slice().iter_mut().zip(&cpu.msrs) {
            entry.data = bitmap.apply(entry.data);
        }
        Self::set_all_msrs(fd, index, &msrs)
    }

    /// KVM stops at the first MSR it refuses and says how many it set: that one is named.
    fn set_all_msrs(fd: &VcpuFd, index: u8, msrs: &Msrs) -> Result<(), Error> {
        let written = fd
            .set_msrs(msrs)
            .map_err(|e| Error::Msrs(index, e.to_string()))?;
        match msrs.as_slice().get(written) {
            None => Ok(()),
            Some(failed) => Err(Error::Msrs(
                index,
                format!("KVM refused MSR {:#x}", failed.index),
            )),
        }
    }

    pub fn new(index: u8, fd: VcpuFd, shared: VcpuShared) -> Self {
        Vcpu {
            index,
            fd,
            shared,
            control: Arc::default(),
        }
    }

    /// Puts a snapshot's state into this vCPU (configured with its CPUID, not yet run).
    pub fn restore_state(
        &self,
        saved: &crate::snapshot::state::VcpuState,
    ) -> Result<(), crate::snapshot::state::StateError> {
        crate::snapshot::state::restore_vcpu(&self.fd, self.index, saved)
    }

    /// Parks the thread before the vCPU first runs, until the VMM thread resumes it.
    pub fn hold(&self) {
        self.control.hold();
    }

    /// Starts the thread `ember_vcpuN`. It installs the vCPU seccomp filter, then runs until
    /// its vCPU stops the VM; the VMM thread ends the process (and with it the other vCPU
    /// threads) once the VM has stopped.
    pub fn start(self, filters: seccomp::Filters) -> Result<VcpuHandle, Error> {
        let index = self.index;
        let control = self.control.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ember_vcpu{index}"))
            .spawn(move || match filters.install(seccomp::Thread::Vcpu) {
                Ok(()) => self.run(),
                Err(e) => self.shared.exit.report(VmExit::VcpuError {
                    index,
                    failure: VcpuFailure::Filter(e.to_string()),
                }),
            })
            .map_err(|e| Error::Spawn(index, e))?;
        Ok(VcpuHandle {
            index,
            control,
            thread,
        })
    }

    /// Performs the instruction KVM could not, or stops the VM saying which one it was.
    fn emulate(&mut self) -> exit::Outcome {
        match emulate::handle_internal_error(&mut self.fd, &self.shared.mem) {
            Ok(kind) => {
                log::debug!("vCPU {} emulated {kind:?}", self.index);
                exit::Outcome::Continue
            }
            Err(e) => exit::stop(self.index, VcpuFailure::Emulation(e.to_string())),
        }
    }

    fn run(mut self) {
        loop {
            let (fd, index, msrs) = (&self.fd, self.index, &self.shared.msr_indices);
            self.control.park_if_paused(|| {
                crate::snapshot::state::save_vcpu(fd, index, msrs).map_err(|e| e.to_string())
            });
            let outcome = match self.fd.run() {
                Ok(exit) => {
                    exit::count(&exit, &self.shared.metrics.vcpu);
                    exit::handle(exit, self.index, &self.shared.pio, &self.shared.mmio)
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    exit::Outcome::Continue
                }
                Err(e) => exit::stop(self.index, VcpuFailure::Run(e.to_string())),
            };
            let outcome = match outcome {
                exit::Outcome::Emulate => self.emulate(),
                other => other,
            };
            if let exit::Outcome::Stop(reason) = outcome {
                if matches!(reason, VmExit::VcpuError { .. }) {
                    self.shared.metrics.vcpu.failures.inc();
                }
                self.shared.exit.report(reason);
                hold_until_exit(self);
            }
        }
    }
}

/// What a vCPU thread does once it has stopped the VM: nothing, until the VMM thread ends the
/// process. Returning would drop the vCPU's file descriptors, and perhaps the last reference
/// to a device, under the vCPU filter, which allows neither `close` nor what a device's drop
/// may call: whenever the thread got there before the process exit (as it does on a slower
/// host), seccomp killed ember with SIGSYS on a healthy guest's reboot.
fn hold_until_exit(vcpu: Vcpu) -> ! {
    let _held = vcpu;
    loop {
        std::thread::park();
    }
}
