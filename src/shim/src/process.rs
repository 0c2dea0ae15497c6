//! A process the shim runs in the guest (a container's init or an exec): its state as
//! containerd asks for it, its exit (waited for by a thread of its own), and its streams,
//! copied between containerd's FIFOs and the agent's `stdio` connections.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, SystemTime};

use crate::agent::Agent;

/// How long the output of an exited process may take to drain before its exit is
/// reported anyway (a daemon it left behind may hold its pipe open for ever). Generous: on
/// a loaded kvm_pvm host the guest's last output can come seconds after its exit, and
/// reporting the exit first loses it (ctr closes its end).
const DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

/// Where containerd wants a process's streams (FIFO paths; empty: not wanted).
#[derive(Debug, Clone, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

#[derive(Debug)]
struct State {
    status: Status,
    pid: u32,
    exit_status: u32,
    exited_at: Option<SystemTime>,
}

#[derive(Debug)]
pub struct Process {
    pub id: String,
    pub exec_id: Option<String>,
    pub stdio: StdioPaths,
    state: Mutex<State>,
    exited: Condvar,
    /// The agent connection that carries the process's input, to close it on request.
    stdin: Mutex<Option<UnixStream>>,
    /// One message per output copier when it has finished.
    drained: Mutex<Option<Receiver<()>>>,
}

impl Process {
    pub fn new(id: &str, exec_id: Option<&str>, stdio: StdioPaths, pid: u32) -> Process {
        Process {
            id: id.to_string(),
            exec_id: exec_id.map(str::to_string),
            stdio,
            state: Mutex::new(State {
                status: Status::Created,
                pid,
                exit_status: 0,
                exited_at: None,
            }),
            exited: Condvar::new(),
            stdin: Mutex::new(None),
            drained: Mutex::new(None),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (status, pid, exit status, exit time)
    pub fn snapshot(&self) -> (Status, u32, u32, Option<SystemTime>) {
        let s = self.state();
        (s.status, s.pid, s.exit_status, s.exited_at)
    }

    pub fn started(&self, pid: u32) {
        let mut s = self.state();
        if s.status == Status::Created {
            s.status = Status::Running;
            s.pid = pid;
        }
    }

    /// Records the exit (once; later calls change nothing) and wakes the waiters.
    pub fn exit(&self, status: u32) -> bool {
        let mut s = self.state();
        if s.status == Status::Stopped {
            return false;
        }
        s.status = Status::Stopped;
        s.exit_status = status;
        s.exited_at = Some(SystemTime::now());
        self.exited.notify_all();
        true
    }

    /// Blocks until the process has exited: its status and time.
    pub fn wait(&self) -> (u32, SystemTime) {
        let mut s = self.state();
        while s.status != Status::Stopped {
            s = self.exited.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        (s.exit_status, s.exited_at.unwrap_or(SystemTime::UNIX_EPOCH))
    }

    /// Takes the process's streams from the agent and starts copying them, before the
    /// process starts (so that none of its output is missed).
    pub fn connect_stdio(&self, agent: &Agent) -> Result<(), crate::agent::Error> {
        let (done, drained) = channel();
        let exec = self.exec_id.as_deref();
        let outputs = [
            ("stdout", &self.stdio.stdout),
            ("stderr", &self.stdio.stderr),
        ];
        for (which, path) in outputs {
            if path.is_empty() || (self.stdio.terminal && which == "stderr") {
                continue;
            }
            let mut from = agent.stream(&self.id, exec, which)?;
            let path = fifo_path(path);
            let done = done.clone();
            std::thread::spawn(move || {
                // Opening a FIFO for writing waits for its reader (containerd's, or ctr's).
                match OpenOptions::new().write(true).open(&path) {
                    Ok(mut to) => copy_out(&mut from, &mut to),
                    Err(e) => log::warn!("cannot open {}: {e}", path.display()),
                }
                let _ = done.send(());
            });
        }
        *self.drained.lock().unwrap_or_else(|e| e.into_inner()) = Some(drained);
        if !self.stdio.stdin.is_empty() {
            let mut to = agent.stream(&self.id, exec, "stdin")?;
            let keep = to.try_clone().map_err(crate::agent::Error::Unreachable)?;
            *self.stdin.lock().unwrap_or_else(|e| e.into_inner()) = Some(keep);
            let path = fifo_path(&self.stdio.stdin);
            // Opened at once, without waiting for a writer: containerd's clients open their
            // end without blocking and give up if no reader is there.
            let from = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(crate::agent::Error::Unreachable)?;
            std::thread::spawn(move || {
                copy_fifo(&from, &mut to);
                // The host's input ended: so does the process's.
                let _ = to.shutdown(Shutdown::Write);
            });
        }
        Ok(())
    }

    /// Ends the process's input (`close_io`).
    pub fn close_stdin(&self) {
        if let Some(s) = self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(Shutdown::Write);
        }
    }

    /// Waits (bounded) until the output copiers have written everything the process wrote.
    fn drain(&self) {
        let Some(drained) = self
            .drained
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let deadline = std::time::Instant::now() + DRAIN;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match drained.recv_timeout(left) {
                Ok(()) => continue,
                // Every copier has finished (their senders are gone) or time is up.
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    log::warn!(
                        "{}: its output had not ended {DRAIN:?} after its exit; exit reported",
                        self.id
                    );
                    break;
                }
                Err(_) => break,
            }
        }
    }

    /// Waits in the guest for the exit (until the agent answers, or the VM is gone:
    /// status 255), lets the output drain, and records it. True if this call recorded it.
    pub fn watch(&self, agent: &Agent) -> bool {
        let request = serde_json::json!({"op": "wait", "id": self.id, "exec_id": self.exec_id});
        let status = match agent.call(request, None) {
            Ok(answer) => answer["exit_status"].as_u64().unwrap_or(255) as u32,
            Err(e) => {
                log::warn!("waiting for {} ended: {e}", self.id);
                255
            }
        };
        self.drain();
        self.exit(status)
    }
}

/// Copies a stream to its FIFO as its bytes come. (Not `std::io::copy`: it splices a
/// socket into a pipe, and splice(2) from a Unix socket holds small writes back.)
fn copy_out(from: &mut UnixStream, to: &mut File) {
    use std::io::Read;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Copies what writers put in the FIFO `from` (opened non-blocking) until the last writer
/// has gone. A FIFO that has not had a writer yet polls as neither readable nor hung up, so
/// the copy waits for the first one.
fn copy_fifo(from: &File, to: &mut UnixStream) {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let mut fd = libc::pollfd {
            fd: from.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let n = crate::sys::poll(std::slice::from_mut(&mut fd), -1);
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        match (&*from).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if fd.revents & libc::POLLHUP != 0 {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// containerd names FIFOs by path; a `file://` URI means a file.
fn fifo_path(uri: &str) -> PathBuf {
    PathBuf::from(uri.strip_prefix("file://").unwrap_or(uri))
}
