//! Bad input on the command line or in the config file: one sentence on stderr, a non-zero
//! exit, no panic, and (where KVM runs) no guest started.

mod common;

use common::*;
use serde_json::json;

/// Runs with `config` and checks the failure shape; returns stderr.
fn refused(s: &Scratch, config: &str) -> String {
    let path = s.file("vm.json", config.as_bytes());
    let run = run_args(&["--no-api", "--config-file", &path]);
    assert_refused(&run, 1)
}

/// Firecracker's statuses: 153 for a command line it cannot parse, 152 for a bad log
/// level, 1 for any other error (a bad configuration file included).
const ARG_PARSING: i32 = 153;
const BAD_LEVEL: i32 = 152;

fn assert_refused(run: &Run, status: i32) -> String {
    run.assert_status(status);
    assert!(
        !run.stderr.contains("panicked") && !run.stderr.contains("RUST_BACKTRACE"),
        "{}",
        run.stderr
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one sentence: {:?}", run.stderr);
    assert!(lines[0].starts_with("ember: "), "{}", lines[0]);
    assert!(run.stdout.is_empty(), "no guest output: {}", run.stdout);
    lines[0].to_string()
}

fn vm(kernel: &str, extra: &serde_json::Value) -> String {
    let mut cfg = json!({"boot-source": {"kernel_image_path": kernel}});
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    cfg.to_string()
}

#[test]
fn kernel_problems() {
    let s = Scratch::new("kernel");
    let e = refused(&s, &vm("/nonexistent/vmlinux", &json!({})));
    assert!(
        e.contains("cannot read the kernel image /nonexistent/vmlinux")
            && e.contains("No such file"),
        "{e}"
    );
    let dir = s.0.to_string_lossy().into_owned();
    let e = refused(&s, &vm(&dir, &json!({})));
    assert!(
        e.contains("the kernel image") && e.contains("directory"),
        "{e}"
    );
    if kvm_or_skip("kernel_problems (format check)") {
        let junk = s.file("junk.bin", &noise(8192, 4));
        let e = refused(&s, &vm(&junk, &json!({})));
        assert_eq!(e, "ember: cannot start the microVM: the kernel image is neither an ELF vmlinux nor a bzImage");
        let empty = s.file("empty.bin", b"");
        let e = refused(&s, &vm(&empty, &json!({})));
        assert!(e.contains("neither an ELF vmlinux nor a bzImage"), "{e}");
    }
    let e = refused(
        &s,
        &json!({"boot-source": {"kernel_image_path": test_guest::PVH_ELF, "initrd_path": "/nope"}})
            .to_string(),
    );
    assert!(e.contains("cannot read the initrd /nope"), "{e}");
}

#[test]
fn machine_limits() {
    let s = Scratch::new("machine");
    let k = test_guest::PVH_ELF;
    let refused_machine = |vcpus: u32, mib: u32| {
        let machine = json!({"machine-config": {"vcpu_count": vcpus, "mem_size_mib": mib}});
        refused(&s, &vm(k, &machine))
    };
    for (vcpus, mib, sentence) in [
        (1, 0, "mem_size_mib must be at least 1"),
        (0, 128, "vcpu_count must be between 1 and 32, not 0"),
        (33, 128, "vcpu_count must be between 1 and 32, not 33"),
    ] {
        assert_eq!(refused_machine(vcpus, mib), format!("ember: {sentence}"));
    }
    let e = refused_machine(300, 128);
    assert!(
        e.contains("machine-config.vcpu_count") && e.contains("300"),
        "{e}"
    );
    if kvm_or_skip("machine_limits (memory the host cannot map)") {
        // 2 PiB: more than a 47-bit user address space can hold.
        let e = refused(
            &s,
            &vm(
                k,
                &json!({"machine-config": {"vcpu_count": 1, "mem_size_mib": 1u64 << 31}}),
            ),
        );
        assert!(
            e.contains("2147483648 MiB of guest memory cannot be mapped on this host"),
            "{e}"
        );
    }
}

#[test]
fn drive_problems() {
    let s = Scratch::new("drives");
    let k = test_guest::PVH_ELF;
    let disk = s.file("disk.img", &[0u8; 4096]);
    let d = |id: &str, path: &str, root: bool| json!({"drive_id": id, "path_on_host": path, "is_root_device": root});
    let e = refused(
        &s,
        &vm(k, &json!({"drives": [d("rootfs", "/no/such.img", true)]})),
    );
    assert!(
        e.contains("cannot read the disk image /no/such.img") && e.contains("No such file"),
        "{e}"
    );
    let e = refused(
        &s,
        &vm(
            k,
            &json!({"drives": [d("a", &disk, true), d("b", &disk, true)]}),
        ),
    );
    assert_eq!(
        e,
        "ember: drives a and b are both marked as the root device; only one may be"
    );
    let e = refused(
        &s,
        &vm(
            k,
            &json!({"drives": [d("a", &disk, true), d("a", &disk, false)]}),
        ),
    );
    assert_eq!(e, "ember: drive_id a is used by two drives");
    let e = refused(
        &s,
        &vm(k, &json!({"drives": [d("no spaces", &disk, true)]})),
    );
    assert!(e.contains("drive_id \"no spaces\""), "{e}");
}

#[test]
fn unknown_keys_and_malformed_json() {
    let s = Scratch::new("json");
    let k = test_guest::PVH_ELF;
    let e = refused(
        &s,
        &vm(
            k,
            &json!({"machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "vcpus": 2}}),
        ),
    );
    assert!(
        e.contains("machine-config") && e.contains("unknown field `vcpus`"),
        "{e}"
    );
    let e = refused(&s, &vm(k, &json!({"netwrk-interfaces": []})));
    assert!(e.contains("unknown field `netwrk-interfaces`"), "{e}");
    let e = refused(
        &s,
        &vm(
            k,
            &json!({"drives": [{"drive_id": "a", "path_on_host": k, "is_root_device": true, "rate": 1}]}),
        ),
    );
    assert!(
        e.contains("drives[0]") && e.contains("unknown field `rate`"),
        "{e}"
    );
    let e = refused(
        &s,
        "{\n  \"boot-source\": {\n    \"kernel_image_path\": \"x\"\n  ,\n}",
    );
    assert!(e.contains("line 5 column 1"), "{e}");
    let e = refused(&s, "");
    assert!(
        e.contains("EOF while parsing") && e.contains("line 1 column 0"),
        "{e}"
    );
    let e = refused(&s, r#"{"drives": []}"#);
    assert!(e.contains("missing field `boot-source`"), "{e}");
}

#[test]
fn command_line_problems() {
    let e = assert_refused(&run_args(&["--frobnicate"]), ARG_PARSING);
    assert_eq!(e, "ember: unknown argument --frobnicate; see ember --help");
    let e = assert_refused(&run_args(&["--no-api"]), ARG_PARSING);
    assert_eq!(e, "ember: --no-api needs --config-file PATH");
    let e = assert_refused(&run_args(&["--config-file"]), ARG_PARSING);
    assert_eq!(e, "ember: argument --config-file needs a value");
    let e = assert_refused(&run_args(&["--id", "a b"]), ARG_PARSING);
    assert!(e.contains("the microVM id \"a b\""), "{e}");
    let e = assert_refused(&run_args(&["--level", "chatty"]), BAD_LEVEL);
    assert!(e.contains("invalid log level"), "{e}");
    let e = assert_refused(&run_args(&["--no-api", "--config-file", "/no/vm.json"]), 1);
    assert!(
        e.contains("cannot read the configuration file /no/vm.json"),
        "{e}"
    );
}

#[test]
fn help_and_version() {
    let run = run_args(&["--version"]);
    assert_eq!(run.status, Some(0));
    assert!(run.stdout.starts_with("Ember v"), "{}", run.stdout);
    let run = run_args(&["--help"]);
    assert_eq!(run.status, Some(0));
    for flag in [
        "--api-sock",
        "--id",
        "--config-file",
        "--no-api",
        "--boot-timer",
        "--level",
        "--log-path",
    ] {
        assert!(run.stdout.contains(flag), "help lists {flag}");
    }
}
