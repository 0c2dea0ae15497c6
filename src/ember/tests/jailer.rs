//! The jailer end to end: static ember and jailer (scripts/build-static), a jail under a
//! scratch chroot base, uid and gid 1234, a pids cgroup; the test guest boots through the
//! API socket inside the jail, and the process is checked from the host's side (/proc):
//! its ids, its root, its mounts, its namespaces, its cgroup, its seccomp filters. Then bad
//! input, a jail left by a killed run, and the Linux guest on a TAP in the `--netns`
//! namespace.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::api::Ember;
use common::linux::*;
use common::netns::NetNs;
use common::*;
use serde_json::json;

const ID: u32 = 1234;
const BOOT: Duration = Duration::from_secs(30);

/// The directory holding static `ember` and `jailer`: `EMBER_STATIC_DIR` when scripts/test
/// built them already (it does before running the tests on an emulated host, where a cargo
/// build would crawl), else built once per test binary.
fn static_bins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("EMBER_STATIC_DIR") {
            return PathBuf::from(dir);
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/build-static");
        let out = output_of(&mut Command::new(script), "scripts/build-static");
        PathBuf::from(out.trim())
    })
}

/// A jail base, the id's jail and its cgroup; all removed when dropped (after killing
/// whatever still runs in the jail).
struct JailFixture {
    base: Scratch,
    id: String,
}

impl JailFixture {
    fn new(name: &str) -> Self {
        JailFixture {
            base: Scratch::new(name),
            id: format!("{name}-{}", std::process::id()),
        }
    }

    fn root(&self) -> PathBuf {
        self.base.path(&format!("ember/{}/root", self.id))
    }

    fn cgroup(&self) -> PathBuf {
        PathBuf::from(format!("/sys/fs/cgroup/pids/ember/{}", self.id))
    }

    /// The microVM's cgroup with `--cgroup-version 2` (this machine's cgroup2 mount).
    fn cgroup_v2(&self) -> PathBuf {
        PathBuf::from(format!("/sys/fs/cgroup/unified/ember/{}", self.id))
    }

    /// The jailer's command line with `extra` jailer flags and `vmm` arguments.
    fn command(&self, extra: &[&str], vmm: &[&str]) -> Command {
        let bins = static_bins();
        let mut c = Command::new(bins.join("jailer"));
        c.args(["--id", &self.id, "--exec-file"])
            .arg(bins.join("ember"))
            .args([
                "--uid",
                &ID.to_string(),
                "--gid",
                &ID.to_string(),
                "--chroot-base-dir",
            ])
            .arg(&self.base.0)
            .args(extra)
            .arg("--")
            .args(vmm);
        c
    }

    /// The pid the jailer recorded.
    fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.root().join("ember.pid")).unwrap_or_default();
        text.trim().parse().unwrap_or(0)
    }

    /// Puts `from` into the jail as `name`, owned by the jailed user.
    fn give(&self, from: &str, name: &str) -> String {
        let to = self.root().join(name);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).unwrap();
        }
        std::os::unix::fs::chown(&to, Some(ID), Some(ID)).unwrap();
        format!("/{name}")
    }
}

