//! virtio-rng: a hostile driver's request queue.
#![no_main]
use std::sync::Arc;

use devices::virtio::rng::{Entropy, EntropyConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dev = Entropy::new(&EntropyConfig {
        limiter: Default::default(),
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let _mem = ember_fuzz::activate(&mut dev, data);
    dev.process_queue();
});
