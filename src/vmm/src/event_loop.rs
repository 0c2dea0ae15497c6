//! The VMM thread's event sources besides the devices: the i8042 reset line, and the eventfds
//! that only wake the loop (the exit signal, the API's requests), after which the
//! [`crate::controller::Controller`] looks at what changed.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::{ExitSignal, VmExit, VmmFailure};

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// Turns the i8042 reset line into a VM exit.
pub(crate) struct ResetWatcher {
    pub reset: EventFd,
    pub exit: Arc<ExitSignal>,
}

impl MutEventSubscriber for ResetWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.reset, EventSet::IN)) {
            self.exit
                .report(VmExit::VmmError(VmmFailure::ResetLine(e.to_string())));
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.reset.read();
        self.exit.report(VmExit::Reset);
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
