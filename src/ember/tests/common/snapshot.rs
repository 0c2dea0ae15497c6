//! Helpers for the snapshot tests: embers side by side in one scratch directory, the test
//! guest's tick counter and disk records, and the snapshot requests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use super::api::{Client, Ember};
use super::{Scratch, EMBER};

/// An ember whose API socket is `<name>.sock` in `scratch`.
pub fn ember_named(scratch: &Scratch, name: &str) -> Ember {
    let sock = scratch.path(&format!("{name}.sock"));
    let mut command = Command::new(EMBER);
    command.arg("--api-sock").arg(&sock);
    Ember::spawn(command, sock)
}

/// The numbers of the `tick N` lines the test guest printed, in order.
pub fn ticks(ember: &Ember) -> Vec<u64> {
    super::after_prefix(&ember.stdout(), "guest: tick ")
        .into_iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// Waits until the guest has printed tick `n` or a later one; returns the last.
pub fn wait_tick(ember: &Ember, n: u64, deadline: Duration) -> u64 {
    let start = Instant::now();
    loop {
        if let Some(&last) = ticks(ember).last() {
            if last >= n {
                return last;
            }
        }
        assert!(
            start.elapsed() < deadline,
            "no tick {n} within {deadline:?}; stdout: {}\nstderr: {}",
            ember.stdout(),
            ember.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The tick number the test guest's `disklog` record in sector `sector` holds, if any.
pub fn disk_record(disk: &[u8], sector: usize) -> Option<u64> {
    let record = disk.get(sector * 512..sector * 512 + 12)?;
    (&record[..4] == b"TICK").then(|| u64::from_le_bytes(record[4..12].try_into().unwrap()))
}

pub fn pause(c: &mut Client) {
    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");
}

pub fn resume(c: &mut Client) {
    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
}

/// `PUT /snapshot/create` of `kind` ("Full" or "Diff"), answered 204.
pub fn create(c: &mut Client, state: &Path, mem: &Path, kind: &str) {
    let body = json!({"snapshot_path": state, "mem_file_path": mem, "snapshot_type": kind});
    c.put("/snapshot/create", &body).expect(204, "");
}

/// The body of a `PUT /snapshot/load` with the File backend.
pub fn load_body(state: &Path, mem: &Path, resume_vm: bool) -> serde_json::Value {
    json!({
        "snapshot_path": state,
        "mem_backend": {"backend_type": "File", "backend_path": mem},
        "resume_vm": resume_vm,
    })
}

/// A snapshot [`boot_and_snapshot`] took: the guest's disk, the state and memory files, and
/// the last tick before the snapshot.
pub struct Snapshotted {
    pub disk: String,
    pub state: PathBuf,
    pub mem: PathBuf,
    pub last: u64,
}

/// Boots a test guest (`machine`) that ticks and logs each tick to a 1 MiB disk, with an
/// entropy device and a balloon (which it does not drive) beside its disk and data in the
/// MMDS; snapshots it (Full, to `vm.snap` and `vm.mem` in `s`) at its third tick or later
/// and stops that ember.
pub fn boot_and_snapshot(s: &Scratch, machine: &serde_json::Value) -> Snapshotted {
    boot_and_snapshot_on(s, machine, "Sync")
}

/// [`boot_and_snapshot`] with the disk on I/O engine `engine`.
pub fn boot_and_snapshot_on(s: &Scratch, machine: &serde_json::Value, engine: &str) -> Snapshotted {
    let disk = s.file("disk.img", &vec![0u8; 1 << 20]);
    let (state, mem) = (s.path("vm.snap"), s.path("vm.mem"));
    let mut a = ember_named(s, "a");
    let mut c = a.client();
    c.configure(
        machine,
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks disklog"}),
        &[],
    );
    c.put(
        "/drives/rootfs",
        &json!({"drive_id": "rootfs", "path_on_host": disk,
        "is_root_device": false, "io_engine": engine}),
    )
    .expect(204, "");
    c.put("/entropy", &json!({})).expect(204, "");
    // A CPU template, which the snapshot keeps: MONITOR (leaf 1 ECX bit 3) shown.
    c.put(
        "/cpu-config",
        &json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0",
        "flags": 0, "modifiers": [{"register": "ecx", "bitmap": "0b1xxx"}]}]}),
    )
    .expect(204, "");
    c.put(
        "/balloon",
        &json!({"amount_mib": 0, "deflate_on_oom": false}),
    )
    .expect(204, "");
    c.put("/mmds", &json!({"latest": {"role": "snapshotted"}}))
        .expect(204, "");
    c.instance_start();
    wait_tick(&a, 3, Duration::from_secs(30));
    pause(&mut c);
    std::thread::sleep(Duration::from_millis(50));
    let last = *ticks(&a).last().unwrap();
    create(&mut c, &state, &mem, "Full");
    assert_eq!(*ticks(&a).last().unwrap(), last, "the guest stayed paused");
    assert_eq!(a.terminate(), Some(128 + libc::SIGTERM));
    Snapshotted {
        disk,
        state,
        mem,
        last,
    }
}

/// `latencies_us` of a metrics line flushed now into `metrics` (set with `PUT /metrics`).
pub fn latencies(c: &mut Client, metrics: &Path) -> serde_json::Value {
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    let text = std::fs::read_to_string(metrics).unwrap();
    let last = text.lines().last().expect("a metrics line");
    let line: serde_json::Value = serde_json::from_str(last).unwrap();
    line["latencies_us"].clone()
}

/// Checks that `op`'s latest duration was recorded at both levels, the API's around the VMM's.
pub fn assert_timed(latencies: &serde_json::Value, op: &str) {
    let api = latencies[op].as_u64().unwrap();
    let vmm = latencies[format!("vmm_{op}")].as_u64().unwrap();
    assert!(
        vmm > 0 && api >= vmm,
        "{op}: API {api} us, VMM {vmm} us: {latencies}"
    );
}
