//! The ACPI tables as the test guest reads them from its memory: found by the boot
//! information of each entry protocol and by a BIOS-area scan, every checksum right, the
//! MADT's CPUs and the DSDT's virtio-mmio devices those configured, and the FADT's sleep
//! control register ending the VM when the guest powers off through it.

mod common;

use common::*;
use serde_json::json;

fn machine(s: &Scratch, kernel: &str, vcpus: u8, boot_args: &str) -> serde_json::Value {
    let disk = |name: &str| s.file(name, &[0u8; 4096]);
    json!({
        "boot-source": {"kernel_image_path": kernel, "boot_args": boot_args},
        "machine-config": {"vcpu_count": vcpus, "mem_size_mib": 128},
        "drives": [
            {"drive_id": "a", "path_on_host": disk("a.img"), "is_root_device": false, "is_read_only": true},
            {"drive_id": "b", "path_on_host": disk("b.img"), "is_root_device": false, "is_read_only": false}
        ],
        "vsock": {"guest_cid": 3, "uds_path": s.path("v.sock").to_str().unwrap()},
        "entropy": {},
        "balloon": {"amount_mib": 0, "deflate_on_oom": false}
    })
}

#[test]
fn every_entry_protocol_finds_tables_that_describe_the_machine() {
    require_kvm!();
    for (image, vcpus) in [
        (test_guest::PVH_ELF, 1u8),
        (test_guest::LINUX64_ELF, 3),
        (test_guest::BZIMAGE, 2),
    ] {
        let s = Scratch::new("acpi");
        let run = run_config(&s, &machine(&s, image, vcpus, "console=ttyS0"));
        run.assert_clean_exit();
        // Two disks, vsock, entropy and balloon: five virtio-mmio devices, or, with
        // EMBER_TEST_PCI, none and the MCFG table of the PCI bus they are on instead.
        let (mcfg, mmio) = if all_on_pci() { (",MCFG", 0) } else { ("", 5) };
        assert_eq!(
            run.line("acpi rsdp="),
            format!(
                "acpi rsdp=0xe0000 boot-info=same tables=FACP,DSDT,APIC{mcfg} bad-checksums=0 \
                 cpus={vcpus} virtio-mmio={mmio} hw-reduced=1 sleep-port=0x600 s5=5"
            ),
            "{image}"
        );
        // The MP table is still there for kernels without ACPI.
        assert_eq!(run.value("mptable", "cpus"), vcpus.to_string(), "{image}");
    }
}

#[test]
fn a_guest_powering_off_through_acpi_ends_ember_with_status_0() {
    let s = kvm_scratch!("acpi-off");
    let config = machine(&s, test_guest::PVH_ELF, 1, "console=ttyS0 poweroff");
    let path = s.file("vm.json", config.to_string().as_bytes());
    // The guest waits forever after the write: only Ember's power-off can end it.
    let run = run_args(&["--no-api", "--config-file", &path, "--level", "Info"]);
    run.assert_status(0);
    assert_eq!(run.guest_lines().last(), Some(&"acpi power-off"));
    assert!(run.stderr.contains("PowerOff"), "{}", run.stderr);
}
