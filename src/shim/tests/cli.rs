//! The shim binary as containerd runs it, without containerd: its command line, and the
//! `delete` action containerd runs after a shim died.

use std::path::PathBuf;
use std::process::Command;

const SHIM: &str = env!("CARGO_BIN_EXE_containerd-shim-ember-v2");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shim-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The shim's name for a sandbox's directory: FNV-1a (64 bits) of namespace, NUL, ID.
fn sandbox_name(namespace: &str, id: &str) -> String {
    let bytes = namespace.bytes().chain([0]).chain(id.bytes());
    let hash = bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[test]
fn without_a_namespace_the_shim_says_so_and_fails() {
    let out = Command::new(SHIM)
        .env("TTRPC_ADDRESS", "/nonexistent")
        .args(["-id", "c1", "start"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("namespace cannot be empty"), "{err}");
}

#[test]
fn delete_after_a_dead_shim_removes_its_sandbox_and_spares_other_processes() {
    let dir = scratch("delete");
    let state = dir.join("state");
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"annotations": {"io.kubernetes.cri.sandbox-id": "pod7"}}"#,
    )
    .unwrap();
    let config = dir.join("shim.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"kernel": "/k", "rootfs": "/r", "state_dir": "{}"}}"#,
            state.display()
        ),
    )
    .unwrap();
    // The sandbox's pid file names a process that is not its ember (a reused pid): it
    // must survive; the sandbox's directory goes.
    let mut bystander = Command::new("sleep").arg("30").spawn().unwrap();
    let sandbox = state.join(sandbox_name("ns1", "pod7"));
    std::fs::create_dir_all(&sandbox).unwrap();
    std::fs::write(sandbox.join("ember.pid"), bystander.id().to_string()).unwrap();
    let out = Command::new(SHIM)
        .current_dir(&bundle)
        .env("TTRPC_ADDRESS", "/nonexistent")
        .env("EMBER_SHIM_CONFIG", &config)
        .args(["-namespace", "ns1", "-id", "c1", "delete"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sandbox.exists(), "the sandbox directory is left");
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "another process was killed"
    );
    // The answer is a protobuf DeleteResponse: exit_status (field 2) 137.
    assert!(
        out.stdout.windows(2).any(|w| w == [0x10, 137]),
        "{:?}",
        out.stdout
    );
    bystander.kill().unwrap();
    let _ = bystander.wait();
    std::fs::remove_dir_all(&dir).unwrap();
}
