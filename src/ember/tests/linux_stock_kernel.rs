//! Debian's stock cloud kernel (unmodified, from its package: guest/stock-kernel.sh) on Ember.
//! Its virtio-mmio driver is a module that reads no `virtio_mmio.device=` words, so it finds
//! the disks only through the DSDT; it reads the tables under /sys/firmware/acpi, and powers
//! the VM off through the FADT's sleep control register. A stock kernel cannot run on a
//! kvm_pvm host (docs/pvm.md, root cause 4), so there this test is skipped.

mod common;

use common::linux::*;
use common::*;
use serde_json::json;

#[test]
fn linux_stock_cloud_kernel_finds_its_disks_through_acpi_and_powers_off() {
    let test = "linux_stock_cloud_kernel_finds_its_disks_through_acpi_and_powers_off";
    let Some(images) = linux_or_skip(test) else {
        return;
    };
    if vmm::pvm::host_is_pvm() {
        skip(test, "a stock kernel stops at its first user-mode system call on a kvm_pvm host (docs/pvm.md)");
        return;
    }
    let Some(stock) = stock_kernel_or_skip(test) else {
        return;
    };
    let s = Scratch::new("stock-kernel");
    let root = s.path("rootfs.ext4");
    std::fs::copy(images.file("rootfs.ext4"), &root).unwrap();
    let mut data = b"stock-kernel-disk-bytes".to_vec();
    data.resize(4096, 0);
    let data = s.file("data.img", &data);
    // Each ACPI table's bytes summed modulo 256, the virtio-mmio devices bound through their
    // ACPI ID, the second disk's first bytes; then a power-off (not the init's reboot).
    let cmd = "for f in /sys/firmware/acpi/tables/[A-Z]*; do \
               echo stock: table ${f##*/} sum=$(od -An -v -tu1 $f | awk '{for(i=1;i<=NF;i++)s+=$i} END{print s%256}'); done; \
               echo stock: acpi-virtio $(ls /sys/bus/platform/drivers/virtio-mmio | grep -c LNRO0005); \
               echo stock: data $(head -c 23 /dev/vdb); poweroff -f";
    let config = json!({
        "boot-source": {
            "kernel_image_path": stock.join("vmlinuz"),
            "initrd_path": stock.join("initrd.cpio.gz"),
            "boot_args": format!("{BASE_ARGS} ember_cmd=\"{cmd}\"")
        },
        "drives": [
            {"drive_id": "rootfs", "path_on_host": root, "is_root_device": true, "is_read_only": true},
            {"drive_id": "data", "path_on_host": data, "is_root_device": false, "is_read_only": true}
        ],
        "machine-config": {"vcpu_count": 2, "mem_size_mib": 256}
    });
    let path = s.file("vm.json", config.to_string().as_bytes());
    let run = run_args_within(
        &["--no-api", "--config-file", &path, "--level", "Info"],
        linux_deadline(),
    );
    let all = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert_eq!(run.status, Some(0), "{all}");
    assert!(run.stdout.contains("EMBER-INIT-OK"), "{all}");
    // The project's init saw two vCPUs and its root on the virtio disk the DSDT described.
    assert!(
        run.stdout.contains("ember-linux: cpus=2 ") && run.stdout.contains("root=/dev/vda"),
        "{all}"
    );
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("stock: "))
        .collect();
    let tables: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("table "))
        .copied()
        .collect();
    for name in ["APIC", "DSDT", "FACP"] {
        assert!(
            tables.contains(&format!("table {name} sum=0").as_str()),
            "{name} missing or bad: {tables:?}\n{all}"
        );
    }
    assert!(lines.contains(&"acpi-virtio 2"), "{lines:?}\n{all}");
    assert!(
        lines.contains(&"data stock-kernel-disk-bytes"),
        "{lines:?}\n{all}"
    );
    // It ended by powering off, which only the ACPI sleep register does here.
    assert!(run.stderr.contains("PowerOff"), "{all}");
}
