//! A small HTTP-over-Unix-socket client for Ember's API, and an `ember --api-sock` process
//! whose output is collected while it runs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Scratch, EMBER};

/// One HTTP response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    /// The fault message of an error response (panics on anything else).
    pub fn fault(&self) -> String {
        self.json()["fault_message"]
            .as_str()
            .unwrap_or_else(|| panic!("no fault_message in {:?}", self.body))
            .to_string()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts the status, and that an error carries Firecracker's fault message containing
    /// `text`; returns the reply for more checks.
    pub fn expect(self, status: u16, text: &str) -> Reply {
        assert_eq!(self.status, status, "{self:?}");
        if status >= 400 {
            let fault = self.fault();
            assert!(fault.contains(text), "{fault:?} should contain {text:?}");
        } else if status == 204 {
            assert!(self.body.is_empty(), "204 with a body: {self:?}");
        }
        self
    }
}

/// One connection to the API socket.
pub struct Client {
    pub stream: UnixStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let stream = UnixStream::connect(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    pub fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Reply {
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        self.send_raw(&bytes);
        self.reply().expect("a response")
    }

    pub fn get(&mut self, path: &str) -> Reply {
        self.request("GET", path, None)
    }

    /// A request with a JSON body.
    pub fn call(&mut self, method: &str, path: &str, body: &serde_json::Value) -> Reply {
        self.request(method, path, Some(&body.to_string()))
    }

    pub fn put(&mut self, path: &str, body: &serde_json::Value) -> Reply {
        self.call("PUT", path, body)
    }

    pub fn patch(&mut self, path: &str, body: &serde_json::Value) -> Reply {
        self.call("PATCH", path, body)
    }

    /// `PUT /machine-config` with a vCPU count and a memory size.
    pub fn put_machine(&mut self, vcpus: u8, mib: u32) -> Reply {
        let body = serde_json::json!({"vcpu_count": vcpus, "mem_size_mib": mib});
        self.put("/machine-config", &body)
    }

    /// Configures a whole microVM: machine, boot source and drives (id, path, is_root),
    /// each answered 204.
    pub fn configure(
        &mut self,
        machine: &serde_json::Value,
        boot: &serde_json::Value,
        drives: &[(&str, &str, bool)],
    ) {
        self.put("/machine-config", machine).expect(204, "");
        self.put("/boot-source", boot).expect(204, "");
        for (id, path, root) in drives {
            let body =
                serde_json::json!({"drive_id": id, "path_on_host": path, "is_root_device": root});
            self.put(&format!("/drives/{id}"), &body).expect(204, "");
        }
    }

    /// `eth0` on the TAP `tap0`, with the MMDS reachable through it.
    pub fn put_eth0_with_mmds(&mut self) {
        self.put(
            "/network-interfaces/eth0",
            &serde_json::json!({"iface_id": "eth0", "host_dev_name": "tap0"}),
        )
        .expect(204, "");
        self.put(
            "/mmds/config",
            &serde_json::json!({"network_interfaces": ["eth0"]}),
        )
        .expect(204, "");
    }

    pub fn instance_start(&mut self) {
        self.put(
            "/actions",
            &serde_json::json!({"action_type": "InstanceStart"}),
        )
        .expect(204, "");
    }

    /// Reads one response; None if the server closed the connection first.
    pub fn reply(&mut self) -> Option<Reply> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = String::from_utf8(self.buf[..end].to_vec()).unwrap();
                let mut lines = head.split("\r\n");
                let status = lines.next().unwrap().split(' ').nth(1).unwrap();
                let headers: Vec<(String, String)> = lines
                    .map(|l| {
                        let (n, v) = l.split_once(':').unwrap();
                        (n.trim().to_string(), v.trim().to_string())
                    })
                    .collect();
                let len: usize = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, v)| v.parse().unwrap());
                if self.buf.len() >= end + 4 + len {
                    let body =
                        String::from_utf8(self.buf[end + 4..end + 4 + len].to_vec()).unwrap();
                    self.buf.drain(..end + 4 + len);
                    return Some(Reply {
                        status: status.parse().unwrap(),
                        headers,
                        body,
                    });
                }
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// True if the server has closed this connection (reads end of stream).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A running `ember --api-sock`; killed when dropped.
pub struct Ember {
    pub child: Child,
    pub sock: PathBuf,
    stdout: Arc<Mutex<String>>,
    /// Set once stdout has ended (ember exited): nothing more can come.
    stdout_ended: Arc<AtomicBool>,
    stderr: Arc<Mutex<String>>,
    /// The scratch directory of [`Ember::in_scratch`]: dropped after the ember is killed.
    own_dir: Option<Scratch>,
}

/// Gathers what `from` gives, on a thread; the flag is set at its end.
fn collect(mut from: impl Read + Send + 'static) -> (Arc<Mutex<String>>, Arc<AtomicBool>) {
    let text = Arc::new(Mutex::new(String::new()));
    let ended = Arc::new(AtomicBool::new(false));
    let (sink, done) = (text.clone(), ended.clone());
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = from.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
        done.store(true, Ordering::SeqCst);
    });
    (text, ended)
}

