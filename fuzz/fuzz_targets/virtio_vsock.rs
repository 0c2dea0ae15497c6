//! virtio-vsock: a hostile driver's TX packets (requests, data, shutdowns, resets to any
//! port), then the RX queue the device answers on.
#![no_main]
use std::sync::{Arc, OnceLock};

use devices::virtio::vsock::{Vsock, VsockConfig};
use libfuzzer_sys::fuzz_target;

fn uds() -> &'static std::path::Path {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("ember-fuzz-vsock-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = std::fs::remove_file(uds());
    let listener = std::os::unix::net::UnixListener::bind(uds()).unwrap();
    let mut dev = Vsock::new(VsockConfig {
        guest_cid: 3,
        uds_path: uds().to_path_buf(),
        listener,
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let _mem = ember_fuzz::activate(&mut dev, data);
    dev.process_tx();
    dev.process_rx();
});
