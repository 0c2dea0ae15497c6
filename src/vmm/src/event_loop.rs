//! The VMM thread: one epoll loop (event-manager) over every device eventfd, the i8042 reset
//! line, the vCPUs' exit signal and the signal eventfd, run until the VM stops.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::vcpu::stats::VcpuStats;
use crate::vcpu::Vcpu;
use crate::{ExitSignal, VmExit};

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// A built VM, ready to run.
pub struct Vmm {
    pub(crate) event_manager: EventManager<Subscriber>,
    pub(crate) vcpus: Vec<Vcpu>,
    /// KVM's counters of each vCPU that has them, by vCPU index.
    pub(crate) vcpu_stats: Vec<(u8, VcpuStats)>,
    pub(crate) exit: Arc<ExitSignal>,
    /// Kept alive for the VM's lifetime: KVM's memory slots point into it.
    pub(crate) _memory: crate::memory::GuestMemory,
    pub(crate) _vm: crate::vm::Vm,
}

impl std::fmt::Debug for Vmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vmm")
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

impl Vmm {
    /// Where anything (a signal handler, a test) can ask the VM to stop.
    pub fn exit_signal(&self) -> Arc<ExitSignal> {
        self.exit.clone()
    }

    /// Starts the vCPUs and runs the event loop until the VM stops; returns why.
    pub fn run(mut self) -> VmExit {
        for vcpu in std::mem::take(&mut self.vcpus) {
            if let Err(e) = vcpu.start() {
                return VmExit::VmmError(e.to_string());
            }
        }
        loop {
            if let Some(reason) = self.exit.reason() {
                self.log_exit_counts();
                return reason;
            }
            if let Err(e) = self.event_manager.run() {
                return VmExit::VmmError(format!("the event loop failed: {e}"));
            }
        }
    }

    /// Logs KVM's counters for each vCPU (exits by reason), at Info: `--level Info`.
    fn log_exit_counts(&self) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        for (index, stats) in &self.vcpu_stats {
            let counts: Vec<String> = stats
                .read()
                .into_iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            log::info!("vCPU {index} KVM counters: {}", counts.join(" "));
        }
        let emulated = crate::vcpu::emulate::emulated_counts();
        if !emulated.is_empty() {
            log::info!("instructions Ember emulated: {emulated:?}");
        }
    }
}

/// Turns the i8042 reset line and the exit eventfd into loop exits.
pub(crate) struct ExitWatcher {
    pub reset: EventFd,
    pub exit: Arc<ExitSignal>,
}

impl MutEventSubscriber for ExitWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        for fd in [&self.reset, self.exit.event()] {
            if let Err(e) = ops.add(Events::new(fd, EventSet::IN)) {
                self.exit.report(VmExit::VmmError(format!(
                    "cannot watch the exit events: {e}"
                )));
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.reset.as_raw_fd() {
            let _ = self.reset.read();
            self.exit.report(VmExit::Reset);
        } else {
            let _ = self.exit.event().read();
        }
    }
}
