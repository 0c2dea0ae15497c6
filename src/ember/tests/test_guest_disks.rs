//! virtio-blk end to end: the test guest's own driver reads, writes, flushes and asks for the
//! ID of each disk, with each I/O engine (Sync on the VMM thread, Async through io_uring);
//! the image files are checked after ember exits.

mod common;

use common::*;
use serde_json::json;

const HEAD: usize = 4096;

fn drive(id: &str, path: &str, root: bool, ro: bool) -> serde_json::Value {
    json!({"drive_id": id, "path_on_host": path, "is_root_device": root, "is_read_only": ro})
}

/// Both engines; Async where the host kernel has io_uring.
const ENGINES: [&str; 2] = ["Sync", "Async"];

/// `drives` with every one on `engine`.
fn with_engine(engine: &str, drives: &[serde_json::Value]) -> serde_json::Value {
    let mut cfg = config(drives);
    for d in cfg["drives"].as_array_mut().unwrap() {
        d["io_engine"] = json!(engine);
    }
    cfg
}

/// Boots the test guest with `drives` on `engine`, to its clean exit.
fn boot_on(s: &Scratch, engine: &str, drives: &[serde_json::Value]) -> Run {
    let run = run_config(s, &with_engine(engine, drives));
    run.assert_clean_exit();
    run
}

/// Boots on `engine`, in a scratch directory tagged `tag`, with a root drive and a second
/// drive `id` (`{id}.img`), both `read_only` or not, each 64 KiB of noise (seeds `seed` and
/// `seed + 1`). Returns the directory, the run and the second image's bytes as they were.
fn boot_with_data_drive(
    tag: &str,
    engine: &str,
    id: &str,
    read_only: bool,
    seed: u64,
) -> (Scratch, Run, Vec<u8>) {
    let s = Scratch::new(tag);
    let root = s.file("root.img", &noise(64 << 10, seed));
    let bytes = noise(64 << 10, seed + 1);
    let data = s.file(&format!("{id}.img"), &bytes);
    let drives = [
        drive("rootfs", &root, true, read_only),
        drive(id, &data, false, read_only),
    ];
    let run = boot_on(&s, engine, &drives);
    (s, run, bytes)
}

fn config(drives: &[serde_json::Value]) -> serde_json::Value {
    json!({
        "boot-source": {"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 nosmp"},
        "drives": drives,
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128}
    })
}

#[test]
fn a_write_to_a_data_disk_lands_in_its_image_byte_for_byte() {
    require_kvm!();
    for engine in ENGINES {
        let s = Scratch::new("write");
        let root_bytes = noise(1 << 20, 11);
        let root = s.file("root.img", &root_bytes);
        let data = s.file("data.img", &vec![0u8; 512 << 10]);
        let run = boot_on(
            &s,
            engine,
            &[
                drive("data", &data, false, false),
                drive("rootfs", &root, true, false),
            ],
        );
        // The root drive is first, whatever the order in the file.
        assert!(
            run.line("blk0 id=")
                .starts_with("blk0 id=rootfs sectors=2048 ro=0"),
            "{}",
            run.stdout
        );
        assert_eq!(
            run.value("blk0 read", "fnv"),
            format!("{:#x}", fnv1a(&root_bytes[..HEAD]))
        );
        assert_eq!(run.value("blk0 read", "used"), (HEAD + 1).to_string());
        assert_eq!(run.value("blk1 write", "status"), "0");
        assert_eq!(run.value("blk1 readback", "match"), "1");
        assert_eq!(run.value("blk1 flush", "status"), "0");
        let after = read(&s.path("data.img"));
        assert_eq!(after.len(), 512 << 10, "the image keeps its size");
        assert_eq!(
            fnv1a(&after[..HEAD]),
            fnv1a(&root_bytes[..HEAD]),
            "guest-written bytes are in the file"
        );
        assert_eq!(&after[..HEAD], &root_bytes[..HEAD]);
        assert!(
            after[HEAD..].iter().all(|&b| b == 0),
            "nothing else changed"
        );
        assert!(run.line("cmdline=").contains("root=/dev/vda rw"));
    }
}

