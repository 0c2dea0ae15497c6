//! The REST API end to end with the test guest: a microVM configured and started entirely
//! through the socket, its configuration read back and replayed, pause and resume, the
//! keyboard, and a socket that answers from its first millisecond until ember exits.

mod common;

use std::time::{Duration, Instant};

use common::api::{Client, Ember};
use common::*;
use serde_json::json;

const KERNEL: &str = test_guest::PVH_ELF;
const BOOT: Duration = Duration::from_secs(30);

/// Configures a test guest through `c`: machine, boot source, a root and a data drive.
fn configure(c: &mut Client, s: &Scratch, args: &str) {
    let root = s.file("root.img", &noise(64 << 10, 1));
    let data = s.file("data.img", &vec![0u8; 128 << 10]);
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 64}),
        &json!({"kernel_image_path": KERNEL, "boot_args": args}),
        &[("rootfs", &root, true), ("data", &data, false)],
    );
}

/// An ember running a test guest that [`configure`] set up with `args`.
fn start_configured(s: &Scratch, args: &str) -> (Ember, Client) {
    let ember = Ember::start(s, &[]);
    let mut c = ember.client();
    configure(&mut c, s, args);
    c.instance_start();
    (ember, c)
}

/// The guest lines that describe the machine (not the keys it was sent).
fn machine_lines(ember: &Ember) -> Vec<String> {
    ember
        .guest_lines()
        .into_iter()
        .filter(|l| !l.starts_with("key ") && !l.starts_with("keyboard"))
        .collect()
}

#[test]
fn a_guest_configured_through_the_api_boots_and_its_config_replays() {
    let s = kvm_scratch!("api-boot");
    let (mut first, mut c) = start_configured(&s, "keyboard");
    first.wait_for("guest: keyboard waiting", BOOT);
    let lines = first.guest_lines();
    assert!(lines.contains(&"smp online=2".to_string()), "{lines:?}");
    assert!(lines
        .iter()
        .any(|l| l.starts_with("blk0 id=rootfs sectors=128")));
    assert!(lines
        .iter()
        .any(|l| l.starts_with("blk1 id=data sectors=256")));

    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["machine-config"]["vcpu_count"], 2);
    assert_eq!(config["machine-config"]["mem_size_mib"], 64);
    assert_eq!(config["boot-source"]["kernel_image_path"], KERNEL);
    assert_eq!(config["boot-source"]["boot_args"], "keyboard");
    let drives = config["drives"].as_array().unwrap();
    assert_eq!(drives.len(), 2);
    assert_eq!(drives[0]["drive_id"], "rootfs");
    assert_eq!(drives[1]["drive_id"], "data");

    // The guest waits for Ctrl+Alt+Del, reads it from the i8042, and resets.
    c.put("/actions", &json!({"action_type": "SendCtrlAltDel"}))
        .expect(204, "");
    assert_eq!(first.wait_exit(BOOT), Some(0), "{}", first.stdout());
    let out = first.stdout();
    let keys = after_prefix(&out, "guest: key ");
    assert_eq!(
        keys,
        ["0x1d", "0x38", "0xe0", "0x53", "0xe0", "0xd3", "0xb8", "0x9d"],
        "Ctrl, Alt, Del pressed and released, in scan code set 1"
    );
    assert!(!first.sock.exists(), "the socket file is removed at exit");

    // A second ember boots the same machine from the saved configuration, API still on.
    let s2 = Scratch::new("api-replay");
    let saved = s2.file("saved.json", config.to_string().as_bytes());
    let second = Ember::start(&s2, &["--config-file", &saved]);
    second.wait_for("guest: keyboard waiting", BOOT);
    let mut c2 = second.client();
    c2.put("/actions", &json!({"action_type": "InstanceStart"}))
        .expect(400, "not supported after starting");
    c2.put("/actions", &json!({"action_type": "SendCtrlAltDel"}))
        .expect(204, "");
    second.wait_for("guest: done", BOOT);
    // The same machine; the data disk now holds what the first guest wrote to it (the root
    // disk's first 4 KiB), since both runs use the same file.
    let (one, two) = (machine_lines(&first), machine_lines(&second));
    let read = |lines: &[String], disk: &str| {
        let prefix = format!("{disk} read ");
        let line = lines.iter().find(|l| l.starts_with(&prefix)).unwrap();
        line[prefix.len()..].to_string()
    };
    assert_eq!(read(&two, "blk1"), read(&one, "blk0"));
    let others = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| !l.starts_with("blk1 read "))
            .cloned()
            .collect()
    };
    assert_eq!(others(&two), others(&one));
}

#[test]
fn pause_stops_the_guest_and_resume_lets_it_go_on() {
    let s = kvm_scratch!("api-pause");
    let (mut ember, mut c) = start_configured(&s, "ticks nosmp");
    ember.wait_for("guest: tick 2", BOOT);
    assert_eq!(c.get("/").expect(200, "").json()["state"], "Running");

    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");
    assert_eq!(c.get("/").json()["state"], "Paused");
    // A tick already written by the guest may still be in the pipe.
    std::thread::sleep(Duration::from_millis(100));
    let paused_at = ember.ticks();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ember.ticks(), paused_at, "no progress while paused");
    // Pausing twice is not an error, as with Firecracker.
    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");

    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
    assert_eq!(c.get("/").json()["state"], "Running");
    ember.wait_for(&format!("guest: tick {}", paused_at + 2), BOOT);
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
}

