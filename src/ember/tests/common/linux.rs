//! The Linux guest's images (built by guest/build.sh), its usual configuration, and what
//! its init and the metrics say.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{kvm_or_skip, skip, Run};

pub const BASE_ARGS: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd";

/// How long a Linux guest may take to get somewhere: a boot takes under a second on
/// hardware virtualisation, seconds on the emulated kvm_amd host and up to a minute on
/// kvm_pvm, where the longest tests need minutes. Off kvm_pvm a stalled guest is given up on
/// sooner (docs/test-hosts.md).
pub fn linux_deadline() -> std::time::Duration {
    let secs = if vmm::pvm::host_is_pvm() { 600 } else { 240 };
    std::time::Duration::from_secs(secs)
}

pub struct Images {
    dir: PathBuf,
}

impl Images {
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

/// The directory a `guest/` script makes (cached by a hash of its inputs): `env` if set,
/// else what `guest/SCRIPT --dir` names; None after printing why the test cannot run, if it
/// is not built.
fn built(test: &str, env: &str, script: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(env) {
        Some(d) => PathBuf::from(d),
        None => {
            let path = format!("{}/../../guest/{script}", env!("CARGO_MANIFEST_DIR"));
            let out = std::process::Command::new(&path)
                .arg("--dir")
                .output()
                .unwrap_or_else(|e| panic!("run {path} --dir: {e}"));
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    if !dir.join("done").exists() {
        skip(
            test,
            &format!("{} is not built; run guest/{script}", dir.display()),
        );
        return None;
    }
    Some(dir)
}

/// The guest images, or None after printing why this test cannot run here.
pub fn linux_or_skip(test: &str) -> Option<Images> {
    if !kvm_or_skip(test) {
        return None;
    }
    built(test, "EMBER_GUEST_DIR", "build.sh").map(|dir| Images { dir })
}

/// Debian's stock cloud kernel and its initramfs (guest/stock-kernel.sh), or None after
/// printing why the test cannot run.
pub fn stock_kernel_or_skip(test: &str) -> Option<PathBuf> {
    built(test, "EMBER_STOCK_KERNEL_DIR", "stock-kernel.sh")
}

/// The lines the test command printed.
pub fn command_output(run: &Run) -> Vec<String> {
    command_lines(&run.stdout)
}

/// The non-empty lines between the init's command markers in `out`.
pub fn command_lines(out: &str) -> Vec<String> {
    let start = out.find("EMBER-CMD-BEGIN").expect("command ran") + "EMBER-CMD-BEGIN".len();
    let end = out.find("EMBER-CMD-END").expect("command ended");
    out[start..end]
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The fields after `key ` in `line`, as a number.
pub fn field(line: &str, key: &str) -> u64 {
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words.next().unwrap().parse().unwrap();
        }
    }
    panic!("no {key} in {line:?}");
}

/// Machine, boot source (with `cmd` for the guest's init) and the read-only root drive.
pub fn configure(c: &mut super::api::Client, img: &Images, vcpus: u8, mib: u32, cmd: &str) {
    configure_bus(c, img, vcpus, mib, cmd, super::all_on_pci());
}

/// The boot arguments of the tests' guests: [`BASE_ARGS`], without `pci=off` for an ember
/// with `--enable-pci`.
pub fn base_args(pci: bool) -> String {
    match pci {
        true => BASE_ARGS.replace(" pci=off", ""),
        false => BASE_ARGS.to_string(),
    }
}

/// [`configure`] for an ember with `--enable-pci` (`pci`) or without.
pub fn configure_bus(
    c: &mut super::api::Client,
    img: &Images,
    vcpus: u8,
    mib: u32,
    cmd: &str,
    pci: bool,
) {
    c.put_machine(vcpus, mib).expect(204, "");
    let args = base_args(pci);
    c.put(
        "/boot-source",
        &json!({"kernel_image_path": img.file("vmlinux"),
                "boot_args": format!("{args} ember_cmd=\"{cmd}\"")}),
    )
    .expect(204, "");
    c.put(
        "/drives/rootfs",
        &json!({"drive_id": "rootfs", "path_on_host": img.file("rootfs.ext4"),
                "is_root_device": true, "is_read_only": true}),
    )
    .expect(204, "");
}

/// Once the guest says `metrics-ready`: FlushMetrics, then the metrics lines written so
/// far and, after the guest has ended, its command's lines.
pub fn flush_and_finish(
    ember: &mut super::api::Ember,
    c: &mut super::api::Client,
    metrics: &std::path::Path,
) -> (Vec<Value>, Vec<String>) {
    ember.wait_for("\nmetrics-ready", linux_deadline());
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    let flushed = super::metrics_lines(metrics);
    ember.wait_clean_exit(linux_deadline());
    let lines = command_lines(&ember.stdout());
    eprintln!("{lines:#?}");
    (flushed, lines)
}

/// Polls `GET path` until `done` holds for its answer.
pub fn get_until(
    c: &mut super::api::Client,
    path: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let answer = c.get(path).expect(200, "").json();
        if done(&answer) {
            return answer;
        }
        assert!(started.elapsed() < linux_deadline(), "{what}: {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