#[test]
fn a_read_only_drive_refuses_writes_and_its_image_is_unchanged() {
    require_kvm!();
    for engine in ENGINES {
        let (s, run, ro_bytes) = boot_with_data_drive("ro", engine, "golden", true, 3);
        assert_eq!(run.value("blk1 id=", "ro"), "1", "VIRTIO_BLK_F_RO offered");
        assert_eq!(run.value("blk1 write", "status"), "1", "VIRTIO_BLK_S_IOERR");
        assert_eq!(run.value("blk1 readback", "match"), "0");
        assert_eq!(
            read(&s.path("golden.img")),
            ro_bytes,
            "the read-only image is unchanged"
        );
        assert!(run.line("cmdline=").contains("root=/dev/vda ro"));
    }
}

#[test]
fn data_disks_show_their_drive_ids_as_serials() {
    let s = kvm_scratch!("ids");
    let root = s.file("root.img", &noise(64 << 10, 1));
    let a = s.file("a.img", &[0u8; 8192]);
    let b = s.file("b.img", &[0u8; 4096 + 512 + 100]);
    let long_id = "a_twenty_four_char_id_x"; // longer than the 20-byte virtio ID field
    let run = run_config(
        &s,
        &config(&[
            drive("rootfs", &root, true, false),
            drive("scratch_1", &a, false, false),
            drive(long_id, &b, false, false),
        ]),
    );
    run.assert_clean_exit();
    assert_eq!(run.value("blk1 id=", "id"), "scratch_1");
    assert_eq!(run.value("blk2 id=", "id"), &long_id[..20]);
    assert_eq!(
        run.value("blk2 id=", "sectors"),
        "9",
        "a trailing partial sector is not exposed"
    );
    assert_eq!(run.line("disks="), "disks=3");
    let expected = "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 virtio_mmio.device=4K@0xd0002000:7";
    assert!(
        run.line("cmdline=").ends_with(expected),
        "{}",
        run.line("cmdline=")
    );
}

#[test]
fn bad_requests_from_the_guest_get_device_errors_and_leave_the_disk_alone() {
    require_kvm!();
    for engine in ENGINES {
        let (s, run, data_bytes) = boot_with_data_drive("hostile", engine, "data", false, 9);
        for disk in ["blk0", "blk1"] {
            assert_eq!(
                run.value(&format!("{disk} pastend"), "status"),
                "1",
                "read past the end"
            );
            assert_eq!(
                run.value(&format!("{disk} straddle"), "status"),
                "1",
                "read across the end"
            );
            assert_eq!(
                run.value(&format!("{disk} badtype"), "status"),
                "2",
                "unsupported type"
            );
            // A buffer outside guest memory: the chain is returned unused, status untouched.
            assert_eq!(run.value(&format!("{disk} wild"), "status"), "0xff");
            assert_eq!(run.value(&format!("{disk} wild"), "used"), "0");
        }
        // Only the guest's own 4 KiB copy reached the data disk.
        let after = read(&s.path("data.img"));
        assert_eq!(&after[HEAD..], &data_bytes[HEAD..]);
    }
}

/// On a host whose kernel has no io_uring (here: ember started under a seccomp filter that
/// answers io_uring_setup with ENOSYS, as such a kernel does), an Async drive is refused
/// with a sentence that says so, before anything starts; Sync drives run.
#[test]
fn async_drives_need_io_uring_and_say_so_where_the_kernel_lacks_it() {
    use std::os::unix::process::CommandExt;
    let s = Scratch::new("no-uring");
    let data = s.file("data.img", &[0u8; 4096]);
    let filter = seccompiler::SeccompFilter::new(
        [(libc::SYS_io_uring_setup, vec![])].into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::ENOSYS as u32),
        seccompiler::TargetArch::x86_64,
    )
    .unwrap();
    let program: seccompiler::BpfProgram = filter.try_into().unwrap();
    for (engine, refused) in [("Async", true), ("Sync", false)] {
        let cfg = with_engine(engine, &[drive("data", &data, false, false)]);
        let path = s.file("vm.json", cfg.to_string().as_bytes());
        let program = program.clone();
        let mut command = std::process::Command::new(EMBER);
        command.args(["--no-api", "--config-file", &path]);
        // SAFETY: between fork and exec the child only installs a compiled filter (prctl and
        // seccomp system calls on memory it already holds).
        unsafe {
            command.pre_exec(move || {
                seccompiler::apply_filter(&program).map_err(std::io::Error::other)
            });
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if refused {
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert_eq!(
                stderr.trim(),
                "ember: drive data: io_engine Async needs io_uring, which this host's kernel does not offer (Function not implemented (os error 38)); use Sync"
            );
        } else if kvm_or_skip("async_drives_need_io_uring (the Sync drive boots)") {
            assert_eq!(out.status.code(), Some(0), "{stderr}");
        }
    }
}
