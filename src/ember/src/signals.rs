//! Signals. SIGTERM and SIGINT end the VM cleanly: the handler only records the signal in the
//! VM's exit signal (an atomic store and an eventfd write, both async-signal-safe), and the
//! VMM thread does the rest on its own stack. The fatal ones end ember at once with
//! Firecracker's status for each, so that a supervisor reads the same cause: a system call
//! the seccomp filters trap (SIGSYS) 148, SIGBUS 149, SIGSEGV 150, SIGXFSZ 151, SIGXCPU 154,
//! SIGHUP 156, SIGILL 157. SIGPIPE stays ignored (a closed peer is an error return instead).

use std::sync::{Arc, OnceLock};

use vmm::ExitSignal;

static EXIT: OnceLock<Arc<ExitSignal>> = OnceLock::new();

/// Firecracker's exit statuses (its `FcExitCode`).
pub mod status {
    /// Any other failure.
    pub const ERROR: i32 = 1;
    /// A system call the seccomp filters do not allow.
    pub const BAD_SYSCALL: i32 = 148;
    /// An invalid `--level`.
    pub const BAD_CONFIGURATION: i32 = 152;
    /// The command line cannot be parsed.
    pub const ARG_PARSING: i32 = 153;
}

/// Each fatal signal, its status and the word the message names it by.
const FATAL: [(libc::c_int, i32, &str); 7] = [
    (libc::SIGSYS, status::BAD_SYSCALL, "a bad system call"),
    (libc::SIGBUS, 149, "SIGBUS"),
    (libc::SIGSEGV, 150, "SIGSEGV"),
    (libc::SIGXFSZ, 151, "SIGXFSZ"),
    (libc::SIGXCPU, 154, "SIGXCPU"),
    (libc::SIGHUP, 156, "SIGHUP"),
    (libc::SIGILL, 157, "SIGILL"),
];

extern "C" fn on_signal(signum: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    if let Some(exit) = EXIT.get() {
        exit.report_signal(signum);
    }
}

/// Writes one line to stderr and exits with the signal's status: only write(2) and
/// exit_group(2), which every filter allows, and no allocation or lock.
extern "C" fn on_fatal_signal(
    signum: libc::c_int,
    info: *mut libc::siginfo_t,
    _: *mut libc::c_void,
) {
    let Some(&(_, status, name)) = FATAL.iter().find(|(s, _, _)| *s == signum) else {
        return;
    };
    let mut line = Line::default();
    line.push(b"ember: shutting down after intercepting ");
    line.push(name.as_bytes());
    if signum == libc::SIGSYS && !info.is_null() {
        // SAFETY: the kernel passed a valid siginfo_t for this SIGSYS (SA_SIGINFO).
        let syscall = unsafe { sigsys_number(info) };
        line.push(b" (system call ");
        line.push_number(syscall);
        line.push(b")");
    }
    line.push(b"\n");
    // SAFETY: writes bytes of a live stack buffer, then ends the process; both are
    // async-signal-safe.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(status);
    }
}

/// The system call number of a seccomp SIGSYS: the `_sigsys` member of the siginfo union
/// holds the call's address (8 bytes) and then the number, after the three ints of the
/// header and their padding, so at int offset 6.
///
/// # Safety
/// `info` must point to a valid `siginfo_t`.
unsafe fn sigsys_number(info: *const libc::siginfo_t) -> u64 {
    // SAFETY: siginfo_t is 128 bytes, so the 7th int is inside it; the caller vouches for
    // the pointer.
    let n = unsafe { *info.cast::<i32>().add(6) };
    u64::from(n.unsigned_abs())
}

/// A fixed buffer a signal handler can format into.
struct Line {
    bytes: [u8; 128],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            bytes: [0; 128],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, text: &[u8]) {
        let n = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&text[..n]);
        self.len += n;
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

fn register(
    signum: libc::c_int,
    handler: vmm_sys_util::signal::SignalHandler,
) -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(signum, handler)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

/// The fatal signals' handlers: first thing in `run`, before any thread or filter exists,
/// so that no system call a filter traps can end ember without its status and line.
pub fn install_fatal() -> std::io::Result<()> {
    for (signum, _, _) in FATAL {
        register(signum, on_fatal_signal)?;
    }
    Ok(())
}

/// SIGTERM and SIGINT, once there is a VM exit signal to give them to.
pub fn install(exit: Arc<ExitSignal>) -> std::io::Result<()> {
    let _ = EXIT.set(exit);
    for signum in [libc::SIGTERM, libc::SIGINT] {
        register(signum, on_signal)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_format_numbers_and_stop_at_their_end() {
        let mut line = Line::default();
        line.push(b"call ");
        line.push_number(0);
        line.push(b" ");
        line.push_number(18446744073709551615);
        assert_eq!(&line.bytes[..line.len], b"call 0 18446744073709551615");
        line.push(&[b'x'; 200]);
        assert_eq!(line.len, 128);
    }
}
