//! `PUT /snapshot/load`: the snapshot state file (header, length, checksum, state).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vmm::snapshot::file::decode::<vmm::snapshot::MicrovmState>("fuzz", data);
});
