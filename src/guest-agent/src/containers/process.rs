//! One process of a container (its init or an exec): its pid, its state, and the host ends
//! of its standard streams (pipes, or a terminal's master side).

use std::fs::File;
use std::io::{Read, Write};
use std::sync::{Arc, Condvar, Mutex};

use super::protocol::{StateReply, Status, Stream};
use super::reaper;

/// The agent's ends of a process's standard streams.
#[derive(Default)]
pub struct Stdio {
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// With a terminal: its master side (stdin and stdout are clones of it).
    pub terminal: Option<File>,
}

pub struct Process {
    /// Whether the streams are in place (an exec gets them when it starts).
    ready: Mutex<bool>,
    filled: Condvar,
    pid: Mutex<u32>,
    status: Mutex<(Status, Option<i32>)>,
    exited: Condvar,
    stdin: Mutex<Option<File>>,
    stdout: Mutex<Option<File>>,
    stderr: Mutex<Option<File>>,
    terminal: Mutex<Option<File>>,
}

impl Process {
    /// A process whose streams come later ([`Process::set_stdio`]): a registered exec.
    pub fn pending() -> Arc<Process> {
        Arc::new(Process {
            ready: Mutex::new(false),
            filled: Condvar::new(),
            pid: Mutex::new(0),
            status: Mutex::new((Status::Created, None)),
            exited: Condvar::new(),
            stdin: Mutex::new(None),
            stdout: Mutex::new(None),
            stderr: Mutex::new(None),
            terminal: Mutex::new(None),
        })
    }

    /// Puts the streams in place; whoever waits for one gets it now.
    pub fn set_stdio(&self, stdio: Stdio) {
        *self.stdin.lock().unwrap_or_else(|e| e.into_inner()) = stdio.stdin;
        *self.stdout.lock().unwrap_or_else(|e| e.into_inner()) = stdio.stdout;
        *self.stderr.lock().unwrap_or_else(|e| e.into_inner()) = stdio.stderr;
        *self.terminal.lock().unwrap_or_else(|e| e.into_inner()) = stdio.terminal;
        *self.ready.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.filled.notify_all();
    }

    /// Waits until the streams are in place (or never will be: [`Process::set_stdio`] with
    /// none, when a registered exec is deleted or fails to start).
    fn wait_ready(&self) {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.filled.wait_while(ready, |r| !*r));
    }

    /// The process exists as `pid`: a thread records its exit.
    pub fn watch(self: &Arc<Self>, pid: u32, running: bool) {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        if running {
            self.set_running();
        }
        let me = self.clone();
        std::thread::spawn(move || {
            let code = reaper::wait(pid);
            let mut status = me.status.lock().unwrap_or_else(|e| e.into_inner());
            *status = (Status::Stopped, Some(code));
            me.exited.notify_all();
        });
    }

    pub fn set_running(&self) {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.0 == Status::Created {
            status.0 = Status::Running;
        }
    }

    pub fn pid(&self) -> u32 {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> StateReply {
        let (status, exit_status) = *self.status.lock().unwrap_or_else(|e| e.into_inner());
        StateReply {
            status,
            pid: self.pid(),
            exit_status,
        }
    }

    pub fn stopped(&self) -> bool {
        self.state().status == Status::Stopped
    }

    /// Waits for the exit; its status, to every caller.
    pub fn wait(&self) -> i32 {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let status = self
            .exited
            .wait_while(status, |s| s.0 != Status::Stopped)
            .unwrap_or_else(|e| e.into_inner());
        status.1.unwrap_or(-1)
    }

    pub fn signal(&self, signal: i32) -> Result<(), String> {
        if self.stopped() {
            return Err("the process has already exited".into());
        }
        let pid = self.pid() as libc::pid_t;
        super::sys::kill(pid, signal).map_err(|e| format!("kill: {e}"))?;
        Ok(())
    }

    fn has_terminal(&self) -> bool {
        self.terminal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub fn resize(&self, width: u16, height: u16) -> Result<(), String> {
        let terminal = self.terminal.lock().unwrap_or_else(|e| e.into_inner());
        let terminal = terminal.as_ref().ok_or("the process has no terminal")?;
        super::sys::set_window_size(terminal, width, height).map_err(|e| format!("resize: {e}"))?;
        Ok(())
    }

    /// Ends standard input: the pipe is closed; a terminal gets end-of-file (Ctrl-D).
    pub fn close_stdin(&self) {
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        let terminal = self.terminal.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(terminal), Some(_)) = (terminal.as_ref(), stdin.as_ref()) {
            let _ = (&*terminal).write_all(b"\x04");
        }
        *stdin = None;
    }

    /// Feeds what `from` (the host's stdin connection) sends to the process's standard input,
    /// until either ends; then the input ends too (for a pipe).
    pub fn feed_stdin(&self, mut from: impl Read) -> Result<(), String> {
        if self
            .stdin
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return Err("the process's stdin is closed".into());
        }
        let mut buf = vec![0u8; 32 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
            let Some(pipe) = stdin.as_mut() else { break };
            if pipe.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        if !self.has_terminal() {
            self.close_stdin();
        }
        Ok(())
    }

    /// Whether `stream` can still be given to a connection: true for one in place and not
    /// taken, and for every stream of a process whose streams are not in place yet.
    pub fn output_available(&self, stream: Stream) -> bool {
        if !*self.ready.lock().unwrap_or_else(|e| e.into_inner()) {
            return true;
        }
        let slot = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
            Stream::Stdin => &self.stdin,
        };
        slot.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The agent's end of the process's stdout or stderr, given to one connection only;
    /// waits until the streams are in place.
    pub fn take_output(&self, stream: Stream) -> Result<File, String> {
        self.wait_ready();
        let slot = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
            Stream::Stdin => return Err("stdin is fed, not drained".into()),
        };
        slot.lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| "the stream is already attached, or the process has none".into())
    }
}

/// Copies `from` to `conn` until `from` ends (a terminal's master reads EIO then), then ends
/// the connection's sending side.
pub fn copy_out(mut from: File, mut conn: File) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if conn.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    super::sys::shutdown_write(&conn);
}
