//! Raw mode for a terminal on stdin, so that a person typing reaches the guest's shell key by
//! key (Ctrl-C included); restored when the guard drops and by the panic hook.

use std::io::IsTerminal;

use vmm_sys_util::terminal::Terminal;

/// Puts stdin in raw mode while alive, if stdin is a terminal.
#[derive(Debug)]
pub struct RawMode {
    active: bool,
}

fn restore() {
    let _ = std::io::stdin().lock().set_canon_mode();
}

impl RawMode {
    pub fn enter() -> Self {
        // Called before the VMM thread's seccomp filter: isatty() is TIOCGWINSZ in musl.
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return RawMode { active: false };
        }
        let active = stdin.lock().set_raw_mode().is_ok();
        if active {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        }
        RawMode { active }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if self.active {
            restore();
        }
    }
}
