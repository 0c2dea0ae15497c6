//! virtio-blk: a hostile driver's request queue against a 64 KiB disk image.
#![no_main]
use std::sync::{Arc, OnceLock};

use devices::virtio::block::{Block, BlockConfig, CacheType, IoEngine};
use libfuzzer_sys::fuzz_target;

fn disk() -> &'static std::path::Path {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("ember-fuzz-disk-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 64 << 10]).unwrap();
        path
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut dev = Block::new(&BlockConfig {
        id: "fuzz".into(),
        path: disk().to_path_buf(),
        read_only: flags & 1 != 0,
        cache: if flags & 2 != 0 {
            CacheType::Writeback
        } else {
            CacheType::Unsafe
        },
        // Bit 2: the Async engine (io_uring), whose requests are waited for.
        engine: if flags & 4 != 0 {
            IoEngine::Async
        } else {
            IoEngine::Sync
        },
        limiter: Default::default(),
        metrics: Arc::new(Default::default()),
    })
    .unwrap();
    let _mem = ember_fuzz::activate(&mut dev, rest);
    dev.process_queue();
    dev.drain();
});
