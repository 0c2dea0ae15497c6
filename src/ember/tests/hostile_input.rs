//! What a hostile-input probe found: each way an API client, a path or a guest could kill,
//! hang or balloon ember, answered now with a clear error while ember and its guest go on.
//! Hangs are caught by bounds far above the expected answer time (a second or less).

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::api::{Client, Ember};
use common::snapshot::{create, pause, wait_tick};
use common::*;
use serde_json::json;

/// Far above any answer here (milliseconds on this host, a second or two on an emulated
/// one): past it, the call hung.
const HANG: Duration = Duration::from_secs(30);

/// A test guest that prints `tick N` forever, started through the API.
fn ticking(s: &Scratch, extra: &[&str]) -> (Ember, Client) {
    let ember = Ember::start(s, extra);
    let mut c = ember.client();
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 64}),
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks"}),
        &[],
    );
    (ember, c)
}

/// Times one request; panics if it took a hang's time.
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(
        started.elapsed() < HANG,
        "{what} took {:?}",
        started.elapsed()
    );
    out
}

#[test]
fn every_thread_allocates_and_frees_at_will_under_the_default_filters() {
    let s = kvm_scratch!("alloc-stress");
    let sock = s.path("api.sock");
    let mut command = Command::new(EMBER);
    command.arg("--api-sock").arg(&sock);
    // Each thread (API, VMM, both vCPUs) exercises the allocator right after its filter.
    command.env("EMBER_TEST_ALLOC_STRESS", "1");
    let mut ember = Ember::spawn(command, sock);
    let mut c = ember.client();
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 64}),
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks"}),
        &[],
    );
    c.instance_start();
    wait_tick(&ember, 3, Duration::from_secs(60));
    assert_eq!(c.get("/").expect(200, "").json()["state"], "Running");
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
}

#[test]
fn huge_unknown_keys_and_long_values_get_400_and_the_guest_runs_on() {
    let s = kvm_scratch!("huge-keys");
    let (mut ember, mut c) = ticking(&s, &[]);
    c.instance_start();
    wait_tick(&ember, 2, Duration::from_secs(30));
    // Sizes around the API thread's heap trim, many times over (the probe died at 20 KB).
    for round in 0..3 {
        for kib in (16..=48).step_by(2) {
            let long = "k".repeat(kib << 10);
            let mut body = serde_json::Map::new();
            body.insert(long.clone(), json!(1));
            c.put("/machine-config", &serde_json::Value::Object(body))
                .expect(400, "");
            c.put("/actions", &json!({"action_type": long}))
                .expect(400, "");
            let drive = json!({"drive_id": "d", "path_on_host": "/x", "is_root_device": false,
                               "cache_type": long});
            c.put("/drives/d", &drive).expect(400, "");
            assert_eq!(c.get("/").expect(200, "").json()["state"], "Running");
        }
        let before = ember.ticks();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            ember.ticks() > before,
            "round {round}: the guest stopped ticking"
        );
    }
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
}

/// Runs ember with `args`; returns (exit status, stderr) or panics if it hung.
fn run_no_api(args: &[&str]) -> (Option<i32>, String) {
    let run = finish(spawn(args), Instant::now(), HANG);
    assert!(run.elapsed < HANG, "ember {args:?} hung");
    (run.status, run.stderr)
}

