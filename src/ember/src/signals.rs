//! SIGTERM and SIGINT end the VM cleanly: the handler only records the signal in the VM's
//! exit signal (an atomic store and an eventfd write, both async-signal-safe), and the VMM
//! thread does the rest on its own stack.

use std::sync::{Arc, OnceLock};

use vmm::ExitSignal;

static EXIT: OnceLock<Arc<ExitSignal>> = OnceLock::new();

extern "C" fn on_signal(signum: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    if let Some(exit) = EXIT.get() {
        exit.report_signal(signum);
    }
}

pub fn install(exit: Arc<ExitSignal>) -> std::io::Result<()> {
    let _ = EXIT.set(exit);
    for signum in [libc::SIGTERM, libc::SIGINT] {
        vmm_sys_util::signal::register_signal_handler(signum, on_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    Ok(())
}