impl Drop for JailFixture {
    fn drop(&mut self) {
        let pid = self.pid();
        if pid > 0 && Path::new(&format!("/proc/{pid}")).exists() {
            // SAFETY: kill(2) on the jailed ember's pid; it cannot affect our memory.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = std::fs::remove_dir(self.cgroup());
        let _ = std::fs::remove_dir(self.cgroup_v2());
    }
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn wait_gone(pid: u32, deadline: Duration) {
    let started = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(started.elapsed() < deadline, "process {pid} still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Boots the test guest in a jail (with `--new-pid-ns` if `pid_ns`) and checks the process
/// from outside while the guest prints ticks.
fn boot_in_jail(name: &str, pid_ns: bool) {
    if !kvm_or_skip(name) {
        return;
    }
    let jail = JailFixture::new(name);
    let mut extra = vec!["--cgroup", "pids.max=64"];
    extra.extend([
        "--resource-limit",
        "no-file=1000",
        "--resource-limit",
        "fsize=1048576",
    ]);
    if pid_ns {
        extra.push("--new-pid-ns");
    }
    let mut command = jail.command(&extra, &["--api-sock", "/run/ember.socket"]);
    // A descriptor the jailer's parent leaks (number 50, no close-on-exec) must not reach
    // ember.
    let leaked = std::fs::File::open("/etc/hostname").unwrap();
    let leaked_fd = std::os::fd::AsRawFd::as_raw_fd(&leaked);
    // SAFETY: the closure runs in the forked child before exec and only calls dup2, which
    // is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            match libc::dup2(leaked_fd, 50) {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            }
        });
    }
    let mut ember = Ember::spawn(command, jail.root().join("run/ember.socket"));
    let pid = jail.pid();
    assert!(pid > 0, "no pid file; stderr: {}", ember.stderr());
    if !pid_ns {
        assert_eq!(pid, ember.child.id(), "the jailer execs ember in place");
    }

    let kernel = jail.give(test_guest::PVH_ELF, "kernel.elf");
    let data = jail.root().join("data.img");
    std::fs::write(&data, vec![0u8; 128 << 10]).unwrap();
    std::os::unix::fs::chown(&data, Some(ID), Some(ID)).unwrap();
    let mut c = ember.client();
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 64}),
        &json!({"kernel_image_path": kernel, "boot_args": "ticks"}),
        &[("data", "/data.img", false)],
    );
    // A path outside the jail does not exist for the jailed ember.
    c.put(
        "/drives/host",
        &json!({"drive_id": "host", "path_on_host": data, "is_root_device": false}),
    )
    .expect(400, "");
    c.instance_start();
    ember.wait_for("guest: tick 2", BOOT);

    // Who it is, where its root is, what it can see.
    assert_eq!(status_field(pid, "Uid:"), "1234 1234 1234 1234");
    assert_eq!(status_field(pid, "Gid:"), "1234 1234 1234 1234");
    assert_eq!(status_field(pid, "Groups:"), "");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let limit = |name: &str| {
        let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .rev()
            .skip(1)
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(limit("Max open files"), "1000 1000", "{limits}");
    assert_eq!(limit("Max file size"), "1048576 1048576", "{limits}");
    assert!(
        std::fs::read_link(format!("/proc/{pid}/fd/50")).is_err(),
        "an inherited descriptor reached ember"
    );
    drop(leaked);
    let mut visible: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    visible.sort();
    assert_eq!(
        visible,
        ["data.img", "dev", "ember", "ember.pid", "kernel.elf", "run"]
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    assert_eq!(
        mounts.lines().count(),
        1,
        "only the jail is mounted: {mounts}"
    );
    assert_eq!(mounts.split_whitespace().nth(4), Some("/"), "{mounts}");
    let ns = |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    assert_ne!(ns(&pid.to_string(), "mnt"), ns("self", "mnt"));
    match pid_ns {
        true => {
            assert_ne!(ns(&pid.to_string(), "pid"), ns("self", "pid"));
            assert_eq!(
                status_field(pid, "NSpid:"),
                format!("{pid} 1"),
                "pid 1 inside"
            );
        }
        false => assert_eq!(ns(&pid.to_string(), "pid"), ns("self", "pid")),
    }
    // The cgroup, its value, and every thread in it (and under its filter).
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups
            .lines()
            .any(|l| l.ends_with(&format!(":pids:/ember/{}", jail.id))),
        "{cgroups}"
    );
    let max = std::fs::read_to_string(jail.cgroup().join("pids.max")).unwrap();
    assert_eq!(max.trim(), "64");
    let tasks = std::fs::read_to_string(jail.cgroup().join("tasks")).unwrap();
    let mut names = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap();
        let tid = task.file_name().to_string_lossy().into_owned();
        assert!(
            tasks.lines().any(|t| t == tid),
            "thread {tid} is in the cgroup: {tasks}"
        );
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        assert!(status.contains("Seccomp:\t2"), "{status}");
        names.push(status.lines().next().unwrap_or_default().to_string());
    }
    names.sort();
    // (KVM's worker thread, kvm-nx-lpage-recovery, is in the thread group too.)
    names.retain(|n| !n.contains("kvm-"));
    assert_eq!(
        names,
        [
            "Name:\tember",
            "Name:\tember_api",
            "Name:\tember_vcpu0",
            "Name:\tember_vcpu1"
        ]
    );

    // SIGTERM ends it as it ends an unjailed ember, and the socket goes with it.
    // SAFETY: kill(2) on the jailed ember; it cannot affect our memory.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    match pid_ns {
        // Our child: its status is ours to read.
        false => assert_eq!(
            ember.wait_exit(Duration::from_secs(10)),
            Some(128 + libc::SIGTERM)
        ),
        // Reparented when the jailer's parent exited: gone is all we can see.
        true => wait_gone(pid, Duration::from_secs(10)),
    }
    assert!(!jail.root().join("run/ember.socket").exists());
}