#[test]
fn config_and_metadata_files_that_are_devices_or_fifos_are_refused_at_once() {
    let s = Scratch::new("special-cli");
    let fifo = s.fifo("fifo");
    let fifo = fifo.to_str().unwrap();
    let config = json!({"boot-source": {"kernel_image_path": test_guest::PVH_ELF}});
    let config = s.file("vm.json", config.to_string().as_bytes());
    for (args, text) in [
        (
            vec!["--no-api", "--config-file", "/dev/zero"],
            "cannot read the configuration file /dev/zero: it is a character device, not a regular file",
        ),
        (
            vec!["--no-api", "--config-file", fifo],
            "it is a FIFO, not a regular file",
        ),
        (
            vec!["--no-api", "--config-file", &config, "--metadata", "/dev/zero"],
            "cannot read the metadata file /dev/zero: it is a character device",
        ),
        (
            vec!["--no-api", "--config-file", &config, "--metadata", fifo],
            "it is a FIFO, not a regular file",
        ),
    ] {
        let (status, stderr) = run_no_api(&args);
        assert_eq!(status, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(text), "{args:?}: {stderr}");
    }
    // A config file over the limit is refused by its size, not read.
    let big = s.path("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let (status, stderr) = run_no_api(&["--no-api", "--config-file", big.to_str().unwrap()]);
    assert_eq!(status, Some(1));
    assert!(
        stderr.contains("over the limit of 1048576 bytes"),
        "{stderr}"
    );
}

#[test]
fn files_replaced_by_fifos_after_their_put_fail_the_start_instead_of_hanging_it() {
    if !kvm_or_skip("files_replaced_by_fifos_after_their_put_fail_the_start_instead_of_hanging_it")
    {
        return;
    }
    for replaced in ["kernel", "drive"] {
        let s = Scratch::new(&format!("swap-{replaced}"));
        let kernel = s.path("vmlinux");
        std::fs::copy(test_guest::PVH_ELF, &kernel).unwrap();
        let disk = s.file("disk.img", &[0u8; 4096]);
        let ember = Ember::start(&s, &[]);
        let mut c = ember.client();
        c.put_machine(1, 64).expect(204, "");
        c.put("/boot-source", &json!({"kernel_image_path": kernel}))
            .expect(204, "");
        let drive = json!({"drive_id": "ro", "path_on_host": disk, "is_root_device": false,
                           "is_read_only": true});
        c.put("/drives/ro", &drive).expect(204, "");
        let swapped = if replaced == "kernel" {
            kernel.clone()
        } else {
            Path::new(&disk).to_path_buf()
        };
        std::fs::remove_file(&swapped).unwrap();
        mkfifo(&swapped);
        let reply = timed("InstanceStart", || {
            c.put("/actions", &json!({"action_type": "InstanceStart"}))
        });
        reply.expect(400, "it is a FIFO, not a regular file");
        assert_eq!(c.get("/").expect(200, "").json()["state"], "Not started");
    }
}

#[test]
fn snapshot_paths_that_are_devices_fifos_or_silent_sockets_are_refused_at_once() {
    let s = kvm_scratch!("special-snap");
    let fifo = s.fifo("fifo");
    // A running guest: creating a snapshot into a FIFO fails, and the guest goes on.
    let (mut a, mut c) = ticking(&s, &[]);
    c.instance_start();
    wait_tick(&a, 2, Duration::from_secs(30));
    pause(&mut c);
    let (state, mem) = (s.path("vm.snap"), s.path("vm.mem"));
    for (snap, memf) in [(&fifo, &mem), (&state, &fifo)] {
        let body = json!({"snapshot_path": snap, "mem_file_path": memf});
        timed("snapshot create", || c.put("/snapshot/create", &body))
            .expect(400, "it is a FIFO, not a regular file");
    }
    create(&mut c, &state, &mem, "Full");
    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
    let before = a.ticks();
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.ticks() > before, "the guest runs on");
    a.terminate();

    // Loading: the state file or the memory file a device or a FIFO; a handler socket that
    // never accepts (its backlog full).
    let handler = s.path("handler.sock");
    let listener = std::os::unix::net::UnixListener::bind(&handler).unwrap();
    // A short backlog, so that it fills long before the open-file limit.
    // SAFETY: listen() on a socket this test owns; no pointers.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4) }, 0);
    let mut backlog = Vec::new();
    let full = loop {
        match hostfile::connect(&handler, Duration::from_secs(1)) {
            Ok(c) => backlog.push(c),
            Err(e) => break e,
        }
        assert!(backlog.len() < 100, "the backlog never filled");
    };
    assert!(matches!(full, hostfile::Error::Busy), "{full}");
    let b = common::snapshot::ember_named(&s, "b");
    let mut c = b.client();
    let file = |snap: &Path, mem: &Path| json!({"snapshot_path": snap, "mem_backend": {"backend_type": "File", "backend_path": mem}});
    for (body, text) in [
        (
            file(Path::new("/dev/zero"), &mem),
            "it is a character device, not a regular file",
        ),
        (file(&fifo, &mem), "it is a FIFO, not a regular file"),
        (file(&state, &fifo), "it is a FIFO, not a regular file"),
        (
            file(&state, Path::new("/dev/zero")),
            "it is a character device, not a regular file",
        ),
        (
            json!({"snapshot_path": state,
                   "mem_backend": {"backend_type": "Uffd", "backend_path": fifo}}),
            "it is a FIFO, not a socket",
        ),
        (
            json!({"snapshot_path": state,
                   "mem_backend": {"backend_type": "Uffd", "backend_path": handler}}),
            "not accepting connections",
        ),
    ] {
        timed("snapshot load", || c.put("/snapshot/load", &body)).expect(400, text);
        assert_eq!(c.get("/").expect(200, "").json()["state"], "Not started");
    }
    drop(listener);
}

#[test]
fn serial_output_to_a_closed_stdout_is_counted_not_logged_per_byte() {
    let s = kvm_scratch!("closed-stdout");
    let config = json!({
        "boot-source": {"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64},
    });
    let config = s.file("vm.json", config.to_string().as_bytes());
    let mut child = spawn(&["--no-api", "--config-file", &config, "--level", "Warning"]);
    // Close the reading end: every console write now fails with EPIPE.
    drop(child.stdout.take());
    std::thread::sleep(Duration::from_secs(3));
    let _ = child.kill();
    let _ = child.wait();
    let stderr = read_all(child.stderr.take());
    let lines = stderr
        .lines()
        .filter(|l| l.contains("console output"))
        .count();
    assert_eq!(lines, 1, "one line, not one per byte:\n{stderr}");
    assert!(stderr.contains("uart.missed_write_count"), "{stderr}");
}

#[test]
fn connection_churn_and_held_connections_never_lock_a_client_out() {
    let ember = Ember::in_scratch("churn");
    // Held, idle connections: more than the server keeps open.
    let held: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(&ember.sock).unwrap())
        .collect();
    let mut c = ember.client();
    assert_eq!(timed("GET / with 300 held", || c.get("/")).status, 200);
    drop(held);
    // Two threads connecting and closing as fast as they can.
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (stop, sock) = (stop.clone(), ember.sock.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if UnixStream::connect(&sock).is_ok() {
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let mut answered = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..50 {
        let started = Instant::now();
        let mut c = timed("connect under churn", || ember.client());
        assert_eq!(timed("GET / under churn", || c.get("/")).status, 200);
        slowest = slowest.max(started.elapsed());
        answered += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("50 of 50 GET / answered under churn, the slowest in {slowest:?}");
    stop.store(true, Ordering::Relaxed);
    let churned: u64 = churners.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(answered, 50);
    assert!(churned > 1000, "the churn was real: {churned} connections");
    let mut check = Client::connect(&ember.sock);
    check.send_raw(b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(check.reply().unwrap().status, 200);
}
