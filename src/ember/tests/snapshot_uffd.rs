//! The `Uffd` memory backend: ember hands a userfaultfd and the guest memory regions to a
//! page-fault handler over a Unix socket (Firecracker's hand-over), and the restored guest
//! runs on the pages the handler copies in from the memory file, only those it touches.

mod common;

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

use common::snapshot::*;
use common::*;
use serde_json::json;
use test_support::uffd_handler::Handler;
use vmm::snapshot::uffd::RegionMapping;

type Served = std::thread::JoinHandle<(Vec<RegionMapping>, u64)>;

/// A page-fault handler serving `mem` at a socket in `s`, on a thread that ends with ember
/// (returning the regions ember sent and the pages it copied), and the load request that
/// restores `state` through it.
fn serve_memory_file(s: &Scratch, mem: &Path, state: &Path) -> (Served, serde_json::Value) {
    let sock = s.path("uffd.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let memory_file = File::open(mem).unwrap();
    let handler = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut handler = Handler::accept(&stream, &memory_file).unwrap();
        let regions = handler.regions().to_vec();
        handler.serve().unwrap();
        (regions, handler.pages_copied)
    });
    let body = json!({
        "snapshot_path": state,
        "mem_backend": {"backend_type": "Uffd", "backend_path": sock},
        "resume_vm": true,
    });
    (handler, body)
}

/// `b` loads the snapshot with `body` and resumes: its guest counts on from `last`.
fn loads_and_counts_on(b: &common::api::Ember, body: &serde_json::Value, last: u64) {
    b.client().put("/snapshot/load", body).expect(204, "");
    wait_tick(b, last + 3, Duration::from_secs(30));
    assert_eq!(ticks(b)[0], last + 1);
}

#[test]
fn a_guest_restored_through_a_page_fault_handler_counts_on() {
    let s = kvm_scratch!("snapshot-uffd");
    let machine = json!({"vcpu_count": 2, "mem_size_mib": 128});
    let Snapshotted {
        state, mem, last, ..
    } = boot_and_snapshot(&s, &machine);

    let (handler, body) = serve_memory_file(&s, &mem, &state);
    let mut b = ember_named(&s, "b");
    loads_and_counts_on(&b, &body, last);
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));

    let (regions, pages) = handler.join().unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].size, 128 << 20);
    assert_eq!(
        (regions[0].page_size, regions[0].page_size_kib),
        (4096, 4096)
    );
    eprintln!("the handler copied {pages} pages of 32768");
    assert!(pages > 0 && pages < 32768 / 4, "{pages} pages");

    // No handler at the socket: a clear refusal, and the ember can still load from a file.
    let c2 = ember_named(&s, "c");
    let mut c = c2.client();
    c.put("/snapshot/load", &body)
        .expect(400, "cannot reach the page-fault handler");
}

#[test]
fn a_guest_on_huge_pages_restores_through_a_page_fault_handler_only() {
    require_kvm!();
    let _pool = or_skip!(huge_pages::huge_pages_or_skip, 64);
    let s = Scratch::new("snapshot-uffd-huge");
    let machine = json!({"vcpu_count": 1, "mem_size_mib": 128, "huge_pages": "2M"});
    let Snapshotted {
        state, mem, last, ..
    } = boot_and_snapshot(&s, &machine);

    // A private mapping of the file cannot be hugetlbfs: Firecracker's refusal.
    let b = ember_named(&s, "b");
    let mut c = b.client();
    c.put("/snapshot/load", &load_body(&state, &mem, true))
        .expect(
            400,
            "Cannot restore hugetlbfs backed snapshot by mapping the memory file. Please use uffd.",
        );
    drop(b);

    let (handler, body) = serve_memory_file(&s, &mem, &state);
    let mut b = ember_named(&s, "c");
    loads_and_counts_on(&b, &body, last);
    assert_eq!(huge_pages::huge_mapped_kib(b.child.id()), 128 << 10);
    assert_eq!(b.client().get("/machine-config").json()["huge_pages"], "2M");
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));

    // The handler was told 2 MiB pages (in both fields, as Firecracker tells it) and filled
    // whole ones.
    let (regions, pages) = handler.join().unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(
        (regions[0].page_size, regions[0].page_size_kib),
        (2 << 20, 2 << 20)
    );
    eprintln!("the handler copied {pages} huge pages of 64");
    assert!(pages > 0 && pages <= 64, "{pages} pages");
}