#[test]
fn the_jailer_boots_a_guest_as_an_unprivileged_user_inside_its_jail() {
    boot_in_jail("jail-boot", false);
}

#[test]
fn with_new_pid_ns_ember_is_pid_1_of_its_own_namespace() {
    boot_in_jail("jail-pidns", true);
}

#[test]
fn cgroup_v2_and_daemonize() {
    require_kvm!();
    if !Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
        skip(
            "cgroup_v2_and_daemonize",
            "no cgroup2 hierarchy at /sys/fs/cgroup/unified",
        );
        return;
    }
    let jail = JailFixture::new("jail-v2");
    // This machine's cgroup2 hierarchy offers hugetlb only (the rest is bound to v1).
    let extra = [
        "--cgroup-version",
        "2",
        "--cgroup",
        "hugetlb.2MB.max=0",
        "--daemonize",
    ];
    let mut ember = Ember::spawn(
        jail.command(&extra, &["--api-sock", "/run/ember.socket"]),
        jail.root().join("run/ember.socket"),
    );
    let pid = jail.pid();
    ember.client().get("/").expect(200, "");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups
            .lines()
            .any(|l| l == format!("0::/ember/{}", jail.id)),
        "{cgroups}"
    );
    let max = std::fs::read_to_string(jail.cgroup_v2().join("hugetlb.2MB.max")).unwrap();
    assert_eq!(max.trim(), "0");
    // Daemonized: its own session, and its standard streams on /dev/null.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let session: u32 = after_name
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(session, pid, "{stat}");
    for fd in 0..3 {
        let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "fd {fd}");
    }
    ember.child.kill().unwrap();
    let _ = ember.wait_exit(Duration::from_secs(5));
}

/// The jailer's arguments `--id id --exec-file exec`, then `more`.
fn with_good_exec<'a>(id: &'a str, exec: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--id", id, "--exec-file", exec];
    args.extend_from_slice(more);
    args
}

#[test]
fn bad_jailer_input_is_refused_and_leaves_nothing_behind() {
    require_kvm!();
    let jail = JailFixture::new("jail-bad");
    let bins = static_bins();
    let ember = bins.join("ember").to_string_lossy().into_owned();
    let base = jail.base.0.to_string_lossy().into_owned();
    let file = jail.base.file("a-file", b"");
    let long = "a".repeat(65);
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--id", "a/b", "--exec-file", &ember],
            "invalid --id \"a/b\"".into(),
        ),
        (
            vec!["--id", &long, "--exec-file", &ember],
            format!("invalid --id \"{long}\""),
        ),
        (
            vec!["--id", &jail.id, "--exec-file", "target/ember"],
            "--exec-file must be an absolute path".into(),
        ),
        (
            vec!["--id", &jail.id, "--exec-file", "/no/such/ember"],
            "the exec file /no/such/ember does not exist".into(),
        ),
        (
            vec!["--id", &jail.id, "--exec-file", "/bin/true"],
            "is dynamically linked (it needs /lib64/ld-linux-x86-64.so.2)".into(),
        ),
        (
            with_good_exec(&jail.id, &ember, &["--chroot-base-dir", &file]),
            format!("the chroot base {file} exists and is not a directory"),
        ),
        (
            with_good_exec(&jail.id, &ember, &["--cgroup", "pids.nosuch=1"]),
            format!(
                "the cgroup file pids.nosuch does not exist in /sys/fs/cgroup/pids/ember/{}",
                jail.id
            ),
        ),
        (
            with_good_exec(&jail.id, &ember, &["--cgroup", "nosuchctl.max=1"]),
            "no cgroup v1 hierarchy with the nosuchctl controller is mounted".into(),
        ),
        (
            with_good_exec(&jail.id, &ember, &["--netns", "/var/run/netns/no-such-ns"]),
            "the network namespace /var/run/netns/no-such-ns does not exist".into(),
        ),
    ];
    for (args, message) in cases {
        let mut all = args.clone();
        let has_base = all.contains(&"--chroot-base-dir");
        if !has_base {
            all.extend(["--chroot-base-dir", &base]);
        }
        all.extend(["--uid", "1234", "--gid", "1234"]);
        let out = Command::new(bins.join("jailer"))
            .args(&all)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {err}");
        assert!(
            err.starts_with("jailer: ") && err.contains(&message),
            "{all:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one sentence: {err}");
        assert!(
            !jail.base.path("ember").exists(),
            "{all:?} left a jail behind"
        );
        assert!(!jail.cgroup().exists(), "{all:?} left a cgroup behind");
        assert!(
            !Path::new("/sys/fs/cgroup/pids/ember").exists()
                || std::fs::read_dir("/sys/fs/cgroup/pids/ember")
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().path().is_dir())
                    .all(|e| !e
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with("jail-bad")),
            "{all:?} left a cgroup behind"
        );
    }
    let out = Command::new(bins.join("jailer"))
        .args([
            "--id",
            "x",
            "--exec-file",
            &ember,
            "--uid",
            "no-such-user-here",
            "--gid",
            "1",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--uid \"no-such-user-here\" is neither a number nor a user known to this host"));
}

