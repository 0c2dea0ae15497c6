//! Which system calls a real run makes, against the seccomp filters: the Linux guest with a
//! root and a data drive (one with a rate limiter, on the Async engine), a network interface on a TAP in a
//! namespace and the MMDS, vsock streams both ways, driven through the API (pause, resume, a
//! drive patched after boot), all under `strace -f`. Each thread's calls after its own `seccomp()` must be in
//! its filter in src/seccomp/filters/x86_64.json; the test prints what each thread used,
//! and what its filter allows that the run did not use.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::api::Ember;
use common::linux::*;
use common::netns::NetNs;
use common::*;
use serde_json::{json, Value};

const FILTERS: &str = include_str!("../../seccomp/filters/x86_64.json");

/// (allowed syscall names, allowed ioctl requests) of thread kind `kind`.
fn allowed(kind: &str) -> (BTreeSet<String>, BTreeSet<u64>) {
    let doc: Value = serde_json::from_str(FILTERS).unwrap();
    let mut names = BTreeSet::new();
    let mut ioctls = BTreeSet::new();
    for rule in doc[kind]["filter"].as_array().unwrap() {
        let name = rule["syscall"].as_str().unwrap().to_string();
        if name == "ioctl" {
            ioctls.insert(rule["args"][0]["val"].as_u64().unwrap());
        }
        names.insert(name);
    }
    (names, ioctls)
}

/// What one thread did after installing its filter: (kind, names, ioctl requests).
fn after_filter(trace: &str) -> Option<(String, BTreeSet<String>, BTreeSet<u64>)> {
    let kind = if trace.contains("\"ember_api\"") {
        "api"
    } else if trace.contains("\"ember_vcpu") {
        "vcpu"
    } else {
        "vmm"
    };
    let start = trace.find("seccomp(SECCOMP_SET_MODE_FILTER")?;
    let after = &trace[start..];
    let mut names = BTreeSet::new();
    let mut ioctls = BTreeSet::new();
    for line in after.lines().skip(1) {
        let Some((name, rest)) = line.split_once('(') else {
            continue;
        };
        if name.starts_with('+') || name.starts_with('-') || name.contains(' ') {
            continue;
        }
        if name == "ioctl" {
            let request = rest.split(", ").nth(1).unwrap_or("");
            let value = u64::from_str_radix(request.trim_start_matches("0x"), 16).unwrap_or(0);
            // musl passes the request as an int, sign-extended into the register; the kernel
            // takes its low 32 bits, as the filter's dword comparison does.
            ioctls.insert(value & 0xffff_ffff);
        }
        names.insert(name.to_string());
    }
    Some((kind.to_string(), names, ioctls))
}

/// Streams both ways, a guest connection to the host, and the failures.
fn vsock_traffic(uds: &std::path::Path) {
    use std::io::{Read, Write};
    let mut s = vsock::connect_when_up(uds, 5000, linux_deadline());
    s.write_all(b"SOURCE 1048576 1\n").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 1 << 20);
    let listener =
        std::os::unix::net::UnixListener::bind(format!("{}_6000", uds.display())).unwrap();
    let host = std::thread::spawn(move || {
        let (mut a, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).unwrap();
        a.write_all(b"ok\n").unwrap();
        got.len()
    });
    let sent = vsock::request(uds, 5000, "SEND 6000 65536 2");
    assert!(sent.ends_with("reply ok"), "{sent}");
    assert_eq!(host.join().unwrap(), 65536);
    assert!(vsock::request(uds, 5000, "FETCH 6001").starts_with("refused"));
    assert!(vsock::connect(uds, 5001).is_err());
    let mut bad = std::os::unix::net::UnixStream::connect(uds).unwrap();
    bad.write_all(b"CONNECT nothing\n").unwrap();
    assert_eq!(vsock::read_line(&mut bad), "");
}

