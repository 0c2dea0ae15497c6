//! `PUT /snapshot/create`: a paused test guest's vCPU and VM state go into the versioned state
//! file and its RAM into the memory file, and the guest goes on after Resume. The refusals:
//! before boot, while running, and a Diff snapshot without dirty page tracking.

mod common;

use std::time::Duration;

use common::api::Ember;
use common::snapshot::{assert_timed, latencies};
use common::*;
use serde_json::json;
use vmm::snapshot::file;
use vmm::snapshot::MicrovmState;

const BOOT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

#[test]
fn a_paused_guest_is_saved_to_the_state_and_memory_files_and_goes_on_after_resume() {
    if !kvm_or_skip(
        "a_paused_guest_is_saved_to_the_state_and_memory_files_and_goes_on_after_resume",
    ) {
        return;
    }
    let s = Scratch::new("snapshot-create");
    let mut ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let metrics = s.path("metrics.json");
    c.put("/metrics", &json!({"metrics_path": metrics}))
        .expect(204, "");
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 128}),
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks"}),
        &[],
    );
    let (state, mem) = (s.path("vm.snap"), s.path("vm.mem"));
    let body = json!({"snapshot_path": state, "mem_file_path": mem});
    c.put("/snapshot/create", &body)
        .expect(400, "not supported before starting");
    c.instance_start();
    ember.wait_for("guest: tick 2", BOOT);
    c.put("/snapshot/create", &body)
        .expect(400, "only be created of a paused microVM");

    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");
    let diff = json!({"snapshot_path": state, "mem_file_path": mem, "snapshot_type": "Diff"});
    c.put("/snapshot/create", &diff)
        .expect(400, "a Diff snapshot needs dirty page tracking");
    c.put(
        "/snapshot/create",
        &json!({"snapshot_path": state, "mem_file_path": mem, "snapshot_type": "Half"}),
    )
    .expect(400, "unknown variant `Half`");
    std::thread::sleep(Duration::from_millis(100));
    let paused_at = ember.ticks();
    c.put("/snapshot/create", &body).expect(204, "");
    assert_eq!(ember.ticks(), paused_at, "the guest stayed paused");
    // Firecracker's latencies_us: the pause and the snapshot, not the refused Diff.
    let latencies = latencies(&mut c, &metrics);
    assert_timed(&latencies, "pause_vm");
    assert_timed(&latencies, "full_create_snapshot");
    assert_eq!(latencies["diff_create_snapshot"], 0);
    assert_eq!(latencies["vmm_load_snapshot"], 0);

    // The memory file is guest RAM: 128 MiB, holding the command line the guest was given.
    let ram = read(&mem);
    assert_eq!(ram.len() as u64, 128 * MIB);
    let cmdline = b"console=ttyS0 ticks";
    assert!(ram.windows(cmdline.len()).any(|w| w == cmdline));
    // The state file: both vCPUs, in long mode, and the VM's clock.
    let saved: MicrovmState = file::load(&state).unwrap();
    assert_eq!(saved.vcpus.len(), 2);
    assert_eq!(saved.memory.iter().map(|r| r.1).sum::<u64>(), 128 * MIB);
    let boot = &saved.vcpus[0];
    assert_ne!(boot.sregs.efer & (1 << 10), 0, "long mode active");
    assert_ne!(boot.sregs.cr0 & (1 << 31), 0, "paging on");
    assert!(boot.regs.rip != 0);
    assert!(boot.msrs.len() > 10, "{} MSRs", boot.msrs.len());
    assert!(saved.vm.clock.clock > 0);
    // A damaged state file is refused with its reason.
    let mut bytes = read(&state);
    let last = bytes.len() - 20;
    bytes[last] ^= 1;
    std::fs::write(&state, &bytes).unwrap();
    let e = file::load::<MicrovmState>(&state).unwrap_err().to_string();
    assert!(e.contains("damaged"), "{e}");

    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
    ember.wait_for(&format!("guest: tick {}", paused_at + 2), BOOT);
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
}
