//! Pausing and resuming vCPUs from the VMM thread (`PATCH /vm`). A paused vCPU thread waits on
//! a condition variable outside KVM_RUN; to get it there, the VMM thread raises the pause flag
//! and kicks the thread with a signal, which makes KVM_RUN return EINTR. A parked thread also
//! captures its vCPU's state when the VMM thread asks (a snapshot): only it holds the vCPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use crate::snapshot::state::VcpuState;

/// How long a pause may take before it is reported as failed. A vCPU leaves KVM_RUN within
/// microseconds of a signal; this bound only matters if a vCPU thread is stuck in a device.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an unresponsive vCPU is kicked again: a kick that lands just before the thread
/// enters KVM_RUN is lost, so one is not enough.
const KICK_INTERVAL: Duration = Duration::from_millis(1);

/// How long a parked vCPU thread may take to capture its state.
const SAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the VMM thread asked a parked vCPU thread to do, and its answer.
#[derive(Debug, Default)]
enum Request {
    #[default]
    None,
    Save,
    Saved(Result<Box<VcpuState>, String>),
}

/// Whether the vCPU thread is parked, and the request for it.
#[derive(Debug, Default)]
struct Parking {
    parked: bool,
    request: Request,
}

/// Shared by a vCPU thread and the VMM thread.
#[derive(Debug, Default)]
pub struct VcpuControl {
    pause: AtomicBool,
    /// Guarded so that wake-ups are never lost.
    parking: Mutex<Parking>,
    changed: Condvar,
}

impl VcpuControl {
    /// Called by the vCPU thread between KVM_RUN calls: parks it while a pause is asked for,
    /// and answers save requests with `save` meanwhile.
    pub fn park_if_paused(&self, mut save: impl FnMut() -> Result<VcpuState, String>) {
        if !self.pause.load(Ordering::Acquire) {
            return;
        }
        let mut parking = devices::bus::lock(&self.parking);
        parking.parked = true;
        self.changed.notify_all();
        while self.pause.load(Ordering::Acquire) {
            if matches!(parking.request, Request::Save) {
                parking.request = Request::Saved(save().map(Box::new));
                self.changed.notify_all();
            }
            parking = self
                .changed
                .wait(parking)
                .unwrap_or_else(|poison| poison.into_inner());
        }
        parking.parked = false;
        self.changed.notify_all();
    }

    /// Asks the vCPU thread, not started yet, to park before it first runs (a restored
    /// microVM that the API resumes later).
    pub fn hold(&self) {
        self.pause.store(true, Ordering::Release);
    }

    /// Waits up to `timeout` for the vCPU thread to park; true if it has.
    fn wait_parked(&self, timeout: Duration) -> bool {
        let parking = devices::bus::lock(&self.parking);
        let (parking, _) = self
            .changed
            .wait_timeout_while(parking, timeout, |p| !p.parked)
            .unwrap_or_else(|poison| poison.into_inner());
        parking.parked
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

/// Has every vCPU thread (all paused) capture its vCPU's state, in vCPU order.
pub fn save_all(vcpus: &[VcpuHandle]) -> Result<Vec<VcpuState>, String> {
    for v in vcpus {
        devices::bus::lock(&v.control.parking).request = Request::Save;
        v.control.changed.notify_all();
    }
    let mut states = Vec::new();
    for v in vcpus {
        let parking = devices::bus::lock(&v.control.parking);
        let (mut parking, _) = v
            .control
            .changed
            .wait_timeout_while(parking, SAVE_TIMEOUT, |p| {
                matches!(p.request, Request::Save)
            })
            .unwrap_or_else(|poison| poison.into_inner());
        match std::mem::take(&mut parking.request) {
            Request::Saved(Ok(state)) => states.push(*state),
            Request::Saved(Err(e)) => return Err(format!("vCPU {}: {e}", v.index)),
            _ => return Err(format!("vCPU {} did not save its state in time", v.index)),
        }
    }
    Ok(states)
}

/// Lets every vCPU run again.
pub fn resume_all(vcpus: &[VcpuHandle]) {
    for v in vcpus {
        let _parking = devices::bus::lock(&v.control.parking);
        v.control.pause.store(false, Ordering::Release);
        v.control.changed.notify_all();
    }
}