#[test]
fn the_socket_answers_from_its_first_millisecond_until_exit() {
    let s = kvm_scratch!("api-first-ms");
    let started = Instant::now();
    let mut ember = Ember::start(&s, &[]);
    let appeared = started.elapsed();
    // The first connection after the file appears is served at once.
    let mut c = ember.client();
    let info = c.get("/").expect(200, "").json();
    assert_eq!(info["state"], "Not started");
    assert_eq!(info["id"], "anonymous-instance");
    eprintln!(
        "socket after {appeared:?}, first answer after {:?}",
        started.elapsed()
    );

    configure(&mut c, &s, "ticks nosmp");
    c.instance_start();
    ember.wait_for("guest: tick 0", BOOT);
    // While the guest runs: new connections and the kept one both answer.
    for i in 0..50 {
        let mut fresh = ember.client();
        assert_eq!(fresh.get("/").status, 200, "request {i}");
        assert_eq!(c.get("/version").status, 200);
    }
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
    assert!(!ember.sock.exists(), "the socket file is removed at exit");
}

#[test]
fn fatal_signals_end_ember_with_firecracker_statuses() {
    let s = Scratch::new("api-signals");
    for (signal, status, name) in [
        (libc::SIGBUS, 149, "SIGBUS"),
        (libc::SIGSEGV, 150, "SIGSEGV"),
        (libc::SIGXFSZ, 151, "SIGXFSZ"),
        (libc::SIGXCPU, 154, "SIGXCPU"),
        (libc::SIGHUP, 156, "SIGHUP"),
        (libc::SIGILL, 157, "SIGILL"),
        (libc::SIGTERM, 128 + libc::SIGTERM, ""),
    ] {
        let mut ember = Ember::start(&s, &[]);
        // The handlers are in place once the socket answers.
        ember.client().get("/").expect(200, "");
        let pid = libc::pid_t::try_from(ember.child.id()).unwrap();
        // SAFETY: signals our own child, which is still running (not yet waited for).
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        assert_eq!(
            ember.wait_exit(Duration::from_secs(10)),
            Some(status),
            "{name}: {}",
            ember.stderr()
        );
        if !name.is_empty() {
            let line = format!("ember: shutting down after intercepting {name}");
            assert!(ember.stderr().contains(&line), "{}", ember.stderr());
        }
        let _ = std::fs::remove_file(&ember.sock);
    }
}

#[test]
fn put_serial_sends_the_console_to_a_file_at_the_rate_it_sets() {
    let s = kvm_scratch!("api-serial");
    // The guest's whole console output goes to the file; none to stdout.
    let mut ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let out = s.path("console.log");
    std::fs::write(&out, b"kept\n").unwrap();
    c.put("/serial", &json!({"serial_out_path": out}))
        .expect(204, "");
    configure(&mut c, &s, "console=ttyS0");
    c.instance_start();
    assert_eq!(ember.wait_exit(BOOT), Some(0), "{}", ember.stderr());
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("kept\n"), "appended: {text}");
    assert!(text.contains("guest: smp online=2"), "{text}");
    assert!(text.contains("guest: done"), "{text}");
    assert!(!ember.stdout().contains("guest:"), "{}", ember.stdout());
    let full = text.len() - "kept\n".len();

    // A bucket of 64 bytes a second: the first 64 bytes pass, the rest of a run that takes
    // well under a second (the whole output is {full} bytes) mostly does not.
    let mut ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let metrics = s.path("metrics.json");
    c.put("/metrics", &json!({"metrics_path": metrics}))
        .expect(204, "");
    let limited = s.path("limited.log");
    c.put(
        "/serial",
        &json!({"serial_out_path": limited, "rate_limiter": {"size": 64, "refill_time": 1000}}),
    )
    .expect(204, "");
    configure(&mut c, &s, "console=ttyS0");
    let started = Instant::now();
    c.instance_start();
    assert_eq!(ember.wait_exit(BOOT), Some(0), "{}", ember.stderr());
    let written = std::fs::read(&limited).unwrap().len() as u64;
    let allowed = 64 + 64 * started.elapsed().as_millis() as u64 / 1000 + 1;
    assert!(
        written >= 64 && written <= allowed,
        "{written} bytes of {full}, at most {allowed}"
    );
    let line = std::fs::read_to_string(&metrics).unwrap();
    let last: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    let dropped = last["uart"]["rate_limiter_dropped_bytes"].as_u64().unwrap();
    assert_eq!(
        written + dropped,
        full as u64,
        "every byte written or counted: {last}"
    );

    // A FIFO nobody reads takes what fits and the guest runs to its end; a directory is
    // refused at InstanceStart with a sentence; bad bodies get 400.
    let fifo = s.fifo("console.fifo");
    let mut ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    c.put("/serial", &json!({"serial_out_path": fifo}))
        .expect(204, "");
    configure(&mut c, &s, "console=ttyS0");
    c.instance_start();
    assert_eq!(ember.wait_exit(BOOT), Some(0), "{}", ember.stderr());
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    c.put("/serial", &json!({"serial_out_path": s.0}))
        .expect(204, "");
    c.put("/serial", &json!({"serial_out_path": "x", "speed": 1}))
        .expect(400, "unknown field `speed`");
    c.put(
        "/serial",
        &json!({"rate_limiter": {"size": 10, "refill_time": 0}}),
    )
    .expect(400, "refill_time");
    c.put("/serial", &json!({"serial_out_path": s.0}))
        .expect(204, "");
    configure(&mut c, &s, "console=ttyS0");
    let r = c.put("/actions", &json!({"action_type": "InstanceStart"}));
    assert_eq!(r.status, 400);
    assert!(
        r.fault().contains("cannot open the serial output file"),
        "{}",
        r.fault()
    );
}
