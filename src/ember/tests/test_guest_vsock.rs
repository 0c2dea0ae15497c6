//! vsock against a hostile driver: the test guest sends cut headers, lengths past its
//! buffers, wrong CIDs, unknown ops and types, device-writable, wild and looping chains;
//! ember answers what deserves an RST, drops the rest, and still connects the guest's real
//! request to the host socket `<uds_path>_1234`, which gets the guest's message.

mod common;

use std::io::Read;
use std::os::unix::net::UnixListener;

use common::*;
use serde_json::json;

#[test]
fn hostile_vsock_packets_do_not_stop_ember_or_the_device() {
    let s = kvm_scratch!("vsock-hostile");
    let uds = s.path("v.sock");
    let listener = UnixListener::bind(format!("{}_1234", uds.display())).unwrap();
    let host = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        String::from_utf8_lossy(&got).into_owned()
    });
    let metrics = s.path("metrics.json");
    let config = json!({
        "boot-source": {"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 nosmp"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128},
        "vsock": {"guest_cid": 42, "uds_path": uds.to_str().unwrap()},
        "metrics": {"metrics_path": metrics.to_str().unwrap()}
    });
    let run = run_config(&s, &config);
    run.assert_clean_exit();
    assert_eq!(run.line("vsock cid="), "vsock cid=42");
    // Every chain came back used (13 of them), however bad.
    assert_eq!(run.line("vsock hostile"), "vsock hostile sent=13");
    assert_eq!(run.line("vsock rsts="), "vsock rsts=3 responses=1");
    assert_eq!(run.line("vsock message"), "vsock message sent=1");
    assert_eq!(host.join().unwrap(), "hello from the test guest");
    let lines = metrics_lines(&metrics);
    // Refused: the cut header, two bad lengths, the writable and the wild buffer (5); from
    // CID 77 (the looping chain, the one with a next past the table, and the plain one) and
    // to CID 4 (4); the seqpacket (1).
    assert_eq!(metric_sum(&lines, "vsock", "invalid_packets"), 10);
}
