//! Seccomp with the test guest: every thread carries a filter, a whole run (API calls, a
//! disk, pause and resume, a drive patched after boot, metrics, SIGTERM) goes through under
//! them, a forbidden system call on a vCPU thread ends ember with status 148 (a user's kill_process
//! filter: killed by SIGSYS), and `--seccomp-filter` and `--no-seccomp` replace or remove the filters.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::api::{Client, Ember};
use common::*;
use serde_json::json;

const KERNEL: &str = test_guest::PVH_ELF;
const BOOT: Duration = Duration::from_secs(30);

/// (thread name, its Seccomp mode, its number of filters) for each of ember's threads. KVM's
/// own worker (`kvm-nx-lpage-recovery`), which the kernel starts in ember's thread group and
/// which runs no user code, is left out.
fn thread_filters(pid: u32) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status =
            std::fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        if field("Name:").starts_with("kvm-") {
            continue;
        }
        out.push((
            field("Name:"),
            field("Seccomp:").parse().unwrap_or(99),
            field("Seccomp_filters:").parse().unwrap_or(99),
        ));
    }
    out.sort();
    out
}

fn configure(c: &mut Client, s: &Scratch, vcpus: u8, args: &str) {
    let data = s.file("data.img", &vec![0u8; 128 << 10]);
    c.configure(
        &json!({"vcpu_count": vcpus, "mem_size_mib": 64}),
        &json!({"kernel_image_path": KERNEL, "boot_args": args}),
        &[("data", &data, false)],
    );
}

#[test]
fn every_thread_runs_under_its_filter_through_a_whole_run() {
    let s = kvm_scratch!("seccomp-run");
    let metrics = s.path("metrics.json");
    let metrics_arg = metrics.to_str().unwrap();
    let mut ember = Ember::start(&s, &["--metrics-path", metrics_arg, "--level", "Debug"]);
    let pid = ember.child.id();
    let mut c = ember.client();
    // Before boot only the API thread is filtered: the VMM thread still opens files, TAPs
    // and KVM as it is configured.
    c.get("/").expect(200, "");
    let before = thread_filters(pid);
    assert_eq!(
        before,
        vec![("ember".into(), 0, 0), ("ember_api".into(), 2, 1)],
        "{before:?}"
    );
    configure(&mut c, &s, 2, "ticks");
    c.instance_start();
    ember.wait_for("guest: tick 2", BOOT);
    let after = thread_filters(pid);
    assert_eq!(
        after,
        vec![
            ("ember".into(), 2, 1),
            ("ember_api".into(), 2, 1),
            ("ember_vcpu0".into(), 2, 1),
            ("ember_vcpu1".into(), 2, 1),
        ],
        "{after:?}"
    );

    // What a client does with a running microVM, all under the filters.
    let other = s.file("other.img", &vec![1u8; 256 << 10]);
    let ops = json!({"ops": {"size": 100, "refill_time": 100}});
    #[rustfmt::skip]
    let calls = [
        ("PATCH", "/vm", json!({"state": "Paused"})),
        ("PATCH", "/vm", json!({"state": "Resumed"})),
        ("PATCH", "/drives/data", json!({"drive_id": "data", "path_on_host": other})),
        ("PATCH", "/drives/data", json!({"drive_id": "data", "rate_limiter": ops})),
        ("PUT", "/actions", json!({"action_type": "BlockDeviceRescan", "payload": "data"})),
        ("PUT", "/mmds", json!({"latest": {"id": "x"}})),
        ("PUT", "/actions", json!({"action_type": "FlushMetrics"})),
        ("PUT", "/actions", json!({"action_type": "SendCtrlAltDel"})),
    ];
    for (method, path, body) in calls {
        c.call(method, path, &body).expect(204, "");
    }
    c.get("/vm/config").expect(200, "");
    ember.wait_for("guest: tick 4", BOOT);
    assert_eq!(
        ember.terminate(),
        Some(128 + libc::SIGTERM),
        "{}",
        ember.stderr()
    );
    let lines = std::fs::read_to_string(&metrics).unwrap();
    assert!(lines.lines().count() >= 2, "{lines}");
    assert!(
        !s.path("api.sock").exists(),
        "the socket is removed at exit"
    );
}

