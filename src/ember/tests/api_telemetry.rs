//! Metrics and the logger through the API and the command line, with the test guest: the
//! periodic metrics line, a metrics pipe nobody reads (which must never hold up the VMM),
//! Firecracker's once-only rule for metrics, and the logger's level, format and module filter.

mod common;

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use common::api::{Client, Ember};
use common::*;
use serde_json::{json, Value};

const BOOT: Duration = Duration::from_secs(30);

fn boot_hanging_guest(c: &mut Client, s: &Scratch, ember: &Ember) {
    let root = s.file("root.img", &noise(64 << 10, 1));
    c.configure(
        &json!({"vcpu_count": 1, "mem_size_mib": 32}),
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "hang nosmp"}),
        &[("rootfs", &root, true)],
    );
    c.instance_start();
    ember.wait_for("guest: hanging", BOOT);
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn metrics_are_written_every_60_seconds_and_on_flush() {
    let s = kvm_scratch!("metrics-period");
    let path = s.path("metrics.json");
    let arg = path.to_string_lossy().into_owned();
    let ember = Ember::start(&s, &["--metrics-path", &arg]);
    let mut c = ember.client();
    boot_hanging_guest(&mut c, &s, &ember);
    let started = Instant::now();
    while std::fs::read_to_string(&path)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(75),
            "no metrics line after 75 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let waited = started.elapsed();
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    let lines = json_lines(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(lines.len(), 2, "one periodic line, one flushed");
    // The periodic line counted the boot: the API's requests and the guest's exits.
    let first = &lines[0];
    assert_eq!(first["put_api_requests"]["drive_count"], 1);
    assert_eq!(first["put_api_requests"]["actions_count"], 1);
    assert!(
        first["vcpu"]["exit_io_out"].as_u64().unwrap() > 0,
        "{first}"
    );
    assert!(first["api_server"]["request_count"].as_u64().unwrap() >= 4);
    assert!(first["block_rootfs"].is_object() && first["block"].is_object());
    eprintln!("the first periodic line came {waited:?} after boot");
    // Metrics are set once per process, as in Firecracker.
    let other = s.path("other.json").to_string_lossy().into_owned();
    c.put("/metrics", &json!({"metrics_path": other})).expect(
        400,
        "The requested operation is not supported after starting",
    );
}

#[test]
fn a_metrics_pipe_nobody_reads_never_holds_up_the_vmm() {
    let s = kvm_scratch!("metrics-fifo");
    let fifo = s.fifo("metrics.fifo");
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    // No reader yet: accepted all the same.
    c.put("/metrics", &json!({"metrics_path": fifo}))
        .expect(204, "");
    c.put("/metrics", &json!({"metrics_path": fifo}))
        .expect(400, "Reinitialization of metrics not allowed");
    boot_hanging_guest(&mut c, &s, &ember);
    // Far more lines than the pipe holds: each request is answered at once.
    let started = Instant::now();
    for _ in 0..300 {
        c.put("/actions", &json!({"action_type": "FlushMetrics"}))
            .expect(204, "");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "300 flushes took {took:?}");
    assert_eq!(c.get("/").json()["state"], "Running");

    // A reader that comes late gets whole lines; the ones that did not fit were counted.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // Each read_to_end stops at WouldBlock once the pipe is empty, keeping what came.
    let mut got = Vec::new();
    let _ = reader.read_to_end(&mut got);
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    let _ = reader.read_to_end(&mut got);
    let lines = json_lines(&String::from_utf8(got).unwrap());
    assert!(
        lines.len() > 5 && lines.len() < 300,
        "{} lines",
        lines.len()
    );
    let missed = lines.last().unwrap()["api_server"]["missed_metrics_lines"]
        .as_u64()
        .unwrap();
    assert!(missed > 0, "the dropped lines are counted");
    eprintln!(
        "300 flushes into a full pipe: {took:?}; {} lines arrived, {missed} were dropped",
        lines.len()
    );
}

#[test]
fn the_logger_takes_its_level_format_and_module_filter() {
    let s = Scratch::new("logger");
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let log = s.path("ember.log");
    c.put(
        "/logger",
        &json!({"log_path": "/nonexistent/dir/ember.log", "level": "Debug"}),
    )
    .expect(
        400,
        "Cannot initialize the logger: cannot open /nonexistent/dir/ember.log",
    );
    c.put(
        "/logger",
        &json!({"log_path": log, "level": "debug", "show_level": true, "module": "vmm::controller"}),
    )
    .expect(204, "");
    c.get("/machine-config").expect(200, "");
    // The API server logs a malformed request at Info; the module filter keeps it out.
    let mut raw = ember.client();
    raw.send_raw(b"NOT HTTP\r\n\r\n");
    let _ = raw.reply();
    c.get("/").expect(200, "");
    let text = std::fs::read_to_string(&log).unwrap();
    let line = line_with(&text, "API request: GetMachineConfig");
    assert!(line.contains(" [anonymous-instance:main:DEBUG] "), "{line}");
    assert!(!text.contains("malformed"), "{text}");
    assert!(text.lines().all(|l| l.contains(":DEBUG] ")), "{text}");
}
