//! Pausing and resuming vCPUs from the VMM thread (`PATCH /vm`). A paused vCPU thread waits on
//! a condition variable outside KVM_RUN; to get it there, the VMM thread raises the pause flag
//! and kicks the thread with a signal, which makes KVM_RUN return EINTR.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// How long a pause may take before it is reported as failed. A vCPU leaves KVM_RUN within
/// microseconds of a signal; this bound only matters if a vCPU thread is stuck in a device.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an unresponsive vCPU is kicked again: a kick that lands just before the thread
/// enters KVM_RUN is lost, so one is not enough.
const KICK_INTERVAL: Duration = Duration::from_millis(1);

/// Shared by a vCPU thread and the VMM thread.
#[derive(Debug, Default)]
pub struct VcpuControl {
    pause: AtomicBool,
    /// Whether the vCPU thread is parked; guarded so that wake-ups are never lost.
    parked: Mutex<bool>,
    changed: Condvar,
}

impl VcpuControl {
    /// Called by the vCPU thread between KVM_RUN calls: parks it while a pause is asked for.
    pub fn park_if_paused(&self) {
        if !self.pause.load(Ordering::Acquire) {
            return;
        }
        let mut parked = devices::bus::lock(&self.parked);
        *parked = true;
        self.changed.notify_all();
        while self.pause.load(Ordering::Acquire) {
            parked = self
                .changed
                .wait(parked)
                .unwrap_or_else(|poison| poison.into_inner());
        }
        *parked = false;
        self.changed.notify_all();
    }

    /// Waits up to `timeout` for the vCPU thread to park; true if it has.
    fn wait_parked(&self, timeout: Duration) -> bool {
        let parked = devices::bus::lock(&self.parked);
        let (parked, _) = self
            .changed
            .wait_timeout_while(parked, timeout, |p| !*p)
            .unwrap_or_else(|poison| poison.into_inner());
        *parked
    }
}

/// A started vCPU thread, as the VMM thread holds it.
#[derive(Debug)]
pub struct VcpuHandle {
    pub index: u8,
    pub control: std::sync::Arc<VcpuControl>,
    pub thread: JoinHandle<()>,
}

/// The signal that kicks a vCPU out of KVM_RUN.
fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) kick handler once per process; without a handler the signal would
/// end the process.
pub fn install_kick_handler() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), on_kick)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
    });
    result
}

/// Stops every vCPU outside KVM_RUN; returns which one did not stop in time.
pub fn pause_all(vcpus: &[VcpuHandle]) -> Result<(), u8> {
    for v in vcpus {
        v.control.pause.store(true, Ordering::Release);
    }
    let deadline = Instant::now() + PAUSE_TIMEOUT;
    for v in vcpus {
        loop {
            if v.thread.is_finished() || v.control.wait_parked(Duration::ZERO) {
                break;
            }
            let _ = v.thread.kill(kick_signal());
            if v.control.wait_parked(KICK_INTERVAL) {
                break;
            }
            if Instant::now() > deadline {
                return Err(v.index);
            }
        }
    }
    Ok(())
}

/// Lets every vCPU run again.
pub fn resume_all(vcpus: &[VcpuHandle]) {
    for v in vcpus {
        let _parked = devices::bus::lock(&v.control.parked);
        v.control.pause.store(false, Ordering::Release);
        v.control.changed.notify_all();
    }
}