impl Ember {
    /// Starts ember with its socket in `scratch` and `extra` arguments, and waits (up to 5 s)
    /// for the socket to appear.
    pub fn start(scratch: &Scratch, extra: &[&str]) -> Ember {
        Ember::start_in(scratch, extra, None)
    }

    /// An ember with no arguments whose socket is in its own scratch directory tagged `tag`,
    /// removed with it: for tests that need no other file.
    pub fn in_scratch(tag: &str) -> Ember {
        let dir = Scratch::new(tag);
        let mut ember = Ember::start(&dir, &[]);
        ember.own_dir = Some(dir);
        ember
    }

    /// [`Ember::start`] inside network namespace `netns` (as the jailer's `--netns` would).
    pub fn start_in(scratch: &Scratch, extra: &[&str], netns: Option<&str>) -> Ember {
        let sock = scratch.path("api.sock");
        let mut command = match netns {
            None => Command::new(EMBER),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, EMBER]);
                c
            }
        };
        command.arg("--api-sock").arg(&sock).args(extra);
        Ember::spawn(command, sock)
    }

    /// Runs `command` (ember, or something that execs it) and waits (up to 5 s) for its API
    /// socket to appear at `sock`.
    pub fn spawn(mut command: Command, sock: PathBuf) -> Ember {
        if super::all_on_pci() && !command.get_args().any(|a| a == "--enable-pci") {
            command.arg("--enable-pci");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ember");
        let (stdout, stdout_ended) = collect(child.stdout.take().unwrap());
        let (stderr, _) = collect(child.stderr.take().unwrap());
        let ember = Ember {
            child,
            sock,
            stdout,
            stdout_ended,
            stderr,
            own_dir: None,
        };
        let started = Instant::now();
        while !ember.sock.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no API socket; stderr: {}",
                ember.stderr()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        ember
    }

    /// How many `tick N` lines the test guest (`ticks` mode) has printed so far.
    pub fn ticks(&self) -> usize {
        self.guest_lines()
            .iter()
            .filter(|l| l.starts_with("tick "))
            .count()
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.sock)
    }

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The guest's report lines so far, without the "guest: " prefix.
    pub fn guest_lines(&self) -> Vec<String> {
        super::after_prefix(&self.stdout(), "guest: ")
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// Waits until stdout contains `text`; panics with the output's end after `deadline`, or
    /// as soon as stdout has ended without it (ember exited: say, the guest reset).
    pub fn wait_for(&self, text: &str, deadline: Duration) {
        let started = Instant::now();
        while !self.stdout().contains(text) {
            let ended = self.stdout_ended.load(Ordering::SeqCst);
            assert!(
                !ended || self.stdout().contains(text),
                "ember's output ended before {text:?}\nstdout's last lines:\n{}\nstderr:\n{}",
                last_lines(&self.stdout(), 40),
                self.stderr()
            );
            assert!(
                started.elapsed() < deadline,
                "no {text:?} in {deadline:?}\nstdout's last lines:\n{}\nstderr:\n{}",
                last_lines(&self.stdout(), 40),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for ember to exit; its status, or None after `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    /// Waits for ember to exit with status 0; panics with its output otherwise.
    pub fn wait_clean_exit(&mut self, deadline: Duration) {
        let status = self.wait_exit(deadline);
        assert_eq!(status, Some(0), "{}", self.stdout());
    }

    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid; it cannot affect memory.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.wait_exit(Duration::from_secs(10))
    }

    /// Lowers ember's descriptor limit to the number it has open now plus `headroom`.
    /// Counting first keeps the test independent of what descriptors the test runner
    /// leaves open for its children.
    pub fn limit_open_files(&self, headroom: u64) -> u64 {
        let open = std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count() as u64;
        // The limit is on descriptor numbers, so count from the highest one in use.
        let highest = std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let limit = highest.max(open) + 1 + headroom;
        let new = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit,
        };
        // SAFETY: prlimit reads `new` (a valid rlimit) and writes nothing, since the old-limit
        // pointer is null; the pid is our own child.
        let rc = unsafe {
            libc::prlimit(
                self.child.id() as libc::pid_t,
                libc::RLIMIT_NOFILE,
                &new,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
        limit
    }

    /// CPU time (user + system) ember has used, in milliseconds.
    pub fn cpu_ms(&self) -> u64 {
        cpu_ms_of(&format!("/proc/{}/stat", self.child.id()))
    }

    /// CPU time of ember's VMM thread (the main thread: the event loop and the devices).
    pub fn vmm_thread_cpu_ms(&self) -> u64 {
        let pid = self.child.id();
        cpu_ms_of(&format!("/proc/{pid}/task/{pid}/stat"))
    }

    /// ember's resident memory in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    }
}

/// User + system time, in milliseconds, from a `/proc/.../stat` file.
fn cpu_ms_of(stat: &str) -> u64 {
    let stat = std::fs::read_to_string(stat).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system; no memory is involved.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1000 / hz
}

impl Drop for Ember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `text`: where a stalled guest stopped, which a report that cuts
/// long output would lose if the whole boot log came first.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