#[test]
fn a_jail_left_by_a_killed_run_is_diagnosed_clearly() {
    require_kvm!();
    let jail = JailFixture::new("jail-left");
    let extra = ["--cgroup", "pids.max=64"];
    let vmm = ["--api-sock", "/run/ember.socket"];
    let mut first = Ember::spawn(
        jail.command(&extra, &vmm),
        jail.root().join("run/ember.socket"),
    );
    let pid = jail.pid();

    // While it runs, the id is taken.
    let out = jail.command(&extra, &vmm).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "belongs to process {pid}, which is still running; pick another --id"
        )),
        "{err}"
    );

    // Killed, it leaves its jail and cgroup: the next run says so, and what to remove.
    first.child.kill().unwrap();
    let _ = first.wait_exit(Duration::from_secs(5));
    let out = jail.command(&extra, &vmm).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let dir = jail.base.path(&format!("ember/{}", jail.id));
    assert!(
        err.contains(&format!(
            "was left behind by an earlier run at {} (its process {pid} is no longer running); remove that directory and the cgroups {} (rmdir)",
            dir.display(),
            jail.cgroup().display()
        )),
        "{err}"
    );
    // Once removed, the id works again.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir(jail.cgroup()).unwrap();
    let mut again = Ember::spawn(
        jail.command(&extra, &vmm),
        jail.root().join("run/ember.socket"),
    );
    again.client().get("/").expect(200, "");
    again.child.kill().unwrap();
    let _ = again.wait_exit(Duration::from_secs(5));
}

#[test]
fn linux_in_a_jail_with_netns_talks_to_its_tap_inside_that_namespace() {
    let img = linux_images!();
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap_owned("tap0", Some("10.60.1.1/24"), 1500, Some(ID));
    let jail = JailFixture::new("jail-net");
    let netns = format!("/var/run/netns/{}", ns.name);
    let command = jail.command(&["--netns", &netns], &["--api-sock", "/run/ember.socket"]);
    let mut ember = Ember::spawn(command, jail.root().join("run/ember.socket"));
    let kernel = jail.give(&img.file("vmlinux"), "vmlinux");
    let rootfs = jail.give(&img.file("rootfs.ext4"), "rootfs.ext4");
    let cmd = "ip addr add 10.60.1.2/24 dev eth0; ip link set eth0 up; \
               ping -c 3 -w 60 10.60.1.1 >/dev/null && echo ping-ok";
    let mut c = ember.client();
    c.configure(
        &json!({"vcpu_count": 1, "mem_size_mib": 128}),
        &json!({"kernel_image_path": kernel,
                "boot_args": format!("{BASE_ARGS} ember_cmd=\"{cmd}\"")}),
        &[],
    );
    c.put(
        "/drives/rootfs",
        &json!({"drive_id": "rootfs", "path_on_host": rootfs, "is_root_device": true,
                "is_read_only": true}),
    )
    .expect(204, "");
    c.put(
        "/network-interfaces/eth0",
        &json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:0a:3c:01:02"}),
    )
    .expect(204, "");
    c.instance_start();
    ember.wait_clean_exit(linux_deadline());
    let lines = command_lines(&ember.stdout());
    assert!(lines.iter().any(|l| l == "ping-ok"), "{lines:#?}");
    // The packets went through the TAP in that namespace, and the guest's MAC is known there.
    assert!(ns.counter("tap0", "rx_packets") >= 3);
    assert!(ns.counter("tap0", "tx_packets") >= 3);
    assert!(
        !Path::new("/sys/class/net/tap0").exists(),
        "the TAP is not in the host's namespace"
    );
}
