//! The same acceptance checks with a real Linux guest (the kernel, rootfs and initramfs that
//! guest/build.sh makes), on any KVM host, kvm_pvm included (docs/pvm.md).

mod common;

use common::linux::*;
use common::*;
use serde_json::json;
use std::path::Path;

fn boot(
    img: &Images,
    s: &Scratch,
    kernel: &str,
    extra_args: &str,
    vcpus: u8,
    mem: u64,
    drives: &[serde_json::Value],
) -> Run {
    let root = s.path("rootfs.ext4");
    std::fs::copy(img.file("rootfs.ext4"), &root).unwrap();
    let mut all = vec![json!({"drive_id": "rootfs", "path_on_host": root, "is_root_device": true})];
    all.extend_from_slice(drives);
    let cfg = json!({
        "boot-source": {"kernel_image_path": img.file(kernel), "boot_args": format!("{} {extra_args}", base_args(all_on_pci()))},
        "drives": all,
        "machine-config": {"vcpu_count": vcpus, "mem_size_mib": mem},
    });
    let run = run_config_within(s, &cfg, linux_deadline());
    run.assert_status(0);
    assert!(
        run.stdout.contains("EMBER-INIT-OK"),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    run
}

/// The value of `key=` on the init's report line.
fn report(run: &Run, key: &str) -> String {
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("ember-linux: cpus="))
        .expect("report line");
    line.split(' ')
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn linux_sees_the_vcpus_and_memory() {
    let img = linux_images!();
    for n in [1u8, 2, 4] {
        let s = Scratch::new("linux-cpus");
        let run = boot(&img, &s, "vmlinux", "", n, 256, &[]);
        assert_eq!(report(&run, "cpus"), n.to_string());
    }
    for mib in [128u64, 4096] {
        let s = Scratch::new("linux-mem");
        let run = boot(&img, &s, "vmlinux", "", 1, mib, &[]);
        // The kernel's "Memory: <available>K/<total>K available": the total is all the RAM it
        // found, the whole configured size less the legacy holes below 1 MiB.
        let total_kib: u64 = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("Memory: "))
            .and_then(|rest| rest.split('/').nth(1))
            .and_then(|t| t.split('K').next())
            .and_then(|t| t.parse().ok())
            .expect("the kernel's Memory: line");
        assert!(
            total_kib <= mib * 1024 && total_kib > mib * 1024 - 1024,
            "{mib} MiB configured, the kernel found {total_kib} KiB"
        );
        // MemTotal is that less the kernel's own reservations: its image, the struct pages
        // (1/64 of RAM), and above 4 GiB of guest-physical address space the 64 MiB swiotlb.
        let kib: u64 = report(&run, "memtotal_kib").parse().unwrap();
        let reserved_max = 48 * 1024 + total_kib / 64 + if mib > 3072 { 64 * 1024 } else { 0 };
        assert!(
            kib < total_kib && kib > total_kib - reserved_max,
            "{mib} MiB gave MemTotal {kib} KiB of {total_kib} KiB"
        );
    }
}

#[test]
fn linux_boots_as_vmlinux_bzimage_and_from_an_initramfs() {
    let img = linux_images!();
    for kernel in ["vmlinux", "bzImage"] {
        let s = Scratch::new("linux-kernel");
        let run = boot(&img, &s, kernel, "", 1, 128, &[]);
        assert!(
            run.stdout.contains("EMBER-POWEROFF"),
            "{kernel}: {}",
            run.stdout
        );
    }
    let s = Scratch::new("linux-initrd");
    let cfg = json!({
        "boot-source": {"kernel_image_path": img.file("bzImage"), "initrd_path": img.file("initramfs.cpio.gz"), "boot_args": BASE_ARGS},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128},
    });
    let run = run_config_within(&s, &cfg, linux_deadline());
    assert_eq!(run.status, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("EMBER-INIT-OK"), "{}", run.stdout);
    assert_eq!(report(&run, "root"), "rootfs", "running from the initramfs");
}

/// The data drive is on the Async engine (io_uring) with Writeback caching: the guest's
/// fsync becomes a flush that waits for the write before it.
#[test]
fn linux_writes_a_data_disk_byte_for_byte() {
    let img = linux_images!();
    let s = Scratch::new("linux-write");
    let data = s.file("data.img", &vec![0u8; 1 << 20]);
    let cmd = r#"ember_cmd="echo ember-data-line > /tmp/f; dd if=/tmp/f of=/dev/vdb bs=512 conv=sync,fsync""#;
    boot(
        &img,
        &s,
        "vmlinux",
        cmd,
        1,
        128,
        &[
            json!({"drive_id": "data", "path_on_host": data, "is_root_device": false,
                 "io_engine": "Async", "cache_type": "Writeback"}),
        ],
    );
    let after = read(&s.path("data.img"));
    let mut expected = b"ember-data-line\n".to_vec();
    expected.resize(512, 0);
    assert_eq!(&after[..512], &expected[..]);
    assert!(after[512..].iter().all(|&b| b == 0));
}

#[test]
fn linux_cannot_write_a_read_only_drive() {
    let img = linux_images!();
    let s = Scratch::new("linux-ro");
    let bytes = noise(1 << 20, 2);
    let ro = s.file("ro.img", &bytes);
    let cmd = r#"ember_cmd="dd if=/dev/zero of=/dev/vdb bs=512 count=1 conv=fsync; echo rc=$?""#;
    let run = boot(
        &img,
        &s,
        "vmlinux",
        cmd,
        1,
        128,
        &[
            json!({"drive_id": "golden", "path_on_host": ro, "is_root_device": false, "is_read_only": true}),
        ],
    );
    assert!(
        !command_output(&run).contains(&"rc=0".to_string()),
        "{}",
        run.stdout
    );
    assert_eq!(read(&s.path("ro.img")), bytes);
}

