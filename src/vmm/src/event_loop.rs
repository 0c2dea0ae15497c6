//! The VMM thread's event sources besides the devices: the i8042 reset line and the ACPI
//! power-off line, and the eventfds
//! that only wake the loop (the exit signal, the API's requests), after which the
//! [`crate::controller::Controller`] looks at what changed.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::{ExitSignal, VmExit, VmmFailure};

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// Turns a line by which the guest ends the VM (the i8042's reset, the ACPI sleep control
/// register's power-off) into a VM exit.
pub(crate) struct ExitLine {
    pub evt: EventFd,
    pub exit: Arc<ExitSignal>,
    /// What the guest did when the line is raised: [`VmExit::Reset`] or [`VmExit::PowerOff`].
    pub reason: VmExit,
    /// The line's name, for the error if it cannot be watched.
    pub what: &'static str,
}

impl MutEventSubscriber for ExitLine {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.evt, EventSet::IN)) {
            self.exit.report(VmExit::VmmError(VmmFailure::ExitLine(
                self.what,
                e.to_string(),
            )));
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.evt.read();
        self.exit.report(self.reason.clone());
    }
}

/// An eventfd whose only job is to return the event loop to its caller.
pub(crate) struct Wakeup {
    pub evt: EventFd,
    pub what: &'static str,
}

impl MutEventSubscriber for Wakeup {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.evt, EventSet::IN)) {
            log::error!("cannot watch the {} eventfd: {e}", self.what);
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.evt.as_raw_fd() {
            let _ = self.evt.read();
        }
    }
}
