//! virtio-balloon: the inflate, deflate and statistics queues of a hostile driver.
#![no_main]
use std::sync::Arc;

use devices::virtio::balloon::{Balloon, BalloonConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dev = Balloon::new(&BalloonConfig {
        amount_mib: 1,
        deflate_on_oom: true,
        stats_polling_interval_s: 1,
        free_page_hinting: true,
        free_page_reporting: true,
        host_page_size: 4096,
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let _mem = ember_fuzz::activate(&mut dev, data);
    dev.process_pfns(0);
    dev.process_pfns(1);
    dev.process_stats();
    dev.process_reports();
    // Within a run (ID 2): the queue's blocks are given back after the driver's ID 2.
    let _ = dev.start_hinting(Default::default());
    dev.process_hints();
});
