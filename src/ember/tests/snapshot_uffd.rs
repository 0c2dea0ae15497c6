//! The `Uffd` memory backend: ember hands a userfaultfd and the guest memory regions to a
//! page-fault handler over a Unix socket (Firecracker's hand-over), and the restored guest
//! runs on the pages the handler copies in from the memory file, only those it touches.

mod common;

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use common::snapshot::*;
use common::*;
use serde_json::json;
use vmm::snapshot::uffd_handler::Handler;

#[test]
fn a_guest_restored_through_a_page_fault_handler_counts_on() {
    if !kvm_or_skip("a_guest_restored_through_a_page_fault_handler_counts_on") {
        return;
    }
    let s = Scratch::new("snapshot-uffd");
    let machine = json!({"vcpu_count": 2, "mem_size_mib": 128});
    let Snapshotted {
        state, mem, last, ..
    } = boot_and_snapshot(&s, &machine);

    let sock = s.path("uffd.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let memory_file = File::open(&mem).unwrap();
    let handler = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut handler = Handler::accept(&stream, &memory_file).unwrap();
        let regions = handler.regions().to_vec();
        handler.serve().unwrap();
        (regions, handler.pages_copied)
    });

    let mut b = ember_named(&s, "b");
    let mut c = b.client();
    let body = json!({
        "snapshot_path": state,
        "mem_backend": {"backend_type": "Uffd", "backend_path": sock},
        "resume_vm": true,
    });
    c.put("/snapshot/load", &body).expect(204, "");
    wait_tick(&b, last + 3, Duration::from_secs(30));
    assert_eq!(ticks(&b)[0], last + 1);
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));

    let (regions, pages) = handler.join().unwrap();
    assert_eq!(regions.len(), 1);
    assert_eq!(regions[0].size, 128 << 20);
    assert_eq!(regions[0].page_size, 4096);
    eprintln!("the handler copied {pages} pages of 32768");
    assert!(pages > 0 && pages < 32768 / 4, "{pages} pages");

    // No handler at the socket: a clear refusal, and the ember can still load from a file.
    let c2 = ember_named(&s, "c");
    let mut c = c2.client();
    c.put("/snapshot/load", &body)
        .expect(400, "cannot reach the page-fault handler");
}
