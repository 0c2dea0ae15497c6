//! Compiles filters/x86_64.json (seccompiler's JSON format) into one BPF program per thread
//! kind, written to OUT_DIR as raw `sock_filter` arrays, so that ember starts with its
//! filters ready and never parses JSON for them at run time. The programs search for the
//! system call's rules (src/dispatch.rs), as the filters of `--seccomp-filter` do.

#[path = "src/dispatch.rs"]
mod dispatch;

use std::path::Path;

const SOURCE: &str = "filters/x86_64.json";
const THREADS: [&str; 3] = ["vmm", "api", "vcpu"];

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=src/dispatch.rs");
    let text = std::fs::read(SOURCE).expect("read the seccomp filters");
    let map = dispatch::compile(&text).unwrap_or_else(|e| panic!("{SOURCE}: {e}"));
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    for thread in THREADS {
        let program = map
            .get(thread)
            .unwrap_or_else(|| panic!("{SOURCE} has no filter for the {thread} thread"));
        let mut bytes = Vec::with_capacity(program.len() * 8);
        for insn in program {
            bytes.extend_from_slice(&insn.code.to_le_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend_from_slice(&insn.k.to_le_bytes());
        }
        std::fs::write(Path::new(&out).join(format!("{thread}.bpf")), bytes)
            .expect("write the compiled filter");
    }
}
