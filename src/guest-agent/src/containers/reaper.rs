//! The agent is the child subreaper of everything it starts: the OCI runtime's short-lived
//! commands and the containers' processes, which the runtime leaves behind when it exits. One
//! thread reaps every child and records its exit status; a caller waits for its pid here
//! (never with `waitpid` of its own, which would race that thread).

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, OnceLock};

/// Exits nobody asked for yet (orphans of the containers' processes included) are kept up to
/// this many, the oldest dropped first.
const KEPT: usize = 4096;

#[derive(Default)]
struct Exits {
    status: HashMap<u32, i32>,
    order: VecDeque<u32>,
}

struct Reaper {
    exits: Mutex<Exits>,
    changed: Condvar,
    /// Children started so far: the reaping thread sleeps on it while it has none.
    spawns: Mutex<u64>,
    spawned: Condvar,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| Reaper {
        exits: Mutex::new(Exits::default()),
        changed: Condvar::new(),
        spawns: Mutex::new(0),
        spawned: Condvar::new(),
    })
}

/// Makes this process the subreaper and starts the reaping thread.
pub fn start() -> std::io::Result<()> {
    super::sys::become_subreaper()?;
    let r = reaper();
    std::thread::spawn(move || loop {
        let seen = *r.spawns.lock().unwrap_or_else(|e| e.into_inner());
        let Some((pid, status)) = super::sys::wait_any() else {
            // No children (ECHILD): sleep until one is started.
            let spawns = r.spawns.lock().unwrap_or_else(|e| e.into_inner());
            drop(r.spawned.wait_while(spawns, |n| *n == seen));
            continue;
        };
        let code = exit_code(status);
        let mut exits = r.exits.lock().unwrap_or_else(|e| e.into_inner());
        exits.status.insert(pid as u32, code);
        exits.order.push_back(pid as u32);
        while exits.order.len() > KEPT {
            if let Some(old) = exits.order.pop_front() {
                exits.status.remove(&old);
            }
        }
        r.changed.notify_all();
    });
    Ok(())
}

/// A wait status as a shell shows it: the exit code, or 128 + the signal.
fn exit_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// Tells the reaping thread that a child was started.
pub fn spawned() {
    let r = reaper();
    *r.spawns.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    r.spawned.notify_all();
}

/// Waits for `pid` to exit; its status (consumed: a second wait would block).
pub fn wait(pid: u32) -> i32 {
    let r = reaper();
    let mut exits = r.exits.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(code) = exits.status.remove(&pid) {
            exits.order.retain(|&p| p != pid);
            return code;
        }
        exits = r.changed.wait(exits).unwrap_or_else(|e| e.into_inner());
    }
}
