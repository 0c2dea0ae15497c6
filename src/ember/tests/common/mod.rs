//! Helpers for the integration tests: a scratch directory, a config writer, and a runner that
//! starts the real `ember` binary, waits for it with a deadline and returns what it printed.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod api;
pub mod containerd;
pub mod cri;
pub mod huge_pages;
pub mod linux;
pub mod netns;
pub mod shapes;
pub mod snapshot;
pub mod vsock;

pub const EMBER: &str = env!("CARGO_BIN_EXE_ember");

/// Prints the one SKIPPED line of a test that cannot run here. Written to stderr directly,
/// so that the test harness's output capture does not hide it.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}

/// Everything a child's piped output has left to read (empty if it was not piped).
pub fn read_all(pipe: Option<impl Read>) -> String {
    let mut text = String::new();
    if let Some(mut pipe) = pipe {
        pipe.read_to_string(&mut text).unwrap();
    }
    text
}

/// Runs `cmd` to its end and gives its standard output; panics with `what` and the
/// command's standard error if it fails.
pub fn output_of(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run it: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what}: {}: {stderr}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The running test's name: libtest runs each test on a thread named after it.
pub fn test_name() -> String {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("a test");
    name.rsplit("::").next().unwrap_or(name).to_string()
}

/// Every metrics line written so far, parsed.
pub fn metrics_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The sum over all lines of a counter (each line holds what changed since the last).
pub fn metric_sum(lines: &[serde_json::Value], section: &str, field: &str) -> u64 {
    lines
        .iter()
        .map(|l| l[section][field].as_u64().unwrap_or(0))
        .sum()
}

/// What follows `prefix` on each line of `text` that starts with it, in order.
pub fn after_prefix<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect()
}

/// The first line of `text` that contains `needle`, or a panic that shows `text`.
pub fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

/// Ends the test (after its SKIPPED line) on a host whose KVM cannot be opened.
#[macro_export]
macro_rules! require_kvm {
    () => {
        if !$crate::common::kvm_or_skip(&$crate::common::test_name()) {
            return;
        }
    };
}

/// A scratch directory named `tag` for a test that needs KVM; ends the test (after its
/// SKIPPED line) on a host whose KVM cannot be opened.
#[macro_export]
macro_rules! kvm_scratch {
    ($tag:expr) => {{
        $crate::require_kvm!();
        $crate::common::Scratch::new($tag)
    }};
}

/// The Linux guest's images for a test that boots Linux; ends the test (after its SKIPPED
/// line) where KVM or the images are missing.
#[macro_export]
macro_rules! linux_images {
    () => {
        match $crate::common::linux::linux_or_skip(&$crate::common::test_name()) {
            Some(images) => images,
            None => return,
        }
    };
}

/// What a `*_or_skip` helper found for this test (it is given the test's name and `args`),
/// or the end of the test, whose SKIPPED line the helper printed:
/// `let ns = or_skip!(NetNs::new_or_skip);`.
#[macro_export]
macro_rules! or_skip {
    ($helper:path $(, $arg:expr)*) => {
        match $helper(&$crate::common::test_name() $(, $arg)*) {
            Some(found) => found,
            None => return,
        }
    };
}

/// Which KVM this host has: `kvm_pvm`, `kvm_intel`, `kvm_amd`, or `KVM` when /sys does not
/// say (inside a jail).
pub fn host_kind() -> &'static str {
    ["kvm_pvm", "kvm_intel", "kvm_amd"]
        .into_iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
        .unwrap_or("KVM")
}

/// True if this host can run KVM guests, after printing which kind of host the test runs on;
/// otherwise prints the SKIPPED line.
pub fn kvm_or_skip(test: &str) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => {
            use std::io::Write;
            let pci = if all_on_pci() {
                ", all on virtio-pci"
            } else {
                ""
            };
            let _ = writeln!(std::io::stderr(), "{test}: on a {} host{pci}", host_kind());
            true
        }
        Err(e) => {
            skip(test, &format!("/dev/kvm cannot be opened ({e})"));
            false
        }
    }
}