#[test]
fn linux_shows_drive_ids_as_serials() {
    let img = linux_images!();
    let s = Scratch::new("linux-serial");
    let a = s.file("a.img", &[0u8; 65536]);
    let b = s.file("b.img", &[0u8; 65536]);
    let cmd = r#"ember_cmd="cat /sys/block/vdb/serial; echo; cat /sys/block/vdc/serial; echo""#;
    let drives = [
        json!({"drive_id": "first_disk", "path_on_host": a, "is_root_device": false}),
        json!({"drive_id": "second_disk", "path_on_host": b, "is_root_device": false}),
    ];
    let run = boot(&img, &s, "vmlinux", cmd, 1, 128, &drives);
    assert_eq!(command_output(&run), vec!["first_disk", "second_disk"]);
}

#[test]
fn linux_reboot_and_panic_end_ember_with_status_0() {
    let img = linux_images!();
    let s = Scratch::new("linux-reboot");
    let run = boot(&img, &s, "vmlinux", r#"ember_cmd="reboot -f""#, 1, 128, &[]);
    assert!(
        !run.stdout.contains("EMBER-POWEROFF"),
        "reboot -f ended it first"
    );
    let s = Scratch::new("linux-panic");
    let run = boot(&img, &s, "vmlinux", "ember_panic=1", 1, 128, &[]);
    assert!(run.stdout.contains("Kernel panic"), "{}", run.stdout);
}

/// Ember's PVM adaptations (docs/pvm.md) reach the guest on a kvm_pvm host and nowhere else:
/// elsewhere the guest's command line is the user's and its CPUID keeps CMPXCHG16B and
/// POPCNT. (Not XSAVE: the emulated kvm_amd host's CPU has none, see docs/test-hosts.md.)
#[test]
fn linux_gets_pvm_adaptations_only_on_a_pvm_host() {
    let img = linux_images!();
    let s = Scratch::new("linux-pvm-adaptations");
    let cmd = r#"ember_cmd="cat /proc/cmdline; grep -m1 ^flags /proc/cpuinfo""#;
    let run = boot(&img, &s, "vmlinux", cmd, 1, 128, &[]);
    let lines = command_output(&run);
    let (cmdline, flags) = (&lines[0], &lines[1]);
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let pvm = vmm::pvm::host_is_pvm();
    eprintln!("{} host; cmdline: {cmdline}; flags: {flags:?}", host_kind());
    assert_eq!(cmdline.contains(vmm::pvm::BOOT_ARGS), pvm, "{cmdline}");
    for word in ["ember_pvm_syscall", "noxsave", "clearcpuid"] {
        assert_eq!(cmdline.contains(word), pvm, "{word} in {cmdline}");
    }
    for flag in ["cx16", "popcnt"] {
        assert_eq!(
            flags.contains(&flag),
            !pvm,
            "{flag} in the guest's CPU flags"
        );
    }
}

/// `--enable-pci`: the root disk and a data disk are virtio-pci functions, each with its
/// MSI-X vectors; the guest boots from the first and writes the second byte for byte, and
/// no virtio-mmio device is left.
#[test]
fn linux_finds_its_disks_on_pci_with_enable_pci() {
    let img = linux_images!();
    let s = Scratch::new("linux-pci");
    let root = s.path("rootfs.ext4");
    std::fs::copy(img.file("rootfs.ext4"), &root).unwrap();
    let data = s.file("data.img", &vec![0u8; 1 << 20]);
    let cmd = "cat /sys/bus/pci/devices/*/device; \
               echo msix $(grep -c PCI-MSI /proc/interrupts); \
               echo mmio $(ls /sys/bus/platform/devices | grep -c virtio-mmio); \
               echo ember-pci-line > /tmp/f; dd if=/tmp/f of=/dev/vdb bs=512 conv=sync,fsync";
    let cfg = json!({
        "boot-source": {"kernel_image_path": img.file("vmlinux"),
                        "boot_args": format!("{} ember_cmd=\"{cmd}\"", base_args(true))},
        "drives": [
            {"drive_id": "rootfs", "path_on_host": root, "is_root_device": true},
            {"drive_id": "data", "path_on_host": data, "is_root_device": false},
        ],
        "machine-config": {"vcpu_count": 2, "mem_size_mib": 256},
    });
    let path = s.file("vm.json", cfg.to_string().as_bytes());
    let run = run_args_within(
        &["--no-api", "--config-file", &path, "--enable-pci"],
        linux_deadline(),
    );
    assert_eq!(run.status, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains("pci=off"), "{}", run.stdout);
    let out = command_output(&run);
    // The host bridge, then the two disks (virtio-blk: 0x1040 + 2).
    assert_eq!(out[..3], ["0x0008", "0x1042", "0x1042"], "{out:?}");
    let msix: u32 = out[3].strip_prefix("msix ").unwrap().parse().unwrap();
    assert!(
        msix >= 4,
        "two disks, a config and a queue vector each: {out:?}"
    );
    assert_eq!(out[4], "mmio 0");
    let after = read(Path::new(&data));
    let mut expected = b"ember-pci-line\n".to_vec();
    expected.resize(512, 0);
    assert_eq!(&after[..512], &expected[..]);
}
