//! One snapshot, 20 clones at once: each ember loads it paused, is given its own copy of the
//! disk (`PATCH /drives`, as with Firecracker), and resumes; each goes on counting into its
//! own disk, the snapshot's disk stays as it was, and pausing one leaves the others running.

mod common;

use std::path::Path;
use std::time::Duration;

use common::snapshot::*;
use common::*;
use serde_json::json;

const CLONES: usize = 20;
const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn twenty_clones_of_one_snapshot_run_independently_each_on_its_own_disk() {
    let s = kvm_scratch!("snapshot-clones");
    let machine = json!({"vcpu_count": 1, "mem_size_mib": 128});
    let Snapshotted {
        disk,
        state,
        mem,
        last,
    } = boot_and_snapshot(&s, &machine);
    let disk_at_snapshot = read(Path::new(&disk));

    let mut clones = Vec::new();
    for i in 0..CLONES {
        let overlay = s.file(&format!("overlay{i}.img"), &disk_at_snapshot);
        let ember = ember_named(&s, &format!("clone{i}"));
        let mut c = ember.client();
        c.put("/snapshot/load", &load_body(&state, &mem, false))
            .expect(204, "");
        c.patch(
            "/drives/rootfs",
            &json!({"drive_id": "rootfs", "path_on_host": overlay}),
        )
        .expect(204, "");
        clones.push((ember, c, overlay));
    }
    for (_, c, _) in &mut clones {
        resume(c);
    }
    for (ember, _, overlay) in &clones {
        let now = wait_tick(ember, last + 3, DEADLINE);
        let counted = ticks(ember);
        assert_eq!(counted[0], last + 1, "{counted:?}");
        let on_disk = read(Path::new(overlay));
        for n in last + 1..=now {
            assert_eq!(
                disk_record(&on_disk, (n % 64) as usize),
                Some(n),
                "{overlay}"
            );
        }
    }
    assert_eq!(
        read(Path::new(&disk)),
        disk_at_snapshot,
        "the snapshot's disk is untouched"
    );

    // Clone 0 paused; clone 1 counts on without it.
    pause(&mut clones[0].1);
    std::thread::sleep(Duration::from_millis(100));
    let held = *ticks(&clones[0].0).last().unwrap();
    let other = *ticks(&clones[1].0).last().unwrap();
    wait_tick(&clones[1].0, other + 3, DEADLINE);
    assert_eq!(*ticks(&clones[0].0).last().unwrap(), held);
    for (mut ember, _, _) in clones {
        assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
    }
}