#[test]
fn linux_full_run_makes_only_the_system_calls_its_threads_filters_allow() {
    let img = linux_images!();
    let test = &test_name();
    if Command::new("strace").arg("-V").output().is_err() {
        skip(
            test,
            "strace is not installed (.ci/install-deps installs it)",
        );
        return;
    }
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", Some("10.70.1.1/24"), 1500);
    let s = Scratch::new("seccomp-audit");
    let data = s.file("data.img", &noise(1 << 20, 7));
    let trace = s.path("trace");
    let sock = s.path("api.sock");
    let mut command = Command::new("ip");
    command
        .args([
            "netns",
            "exec",
            &ns.name,
            "strace",
            "-f",
            "-ff",
            "-qq",
            "-e",
            "raw=ioctl",
            "-o",
        ])
        .arg(&trace)
        .arg(EMBER)
        .arg("--api-sock")
        .arg(&sock)
        // Info: at exit ember also reads and logs KVM's per-vCPU counters.
        .args(["--level", "Info"]);
    let mut ember = Ember::spawn(command, sock);
    let mut c = ember.client();
    let cmd = "ember-agent serve 5000 >/dev/null & \
               ip addr add 10.70.1.2/24 dev eth0; ip link set eth0 up; \
               ping -c 2 -w 30 10.70.1.1 >/dev/null && echo ping-ok; \
               ip route add 169.254.169.254 dev eth0; \
               wget -q -O - http://169.254.169.254/id && echo; \
               ember-agent dio read /dev/vdb 65536 16 && echo read-ok; \
               echo patch-me; sleep 3; \
               ember-agent dio write /dev/vdb 4096 4 && echo write-ok";
    configure(&mut c, &img, 2, 256, cmd);
    c.put(
        "/drives/data",
        &json!({"drive_id": "data", "path_on_host": data, "is_root_device": false,
                "io_engine": "Async", "cache_type": "Writeback",
                "rate_limiter": {"bandwidth": {"size": 1 << 20, "refill_time": 100}}}),
    )
    .expect(204, "");
    c.put_eth0_with_mmds();
    c.put("/mmds", &json!({"id": "audit-7"})).expect(204, "");
    let uds = s.path("v.sock");
    c.put(
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": uds.to_str().unwrap()}),
    )
    .expect(204, "");
    c.instance_start();
    ember.wait_for("\npatch-me", linux_deadline());
    vsock_traffic(&uds);
    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");
    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
    let copy = s.file("copy.img", &noise(1 << 20, 8));
    c.patch(
        "/drives/data",
        &json!({"drive_id": "data", "path_on_host": copy}),
    )
    .expect(204, "");
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    ember.wait_clean_exit(linux_deadline());
    let lines = command_lines(&ember.stdout());
    for expected in ["ping-ok", "audit-7", "read-ok", "write-ok"] {
        assert!(
            lines.iter().any(|l| l == expected),
            "{expected}: {lines:#?}"
        );
    }

    // Each thread's trace file: trace.<tid>.
    let mut used: BTreeMap<String, (BTreeSet<String>, BTreeSet<u64>)> = BTreeMap::new();
    let mut threads = 0;
    for entry in std::fs::read_dir(&s.0).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("trace.") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let Some((kind, names, ioctls)) = after_filter(&text) else {
            continue;
        };
        threads += 1;
        let entry = used.entry(kind).or_default();
        entry.0.extend(names);
        entry.1.extend(ioctls);
    }
    assert_eq!(
        threads, 4,
        "the VMM, API and two vCPU threads each installed a filter"
    );
    for (kind, (names, ioctls)) in &used {
        let (allowed_names, allowed_ioctls) = allowed(kind);
        let missing: Vec<&String> = names.difference(&allowed_names).collect();
        let missing_ioctls: Vec<String> = ioctls
            .difference(&allowed_ioctls)
            .map(|v| format!("{v:#x}"))
            .collect();
        let unused: Vec<&String> = allowed_names.difference(names).collect();
        eprintln!("{kind}: used {names:?} ioctls {ioctls:x?}; allowed but unused {unused:?}");
        assert!(
            missing.is_empty(),
            "{kind} used {missing:?} outside its filter"
        );
        assert!(
            missing_ioctls.is_empty(),
            "{kind} used ioctls {missing_ioctls:?} outside its filter"
        );
    }
}
