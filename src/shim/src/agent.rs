//! The guest agent's container service (protocol v1, docs/containers.md), reached through
//! the sandbox's vsock socket: one request per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The agent's vsock port (`ember-agent containers`' default).
pub const PORT: u32 = 1025;
/// How long an answer may take before the agent is taken for gone.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);
/// An answer line is small; the agent's longest is an error sentence.
const MAX_ANSWER: u64 = 64 << 10;
/// How long a connection the guest does not take up is tried again before the agent counts
/// as unreachable. Ember gives the guest 2 s to accept; a guest restored a moment ago (its
/// vsock transport reset still in flight) or starved of CPU (ten kvm_pvm guests on two
/// cores) has missed that. Only the connection is retried, never a request once sent.
const CONNECT_RETRY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the guest agent: {0}")]
    Unreachable(std::io::Error),
    /// Ember's answer to `CONNECT` was not `OK`: the guest refused or did not take the
    /// connection up in time.
    #[error("the guest agent did not take a connection to vsock port {PORT} up: {0}")]
    NotTakenUp(String),
    #[error("the guest agent did not answer: {0}")]
    NoAnswer(String),
    /// The agent's own sentence.
    #[error("{0}")]
    Refused(String),
}

#[derive(Debug, Clone)]
pub struct Agent {
    /// Ember's host side of the VM's vsock device.
    pub uds: PathBuf,
}

impl Agent {
    fn connect(&self, timeout: Option<Duration>) -> Result<UnixStream, Error> {
        let mut s = UnixStream::connect(&self.uds).map_err(Error::Unreachable)?;
        let first = timeout.map_or(ANSWER_TIMEOUT, |t| t.min(ANSWER_TIMEOUT));
        s.set_read_timeout(Some(first))
            .map_err(Error::Unreachable)?;
        s.write_all(format!("CONNECT {PORT}\n").as_bytes())
            .map_err(Error::Unreachable)?;
        let line = read_line(&mut s).map_err(Error::Unreachable)?;
        if !line.starts_with("OK ") {
            return Err(Error::NotTakenUp(match line.trim_end() {
                "" => "the guest refused it or did not answer in time".into(),
                other => format!("Ember answered {other:?}"),
            }));
        }
        s.set_read_timeout(timeout).map_err(Error::Unreachable)?;
        Ok(s)
    }

    /// [`Agent::connect`], tried again while the guest does not take the connection up
    /// (Ember's refusal line), for up to [`CONNECT_RETRY`].
    fn connect_patiently(&self, timeout: Option<Duration>) -> Result<UnixStream, Error> {
        let start = Instant::now();
        loop {
            match self.connect(timeout) {
                Err(Error::NotTakenUp(why)) if start.elapsed() < CONNECT_RETRY => {
                    log::debug!("the guest agent did not take a connection up ({why}); again");
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// Sends `request` (its `op` and fields) and returns what the agent answered `ok` with.
    /// `timeout` bounds the wait for the answer (`None`: a `wait` for a process's exit).
    pub fn call(&self, request: Value, timeout: Option<Duration>) -> Result<Value, Error> {
        let mut s = self.connect_patiently(timeout)?;
        send(&mut s, request)
    }

    /// The same, bounded: a request takes milliseconds on hardware virtualisation, but a
    /// `create` (mounts, crun) on a loaded kvm_pvm host, where the guest kernel's every
    /// instruction is emulated, has taken over a minute.
    pub fn ask(&self, request: Value) -> Result<Value, Error> {
        self.call(request, Some(ANSWER_TIMEOUT))
    }

    /// Whether the agent answers a `ping` within `timeout`: a connection the guest never
    /// takes up (as once right after a restore) is given up on and the next one tried.
    pub fn answers(&self, timeout: Duration) -> bool {
        self.connect(Some(timeout))
            .and_then(|mut s| send(&mut s, json!({"op": "ping"})))
            .is_ok()
    }

    /// A process's stream (`stdin`, `stdout`, `stderr`): the connection after the agent's
    /// `ok`.
    pub fn stream(
        &self,
        id: &str,
        exec_id: Option<&str>,
        which: &str,
    ) -> Result<UnixStream, Error> {
        let mut s = self.connect_patiently(Some(ANSWER_TIMEOUT))?;
        let request = json!({"op": "stdio", "id": id, "exec_id": exec_id, "stream": which});
        send(&mut s, request)?;
        s.set_read_timeout(None).map_err(Error::Unreachable)?;
        Ok(s)
    }
}

/// Writes `request` (as version 1) on a connection and reads the answer; what follows the
/// answer line (a stream) stays unread on `s`.
fn send(s: &mut UnixStream, mut request: Value) -> Result<Value, Error> {
    request["v"] = json!(1);
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(|e| Error::NoAnswer(e.to_string()))?;
    answer(s)
}

fn answer(s: &mut UnixStream) -> Result<Value, Error> {
    let line = read_line(s).map_err(|e| Error::NoAnswer(e.to_string()))?;
    if line.is_empty() {
        return Err(Error::NoAnswer("the connection ended".into()));
    }
    let mut value: Value = serde_json::from_str(line.trim_end())
        .map_err(|e| Error::NoAnswer(format!("an answer that is not JSON ({e})")))?;
    if let Some(ok) = value.get_mut("ok") {
        return Ok(ok.take());
    }
    let sentence = value["error"]
        .as_str()
        .unwrap_or("an answer without ok or error");
    Err(Error::Refused(sentence.to_string()))
}

/// One line, byte by byte, so that nothing after it (a stream's first bytes) is consumed.
fn read_line(s: &mut UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut reader = BufReader::with_capacity(1, s).take(MAX_ANSWER);
    reader.read_until(b'\n', &mut line)?;
    Ok(String::from_utf8_lossy(&line).into_owned())
}
