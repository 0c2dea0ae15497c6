//! `rebase-snap --base-file BASE --diff-file DIFF`: layers a Diff snapshot's memory file onto
//! its base (Firecracker's tool of the same name and flags). BASE is changed in place and
//! becomes the memory file of the diff's snapshot.

use std::process::ExitCode;

const USAGE: &str = "usage: rebase-snap --base-file BASE --diff-file DIFF";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut base, mut diff) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--base-file" => &mut base,
            "--diff-file" => &mut diff,
            "--help" | "-h" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("rebase-snap: unknown argument {other}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        match it.next() {
            Some(value) => *slot = Some(value.clone()),
            None => {
                eprintln!("rebase-snap: {flag} needs a value\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(base), Some(diff)) = (base, diff) else {
        eprintln!("rebase-snap: both --base-file and --diff-file are required\n{USAGE}");
        return ExitCode::from(2);
    };
    match vmm::snapshot::rebase::rebase(&base, &diff) {
        Ok(bytes) => {
            println!("rebase-snap: copied {bytes} bytes of {diff} onto {base}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rebase-snap: {e}");
            ExitCode::FAILURE
        }
    }
}
