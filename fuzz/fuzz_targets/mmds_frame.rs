//! The MMDS's network stack: Ethernet frames from the guest (ARP, IPv4, TCP, HTTP), several per
//! input so that a TCP connection can get as far as a request.
#![no_main]
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use mmds::{DataStore, MmdsStack};

fuzz_target!(|data: &[u8]| {
    let mut store = DataStore::new(4096);
    let _ = store.put(serde_json::json!({"latest": {"meta-data": {"id": "i-1"}}}));
    let mut stack = MmdsStack::new(
        Ipv4Addr::new(169, 254, 169, 254),
        Arc::new(Mutex::new(store)),
    );
    // Frames are length-prefixed (two bytes, little-endian).
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        let frame = &rest[..len.min(rest.len())];
        rest = &rest[frame.len()..];
        stack.receive(frame);
        stack.poll();
        while stack.has_frames() {
            let _ = stack.next_frame();
            stack.pop_frame();
        }
    }
});
