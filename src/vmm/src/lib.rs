//! The Ember VMM core. A request becomes a running vCPU in four steps:
//!
//! 1. The API thread (crate `api`) parses a request into a [`rpc::VmmAction`] and hands it
//!    to the VMM thread, where the [`controller::Controller`] applies Firecracker's
//!    pre-boot and post-boot rules.
//! 2. [`resources::VmResources`] gathers and validates the configuration ([`config`]), one
//!    request at a time or from `--config-file` in one go, with the same checks.
//! 3. On `InstanceStart`, [`builder::build`] turns it into a [`microvm::MicroVm`]: guest
//!    memory ([`memory`]), the KVM VM ([`vm`]), the kernel and boot information (crate
//!    `arch`), the devices (crate `devices`) and configured vCPUs ([`vcpu`]).
//! 4. [`microvm::MicroVm::start`] starts a thread per vCPU; [`controller::Controller::run`]
//!    runs the event loop ([`event_loop`]) on the VMM thread until the guest resets, powers
//!    off, fails, or ember gets a signal.

pub mod builder;
pub mod config;
pub mod controller;
pub mod device_set;
pub mod event_loop;
pub mod memory;
pub mod metrics_writer;
pub mod microvm;
pub mod msi;
pub mod pvm;
pub mod resources;
pub mod rpc;
pub mod snapshot;
mod sys;
pub mod vcpu;
pub mod vm;

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

pub use builder::{build, BuildError, Console};
pub use controller::Controller;

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest reset the machine (i8042 0xFE, triple fault, or a KVM reset event).
    Reset,
    /// The guest powered off.
    PowerOff,
    /// Ember received this signal (SIGTERM or SIGINT).
    Signal(i32),
    /// vCPU `index` could not go on.
    VcpuError { index: u8, failure: VcpuFailure },
    /// The VMM thread could not go on.
    VmmError(VmmFailure),
}

/// Why the VMM thread stopped the VM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmmFailure {
    #[error("the VMM thread's seccomp filter could not be installed: {0}")]
    Filter(String),
    #[error("the event loop failed: {0}")]
    EventLoop(String),
    #[error("cannot watch the {0}: {1}")]
    ExitLine(&'static str, String),
}

/// Why a vCPU stopped the VM. (Kept as the sentences of the errors it comes from where those
/// cannot be copied: the reason is read by more than one thread.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VcpuFailure {
    #[error("its seccomp filter could not be installed: {0}")]
    Filter(String),
    #[error("KVM_RUN failed: {0}")]
    Run(String),
    #[error("it could not enter the guest (hardware reason {reason:#x} on host CPU {cpu})")]
    FailEntry { reason: u64, cpu: u32 },
    #[error("it raised unknown system event {0}")]
    SystemEvent(u32),
    #[error("it stopped on an unexpected KVM exit: {0}")]
    UnexpectedExit(String),
    #[error("the host could not emulate a guest instruction, nor could Ember: {0}")]
    Emulation(String),
}

impl std::fmt::Display for VmExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmExit::Reset => write!(f, "the guest reset the machine"),
            VmExit::PowerOff => write!(f, "the guest powered off"),
            VmExit::Signal(n) => write!(f, "ember received signal {n}"),
            VmExit::VcpuError { index, failure } => write!(f, "vCPU {index}: {failure}"),
            VmExit::VmmError(e) => write!(f, "{e}"),
        }
    }
}

impl VmExit {
    /// ember's exit status: 0 when the guest ended the VM, 128 + N after signal N, 1 on error.
    pub fn exit_status(&self) -> i32 {
        match self {
            VmExit::Reset | VmExit::PowerOff => 0,
            VmExit::Signal(n) => 128 + n,
            VmExit::VcpuError { .. } | VmExit::VmmError(_) => 1,
        }
    }
}

/// Where vCPUs (and signal handlers) report that the VM must stop. The first report wins;
/// the eventfd wakes the VMM thread.
#[derive(Debug)]
pub struct ExitSignal {
    evt: EventFd,
    reason: Mutex<Option<VmExit>>,
    /// Set from a signal handler, where no lock may be taken; the VMM thread turns it into
    /// a reason.
    pending_signal: AtomicI32,
}

impl ExitSignal {
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitSignal {
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
            reason: Mutex::new(None),
            pending_signal: AtomicI32::new(0),
        })
    }

    pub fn report(&self, reason: VmExit) {
        let mut slot = devices::bus::lock(&self.reason);
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        let _ = self.evt.write(1);
    }

    /// Async-signal-safe: an atomic store and an eventfd write.
    pub fn report_signal(&self, signum: i32) {
        self.pending_signal.store(signum, Ordering::SeqCst);
        let _ = self.evt.write(1);
    }

    pub fn reason(&self) -> Option<VmExit> {
        let pending = self.pending_signal.swap(0, Ordering::SeqCst);
        if pending != 0 {
            self.report(VmExit::Signal(pending));
        }
        devices::bus::lock(&self.reason).clone()
    }

    pub fn event(&self) -> &EventFd {
        &self.evt
    }
}
