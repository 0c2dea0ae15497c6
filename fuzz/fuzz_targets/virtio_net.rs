//! virtio-net: a hostile driver's TX frames (to a TAP, and to the MMDS when addressed to it),
//! then the RX queue. The TAP lives in a network namespace of the fuzzer's own, made at start
//! and gone with the process.
#![no_main]
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, Once};

use devices::virtio::net::{MmdsLink, Net, NetConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static NETNS: Once = Once::new();
    NETNS.call_once(|| {
        // SAFETY: unshare takes no pointers; a new network namespace for this process only.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "the net target needs root (CLONE_NEWNET)");
        for args in [
            &["tuntap", "add", "fuzz0", "mode", "tap"][..],
            &["link", "set", "fuzz0", "up"],
        ] {
            let ok = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap()
                .success();
            assert!(ok, "ip {args:?}");
        }
    });
    let mut store = mmds::DataStore::new(4096);
    let _ = store.put(serde_json::json!({"latest": {"id": "i-1"}}));
    let mut dev = Net::new(&NetConfig {
        id: "fuzz".into(),
        tap: "fuzz0".into(),
        guest_mac: Some([6, 0, 0, 0, 0, 1]),
        mtu: None,
        mmds: Some(MmdsLink {
            ip: Ipv4Addr::new(169, 254, 169, 254),
            store: Arc::new(Mutex::new(store)),
        }),
        rx_limiter: Default::default(),
        tx_limiter: Default::default(),
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let _mem = ember_fuzz::activate(&mut dev, data);
    dev.process_tx();
    dev.process_rx();
});
