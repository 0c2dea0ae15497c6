//! `--config-file`: the whole microVM's configuration as JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = vmm::resources::VmResources::from_json(text);
    }
});