/// A directory removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ember-test-{}-{name}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// Makes the FIFO `file` and returns its path.
    pub fn fifo(&self, file: &str) -> PathBuf {
        let p = self.path(file);
        mkfifo(&p);
        p
    }

    /// Writes `bytes` to `file` and returns its path as a string.
    pub fn file(&self, file: &str, bytes: &[u8]) -> String {
        let p = self.path(file);
        std::fs::write(&p, bytes).unwrap();
        p.to_string_lossy().into_owned()
    }
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status();
    assert!(
        made.as_ref().is_ok_and(|s| s.success()),
        "mkfifo {path:?}: {made:?}"
    );
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one ember run produced.
#[derive(Debug)]
pub struct Run {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// Fails the test, showing what ember printed, unless it exited with `status`.
    pub fn assert_status(&self, status: i32) {
        assert_eq!(
            self.status,
            Some(status),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }

    /// Fails the test unless ember refused to run (status 1) and said `text` on stderr.
    pub fn assert_refused(&self, text: &str) {
        assert_eq!(self.status, Some(1), "{}", self.stderr);
        assert!(self.stderr.contains(text), "{}", self.stderr);
    }

    /// The guest's report lines, without the "guest: " prefix.
    pub fn guest_lines(&self) -> Vec<&str> {
        after_prefix(&self.stdout, "guest: ")
    }

    /// The first guest line starting with `prefix`, or a panic showing everything printed.
    pub fn line(&self, prefix: &str) -> &str {
        self.guest_lines()
            .into_iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "no guest line {prefix:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                )
            })
    }

    /// The value of `key=` in the guest line starting with `prefix`.
    pub fn value(&self, prefix: &str, key: &str) -> String {
        let line = self.line(prefix);
        let pat = format!("{key}=");
        line.split(' ')
            .find_map(|w| w.strip_prefix(pat.as_str()))
            .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
            .to_string()
    }

    pub fn assert_clean_exit(&self) {
        assert_eq!(
            self.status,
            Some(0),
            "ember failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stdout.contains("guest: done") || self.stdout.contains("guest: hello"),
            "{}",
            self.stdout
        );
    }
}

/// `EMBER_TEST_PCI=1`: every ember the tests start gets `--enable-pci` and every Linux
/// guest's command line leaves `pci=off` out, so that the Linux tests run on virtio-pci
/// (docs/test-hosts.md). The tests written for PCI pass the flag themselves.
pub fn all_on_pci() -> bool {
    std::env::var("EMBER_TEST_PCI").as_deref() == Ok("1")
}

pub fn spawn(args: &[&str]) -> Child {
    Command::new(EMBER)
        .args(args)
        .args((all_on_pci() && !args.contains(&"--enable-pci")).then_some("--enable-pci"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ember")
}

/// Reads `from` until `text` has appeared, it ends, or `deadline` passes; returns what was
/// read and the stream, for `finish` to read the rest.
pub fn read_until<R: Read + Send + 'static>(
    mut from: R,
    text: &str,
    deadline: Duration,
) -> (String, R) {
    let text = text.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(text.as_bytes()) {
            match from.read(&mut byte) {
                Ok(1) => seen.push(byte[0]),
                _ => break,
            }
        }
        let _ = tx.send(());
        (String::from_utf8_lossy(&seen).into_owned(), from)
    });
    rx.recv_timeout(deadline)
        .unwrap_or_else(|_| panic!("nothing like the expected text within {deadline:?}"));
    reader.join().unwrap()
}

/// Waits for `child` (killing it after `deadline`) and collects its output.
pub fn finish(mut child: Child, started: Instant, deadline: Duration) -> Run {
    let mut status = None;
    while started.elapsed() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = started.elapsed();
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    Run {
        status: status.and_then(|s| s.code()),
        stdout,
        stderr,
        elapsed,
    }
}

/// Runs `ember --no-api --config-file <config>` with a 60 s deadline.
pub fn run_config(scratch: &Scratch, config: &serde_json::Value) -> Run {
    run_config_within(scratch, config, Duration::from_secs(60))
}

/// The same with another deadline (Linux guests on kvm_pvm hosts take tens of seconds).
pub fn run_config_within(scratch: &Scratch, config: &serde_json::Value, deadline: Duration) -> Run {
    let path = scratch.file("vm.json", config.to_string().as_bytes());
    run_args_within(&["--no-api", "--config-file", &path], deadline)
}

pub fn run_args(args: &[&str]) -> Run {
    run_args_within(args, Duration::from_secs(60))
}

pub fn run_args_within(args: &[&str], deadline: Duration) -> Run {
    let started = Instant::now();
    finish(spawn(args), started, deadline)
}

/// The 32-bit FNV-1a hash the test guest prints.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(16_777_619)
    })
}

/// Deterministic pseudo-random bytes.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// What Ember appends to the boot arguments of a microVM without `--enable-pci` on this
/// host: `pci=off`, as Firecracker does, and its PVM adaptations, if any.
pub fn host_args() -> String {
    if vmm::pvm::host_is_pvm() {
        format!(" pci=off {}", vmm::pvm::BOOT_ARGS)
    } else {
        " pci=off".to_string()
    }
}
