//! `PUT /snapshot/load` on the test guest: a guest that counts, and logs each count to its
//! disk, is snapshotted, and a new ember process goes on from the next count, with the disk's
//! virtqueue where it was. The refusals of bad files and bad requests, leaving the ember
//! usable.

mod common;

use std::time::Duration;

use common::snapshot::*;
use common::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

/// The disk is on the Async engine (io_uring): requests in flight when the snapshot is taken
/// are finished and answered before the queue is saved, so that none is lost.
#[test]
fn a_restored_guest_counts_on_from_where_it_stopped_and_its_disk_goes_on() {
    let s = kvm_scratch!("snapshot-load");
    let Snapshotted {
        disk,
        state,
        mem,
        last,
    } = boot_and_snapshot_on(&s, &json!({"vcpu_count": 2, "mem_size_mib": 128}), "Async");
    let on_disk = read(std::path::Path::new(&disk));
    assert_eq!(disk_record(&on_disk, (last % 64) as usize), Some(last));

    let mut b = ember_named(&s, "b");
    let mut c = b.client();
    // Metrics may be set before a load (they are not part of the snapshot).
    let metrics = s.path("metrics.json");
    c.put("/metrics", &json!({"metrics_path": metrics}))
        .expect(204, "");
    c.put("/snapshot/load", &load_body(&state, &mem, false))
        .expect(204, "");
    let info = c.get("/").expect(200, "").json();
    assert_eq!(info["state"], "Paused");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        ticks(&b).is_empty(),
        "a load without resume_vm stays paused"
    );
    // The configuration came with the snapshot, and so did the MMDS data.
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["machine-config"]["vcpu_count"], 2);
    assert_eq!(config["drives"][0]["path_on_host"], disk.as_str());
    assert_eq!(config["drives"][0]["io_engine"], "Async");
    let template = &config["cpu-config"]["cpuid_modifiers"][0];
    assert_eq!(template["leaf"], "0x1");
    assert_eq!(
        template["modifiers"][0]["bitmap"],
        format!("0b{}1xxx", "x".repeat(28))
    );
    assert_eq!(
        c.get("/mmds").expect(200, "").json()["latest"]["role"],
        "snapshotted"
    );
    // Only post-boot requests from here.
    c.put_machine(1, 128)
        .expect(400, "not supported after starting");
    c.put("/snapshot/load", &load_body(&state, &mem, true))
        .expect(400, "not supported after starting");

    resume(&mut c);
    let latencies = latencies(&mut c, &metrics);
    assert_timed(&latencies, "load_snapshot");
    assert_timed(&latencies, "resume_vm");
    let now = wait_tick(&b, last + 4, BOOT);
    let counted = ticks(&b);
    assert_eq!(
        counted[0],
        last + 1,
        "the count goes on from {last}: {counted:?}"
    );
    assert!(counted.windows(2).all(|w| w[1] == w[0] + 1), "{counted:?}");
    assert!(
        !b.stdout().contains("disk status="),
        "every disk write after the restore succeeded: {}",
        b.stdout()
    );
    // The disk queue went on where it was: the restored guest's records are on the disk.
    let on_disk = read(std::path::Path::new(&disk));
    for n in last + 1..=now {
        assert_eq!(disk_record(&on_disk, (n % 64) as usize), Some(n));
    }
    // Guest RAM is the memory file mapped copy-on-write: the file is as it was written.
    assert_eq!(std::fs::metadata(&mem).unwrap().len(), 128 * MIB);
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));
}

#[test]
fn bad_snapshot_files_and_requests_are_refused_and_the_ember_stays_usable() {
    let s = kvm_scratch!("snapshot-refusals");
    let Snapshotted {
        state, mem, last, ..
    } = boot_and_snapshot(&s, &json!({"vcpu_count": 2, "mem_size_mib": 128}));
    let good = read(&state);

    let b = ember_named(&s, "b");
    let mut c = b.client();
    let refused = |c: &mut common::api::Client, body: &serde_json::Value, why: &str| {
        c.put("/snapshot/load", body).expect(400, why);
    };
    let bad = s.path("bad.snap");
    let with_file = |bytes: &[u8]| {
        std::fs::write(&bad, bytes).unwrap();
        load_body(&bad, &mem, true)
    };
    refused(&mut c, &with_file(&good[..good.len() / 2]), "is truncated");
    let mut flipped = good.clone();
    flipped[good.len() / 3] ^= 0x10;
    refused(
        &mut c,
        &with_file(&flipped),
        "is damaged: its checksum does not match",
    );
    let mut other_version = good.clone();
    other_version[8] = 99;
    refused(&mut c, &with_file(&other_version), "has format version 99");
    refused(
        &mut c,
        &with_file(b"#!/bin/sh\n"),
        "is not an Ember snapshot file",
    );
    refused(
        &mut c,
        &load_body(&s.path("missing.snap"), &mem, true),
        "cannot read the snapshot file",
    );
    let short_mem = s.file("short.mem", &vec![0u8; 64 << 20]);
    refused(
        &mut c,
        &load_body(&state, std::path::Path::new(&short_mem), true),
        &format!(
            "is 67108864 bytes; the snapshot's guest memory is {} bytes",
            128 * MIB
        ),
    );
    let both = json!({
        "snapshot_path": state, "mem_file_path": mem,
        "mem_backend": {"backend_type": "File", "backend_path": mem},
    });
    refused(&mut c, &both, "not both");
    refused(
        &mut c,
        &json!({"snapshot_path": state}),
        "mem_backend is required",
    );
    let mut override_unknown = load_body(&state, &mem, true);
    override_unknown["network_overrides"] = json!([{"iface_id": "eth9", "host_dev_name": "tap9"}]);
    refused(&mut c, &override_unknown, "names interface eth9");
    let mut unknown_field = load_body(&state, &mem, true);
    unknown_field["resume"] = json!(true);
    refused(&mut c, &unknown_field, "unknown field `resume`");
    let mut bad_backend = load_body(&state, &mem, true);
    bad_backend["mem_backend"]["backend_type"] = json!("Disk");
    refused(&mut c, &bad_backend, "unknown variant `Disk`");
    assert_eq!(c.get("/").expect(200, "").json()["state"], "Not started");

    // After all that, the good snapshot loads and runs.
    c.put("/snapshot/load", &load_body(&state, &mem, true))
        .expect(204, "");
    wait_tick(&b, last + 2, BOOT);

    // A load on an ember that was configured is refused, as in Firecracker.
    let configured = ember_named(&s, "c");
    let mut c = configured.client();
    c.put_machine(1, 64).expect(204, "");
    c.put("/snapshot/load", &load_body(&state, &mem, true))
        .expect(400, "not allowed after configuring boot-specific resources");
}
