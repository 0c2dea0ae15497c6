//! The jailer's command line: NUL-separated arguments.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../src/jailer/src/args.rs"]
mod args;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let argv = text.split('\0').map(str::to_string);
    let _ = args::parse(argv);
});
