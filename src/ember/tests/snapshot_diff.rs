//! Diff snapshots: with dirty page tracking, a snapshot taken after a Full one holds only the
//! pages written since (a sparse file, much smaller on disk), and `rebase-snap` layers it on
//! the Full one's memory file to restore the later state.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::output_of;
use common::snapshot::*;
use serde_json::json;

const BOOT: Duration = Duration::from_secs(30);
const REBASE_SNAP: &str = env!("CARGO_BIN_EXE_rebase-snap");

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn a_diff_snapshot_is_small_and_restores_the_later_state_on_its_base() {
    let s = kvm_scratch!("snapshot-diff");
    let disk = s.file("disk.img", &vec![0u8; 1 << 20]);
    let mut a = ember_named(&s, "a");
    let mut c = a.client();
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 128, "track_dirty_pages": true}),
        &json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks disklog"}),
        &[("rootfs", &disk, false)],
    );
    c.instance_start();
    wait_tick(&a, 2, BOOT);
    pause(&mut c);
    let (base_state, base_mem) = (s.path("base.snap"), s.path("base.mem"));
    create(&mut c, &base_state, &base_mem, "Full");
    let base_tick = *ticks(&a).last().unwrap();
    resume(&mut c);
    wait_tick(&a, base_tick + 3, BOOT);
    pause(&mut c);
    std::thread::sleep(Duration::from_millis(50));
    let diff_tick = *ticks(&a).last().unwrap();
    let (diff_state, diff_mem) = (s.path("diff.snap"), s.path("diff.mem"));
    create(&mut c, &diff_state, &diff_mem, "Diff");
    assert_eq!(a.terminate(), Some(128 + libc::SIGTERM));

    // The same size, but only the written pages are on disk.
    let (full, diff) = (allocated(&base_mem), allocated(&diff_mem));
    assert_eq!(
        std::fs::metadata(&diff_mem).unwrap().len(),
        std::fs::metadata(&base_mem).unwrap().len()
    );
    eprintln!("full memory file: {full} bytes on disk; diff: {diff} bytes");
    assert!(diff > 0, "the guest wrote pages between the snapshots");
    assert!(diff * 50 < full, "diff {diff} bytes vs full {full}");

    // Layered on a copy of the base, the diff restores the later state.
    let merged = s.path("merged.mem");
    std::fs::copy(&base_mem, &merged).unwrap();
    output_of(
        Command::new(REBASE_SNAP)
            .args(["--base-file", merged.to_str().unwrap(), "--diff-file"])
            .arg(&diff_mem),
        "rebase-snap",
    );
    let mut b = ember_named(&s, "b");
    let mut c = b.client();
    c.put("/snapshot/load", &load_body(&diff_state, &merged, true))
        .expect(204, "");
    wait_tick(&b, diff_tick + 3, BOOT);
    let counted = ticks(&b);
    assert_eq!(counted[0], diff_tick + 1, "{counted:?}");
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));

    // A rebase-snap misuse is refused with its reason.
    let out = Command::new(REBASE_SNAP)
        .args(["--base-file", &disk, "--diff-file"])
        .arg(&diff_mem)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the same size"));
}