#[test]
fn a_guest_that_runs_to_its_end_exits_cleanly_under_the_filters() {
    let s = kvm_scratch!("seccomp-end");
    // Info: at exit ember reads KVM's per-vCPU counters and logs them.
    let mut ember = Ember::start(&s, &["--level", "Info"]);
    let mut c = ember.client();
    configure(&mut c, &s, 2, "");
    c.instance_start();
    ember.wait_clean_exit(BOOT);
    assert!(
        ember.stdout().contains("guest: disks=1"),
        "{}",
        ember.stdout()
    );
}

/// Starts ember with `env` and `args` from a config file for the test guest; returns how it
/// ended and its stderr.
fn run_killed(
    s: &Scratch,
    env: &[(&str, &str)],
    args: &[&str],
) -> (std::process::ExitStatus, String) {
    let config = json!({
        "boot-source": {"kernel_image_path": KERNEL, "boot_args": "ticks"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64}
    });
    let path = s.file("vm.json", config.to_string().as_bytes());
    let mut child = Command::new(EMBER)
        .args(["--no-api", "--config-file", &path])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status, err);
        }
        if started.elapsed() > BOOT {
            let _ = child.kill();
            panic!("ember was not killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_forbidden_system_call_on_a_vcpu_thread_ends_ember_with_status_148() {
    let s = kvm_scratch!("seccomp-kill");
    // The debug build's hook: the vCPU thread opens a UDP socket after its filter is in
    // place. (A call made while every signal is blocked, as musl's posix_spawn blocks them
    // around its clone, gets the kernel's SIGSYS kill instead: no handler can run there.)
    // Ember's filters trap, and ember names the call and exits 148, as Firecracker does.
    let (status, err) = run_killed(&s, &[("EMBER_TEST_VCPU_SYSCALL", "socket")], &[]);
    assert_eq!(status.code(), Some(148), "{status:?} {err}");
    assert!(
        err.contains("ember: shutting down after intercepting a bad system call (system call 41)"),
        "{err}"
    );
    // A user's filter that forbids KVM_RUN with kill_process: the kernel kills ember with
    // SIGSYS at the guest's first run.
    let filter = json!({
        "vmm": {"default_action": "allow", "filter_action": "kill_process", "filter": [{"syscall": "execve"}]},
        "api": {"default_action": "allow", "filter_action": "kill_process", "filter": [{"syscall": "execve"}]},
        "vcpu": {"default_action": "allow", "filter_action": "kill_process",
                 "filter": [{"syscall": "ioctl", "args": [{"index": 1, "type": "dword", "op": "eq", "val": 44672, "comment": "KVM_RUN"}]}]}
    });
    let path = s.file("filter.json", filter.to_string().as_bytes());
    let (status, err) = run_killed(&s, &[], &["--seccomp-filter", &path]);
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{status:?} {err}");
}

#[test]
fn no_seccomp_runs_without_filters_and_bad_filter_files_are_refused() {
    let s = kvm_scratch!("seccomp-off");
    let mut ember = Ember::start(&s, &["--no-seccomp"]);
    let mut c = ember.client();
    configure(&mut c, &s, 1, "ticks");
    c.instance_start();
    ember.wait_for("guest: tick 1", BOOT);
    let threads = thread_filters(ember.child.id());
    assert!(threads.iter().all(|t| t.1 == 0), "{threads:?}");
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));

    let bad = s.file(
        "bad.json",
        br#"{"vmm": {"default_action": "allow", "filter_action": "trap", "filter": []}}"#,
    );
    for (args, message) in [
        (
            vec!["--seccomp-filter", bad.as_str()],
            "has no filter for the Api thread (key \"api\")",
        ),
        (
            vec!["--seccomp-filter", "/no/such.json"],
            "cannot read the seccomp filter file /no/such.json",
        ),
        (
            vec!["--no-seccomp", "--seccomp-filter", bad.as_str()],
            "--no-seccomp and --seccomp-filter cannot be used together",
        ),
    ] {
        let mut all = vec!["--api-sock", "/nonexistent/api.sock"];
        all.extend(args);
        let run = run_args(&all);
        // Firecracker's status for flags that exclude each other: 153, a command line error.
        let status = if message.starts_with("--no-seccomp and") {
            153
        } else {
            1
        };
        assert_eq!(run.status, Some(status), "{all:?}");
        assert!(run.stderr.contains(message), "{all:?}: {}", run.stderr);
    }
}
