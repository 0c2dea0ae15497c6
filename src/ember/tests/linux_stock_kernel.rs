//! Debian's stock cloud kernel (unmodified, from its package: guest/stock-kernel.sh) on Ember.
//! Its virtio-mmio driver is a module that reads no `virtio_mmio.device=` words, so it finds
//! the disks only through the DSDT; it reads the tables under /sys/firmware/acpi, and powers
//! the VM off through the FADT's sleep control register. With `--enable-pci` it finds the
//! PCI host bridge in the DSDT and ECAM through the MCFG table, and its virtio-pci driver
//! binds the disks. A stock kernel cannot run on a kvm_pvm host (docs/pvm.md, root cause
//! 4), so there these tests are skipped.

mod common;

use common::linux::*;
use common::*;
use serde_json::json;

#[test]
fn linux_stock_cloud_kernel_finds_its_disks_through_acpi_and_powers_off() {
    stock_kernel(false);
}

#[test]
fn linux_stock_cloud_kernel_finds_its_disks_on_pci_through_acpi_with_enable_pci() {
    stock_kernel(true);
}

fn stock_kernel(pci: bool) {
    let images = linux_images!();
    if vmm::pvm::host_is_pvm() {
        skip(&test_name(), "a stock kernel stops at its first user-mode system call on a kvm_pvm host (docs/pvm.md)");
        return;
    }
    let stock = or_skip!(stock_kernel_or_skip);
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
               echo stock: pci-virtio $(ls /sys/bus/pci/drivers/virtio-pci 2>/dev/null | grep -c 0000:00); \
               echo stock: data $(head -c 23 /dev/vdb); poweroff -f";
    let config = json!({
        "boot-source": {
            "kernel_image_path": stock.join("vmlinuz"),
            "initrd_path": stock.join("initrd.cpio.gz"),
            "boot_args": format!("{} ember_cmd=\"{cmd}\"", base_args(pci))
        },
        "drives": [
            {"drive_id": "rootfs", "path_on_host": root, "is_root_device": true, "is_read_only": true},
            {"drive_id": "data", "path_on_host": data, "is_root_device": false, "is_read_only": true}
        ],
        "machine-config": {"vcpu_count": 2, "mem_size_mib": 256}
    });
    let path = s.file("vm.json", config.to_string().as_bytes());
    let mut args = vec!["--no-api", "--config-file", &path, "--level", "Info"];
    if pci {
        args.push("--enable-pci");
    }
    let run = run_args_within(&args, linux_deadline());
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
    let names: &[&str] = match pci {
        true => &["APIC", "DSDT", "FACP", "MCFG"],
        false => &["APIC", "DSDT", "FACP"],
    };
    for name in names {
        assert!(
            tables.contains(&format!("table {name} sum=0").as_str()),
            "{name} missing or bad: {tables:?}\n{all}"
        );
    }
    if pci {
        // ECAM from the MCFG table (trusted, as the e820 map reserves it), the host bridge
        // from the DSDT, and both disks bound by virtio-pci instead of virtio-mmio.
        assert!(
            run.stdout.contains(
                "PCI: MMCONFIG for domain 0000 [bus 00-00] at [mem 0xe0000000-0xe00fffff]"
            ),
            "{all}"
        );
        assert!(run.stdout.contains("ACPI: PCI Root Bridge [PCI0]"), "{all}");
        assert!(lines.contains(&"pci-virtio 2"), "{lines:?}\n{all}");
        assert!(lines.contains(&"acpi-virtio 0"), "{lines:?}\n{all}");
    } else {
        assert!(lines.contains(&"acpi-virtio 2"), "{lines:?}\n{all}");
        assert!(lines.contains(&"pci-virtio 0"), "{lines:?}\n{all}");
    }
    assert!(
        lines.contains(&"data stock-kernel-disk-bytes"),
        "{lines:?}\n{all}"
    );
    // It ended by powering off, which only the ACPI sleep register does here.
    assert!(run.stderr.contains("PowerOff"), "{all}");
}
