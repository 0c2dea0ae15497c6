//! Boots the project's bare-metal test guest on KVM and checks what it saw: boot protocol,
//! command line, e820 map, initrd bytes, CPUs, and an i8042 reset ending ember.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

fn config(kernel: &str, vcpus: u8, mem: u64, boot_args: Option<&str>) -> serde_json::Value {
    let mut boot = json!({"kernel_image_path": kernel});
    if let Some(args) = boot_args {
        boot["boot_args"] = json!(args);
    }
    json!({"boot-source": boot, "machine-config": {"vcpu_count": vcpus, "mem_size_mib": mem}})
}

#[test]
fn the_guest_sees_every_vcpu_come_up() {
    require_kvm!();
    for n in [1u8, 2, 4] {
        let s = Scratch::new("cpus");
        let run = run_config(
            &s,
            &config(test_guest::PVH_ELF, n, 128, Some("console=ttyS0")),
        );
        run.assert_clean_exit();
        assert_eq!(
            run.value("mptable", "cpus"),
            n.to_string(),
            "MP table, {n} vCPUs"
        );
        assert_eq!(
            run.value("smp", "online"),
            n.to_string(),
            "APs started, {n} vCPUs"
        );
    }
}

#[test]
fn the_e820_map_shows_the_configured_memory() {
    require_kvm!();
    // RAM is everything but the EBDA/BIOS hole between 0x9fc00 and 1 MiB.
    let hole = 0x10_0000u64 - 0x9_fc00;
    for (mib, top) in [(128u64, 128u64 << 20), (4096, (1u64 << 32) + (1 << 30))] {
        let s = Scratch::new("mem");
        let run = run_config(&s, &config(test_guest::PVH_ELF, 1, mib, Some("nosmp")));
        run.assert_clean_exit();
        assert_eq!(
            run.value("ram_bytes", "ram_bytes"),
            format!("{:#x}", (mib << 20) - hole),
            "{mib} MiB"
        );
        assert_eq!(
            run.value("ram_bytes", "ram_top"),
            format!("{top:#x}"),
            "{mib} MiB"
        );
        if mib == 4096 {
            // Below the MMIO gap up to 3 GiB, the rest above 4 GiB.
            assert!(
                run.guest_lines()
                    .contains(&"e820 addr=0x100000 size=0xbff00000 type=1"),
                "{}",
                run.stdout
            );
            assert!(
                run.guest_lines()
                    .contains(&"e820 addr=0x100000000 size=0x40000000 type=1"),
                "{}",
                run.stdout
            );
        }
    }
}

/// Each image format is entered by its own protocol and finds the command line and initrd.
#[test]
fn elf_pvh_elf_64_bit_and_bzimage_boot_with_an_initrd() {
    require_kvm!();
    for (image, boot) in [
        (test_guest::PVH_ELF, "boot=pvh magic=0x336ec578"),
        (
            test_guest::LINUX64_ELF,
            "boot=linux64 setup_version=0x0 loader=0xff",
        ),
        (
            test_guest::BZIMAGE,
            "boot=linux64 setup_version=0x20f loader=0xff",
        ),
    ] {
        let s = Scratch::new("formats");
        let initrd_bytes = noise(300_001, 7);
        let initrd = s.file("initrd.img", &initrd_bytes);
        let mut cfg = config(image, 1, 256, Some("console=ttyS0 nosmp foo=bar"));
        cfg["boot-source"]["initrd_path"] = json!(initrd);
        let run = run_config(&s, &cfg);
        run.assert_clean_exit();
        assert_eq!(run.line("boot="), boot, "{image}");
        assert_eq!(
            run.line("cmdline="),
            format!("cmdline=console=ttyS0 nosmp foo=bar{}", host_args())
        );
        assert_eq!(run.value("initrd", "size"), initrd_bytes.len().to_string());
        assert_eq!(
            run.value("initrd", "fnv"),
            format!("{:#x}", fnv1a(&initrd_bytes)),
            "{image}"
        );
        let addr =
            u64::from_str_radix(run.value("initrd", "addr").trim_start_matches("0x"), 16).unwrap();
        assert_eq!(addr % 4096, 0, "page aligned");
        assert!(addr + initrd_bytes.len() as u64 <= 256 << 20, "inside RAM");
    }
}

#[test]
fn without_boot_args_the_firecracker_default_is_used() {
    let s = kvm_scratch!("default-args");
    let run = run_config(&s, &config(test_guest::PVH_ELF, 1, 128, None));
    run.assert_clean_exit();
    assert_eq!(
        run.line("cmdline="),
        format!("cmdline=reboot=k panic=1 nomodule 8250.nr_uarts=0 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce{}", host_args())
    );
    assert_eq!(run.line("initrd"), "initrd none");
}

#[test]
fn an_i8042_reset_ends_ember_with_status_0_promptly() {
    let s = kvm_scratch!("reset");
    let run = run_config(&s, &config(test_guest::PVH_ELF, 1, 128, Some("quick")));
    run.assert_clean_exit();
    assert_eq!(run.guest_lines().last(), Some(&"hello"));
    // Promptly, not a hang: the bound leaves room for an emulated host (scripts/kvm-host).
    assert!(
        run.elapsed < Duration::from_secs(10),
        "took {:?}",
        run.elapsed
    );
    assert!(run.stderr.is_empty(), "{}", run.stderr);
}

#[test]
fn sigterm_and_sigint_end_a_running_guest_with_documented_statuses() {
    require_kvm!();
    for (signal, status) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let s = Scratch::new("signal");
        let path = s.file(
            "vm.json",
            config(test_guest::PVH_ELF, 2, 128, Some("hang nosmp"))
                .to_string()
                .as_bytes(),
        );
        let started = std::time::Instant::now();
        let mut child = spawn(&["--no-api", "--config-file", &path]);
        // The guest parks itself after its report; the signal comes once it says so.
        let stdout = child.stdout.take().unwrap();
        let (seen, stdout) = read_until(stdout, "guest: hanging", Duration::from_secs(60));
        child.stdout = Some(stdout);
        assert!(seen.contains("guest: hanging"), "{seen}");
        // SAFETY: kill(2) on our own child's pid with a valid signal number.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let run = finish(child, started, Duration::from_secs(60));
        assert_eq!(run.status, Some(status), "signal {signal}: {}", run.stderr);
    }
}

#[test]
fn the_boot_timer_logs_the_guest_boot_time() {
    let s = kvm_scratch!("boot-timer");
    let disk = s.file("disk.img", &[0u8; 4096]);
    let mut cfg = config(test_guest::PVH_ELF, 1, 128, Some("nosmp boottimer"));
    cfg["drives"] = json!([{"drive_id": "rootfs", "path_on_host": disk, "is_root_device": true}]);
    let path = s.file("vm.json", cfg.to_string().as_bytes());
    let run = run_args(&[
        "--no-api",
        "--config-file",
        &path,
        "--boot-timer",
        "--level",
        "Info",
        "--show-level",
        "--id",
        "timer-vm",
    ]);
    run.assert_clean_exit();
    // Firecracker's line: time, [instance:thread:LEVEL], message.
    let line = line_with(&run.stderr, "Guest-boot-time = ");
    assert!(line.contains(" [timer-vm:ember_vcpu0:INFO] "), "{line}");
    assert!(line.starts_with("20"), "a UTC timestamp first: {line}");
    // The drive moved to the second window, after the timer.
    assert!(
        run.line("cmdline=")
            .ends_with("virtio_mmio.device=4K@0xd0001000:5"),
        "{}",
        run.line("cmdline=")
    );
    assert_eq!(run.value("blk0 id=", "id"), "rootfs");
}

fn hex(s: &str) -> u32 {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn the_guest_sees_the_cpuid_ember_sets() {
    let s = kvm_scratch!("cpuid");
    let run = run_config(
        &s,
        &config(test_guest::PVH_ELF, 3, 128, Some("cpuid nosmp")),
    );
    run.assert_clean_exit();
    let ebx = hex(&run.value("cpuid 0x1 ", "ebx"));
    assert_eq!((ebx >> 16) & 0xff, 3, "CPU count in leaf 1");
    assert_eq!(ebx >> 24, 0, "the boot CPU's APIC ID");
    let ecx = hex(&run.value("cpuid 0x1 ", "ecx"));
    assert_ne!(ecx & (1 << 31), 0, "hypervisor bit");
    assert_eq!(hex(&run.value("cpuid 0xa ", "eax")), 0, "no PMU");
    assert_eq!(run.value("cpuid 0x40000000 ", "ebx"), "0x4b4d564b", "KVMK");
    let kvm = hex(&run.value("cpuid 0x40000001 ", "eax"));
    if vmm::pvm::host_is_pvm() {
        assert_eq!(
            ecx & vmm::pvm::HIDDEN_LEAF1_ECX,
            0,
            "CMPXCHG16B hidden on PVM"
        );
        assert_eq!(
            kvm & vmm::pvm::HIDDEN_KVM_FEATURES,
            0,
            "hypercall features hidden on PVM"
        );
    }
    assert_ne!(kvm & 1, 0, "kvm-clock stays");
}

#[test]
fn a_custom_cpu_template_changes_the_cpuid_the_guest_reads() {
    let s = kvm_scratch!("cpu-template");
    let plain = config(test_guest::PVH_ELF, 1, 64, Some("cpuid"));
    let run = run_config(&s, &plain);
    run.assert_clean_exit();
    let (ecx, edx) = (
        hex(&run.value("cpuid 0x1 ", "ecx")),
        hex(&run.value("cpuid 0x1 ", "edx")),
    );
    // SSE3 (ECX 0) and SSSE3 (ECX 9) off, MONITOR (ECX 3) on, EDX as the host has it.
    let mut templated = plain.clone();
    templated["cpu-config"] = json!({
        "cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": [
            {"register": "ecx", "bitmap": "0bxxxxxxxxxxxxxxxxxxxxxx0xxxxx1xx0"}
        ]}]
    });
    let run = run_config(&s, &templated);
    run.assert_clean_exit();
    if vmm::pvm::host_is_pvm() {
        // kvm_pvm answers most CPUID bits from the host CPU whatever KVM was given (an
        // all-zero leaf 1 ECX still reads 0xf7d81203 here): ember says so, and the bits
        // are checked on the hardware-virtualisation host.
        assert!(run.stderr.contains("kvm_pvm"), "{}", run.stderr);
        skip(
            "a_custom_cpu_template_changes_the_cpuid_the_guest_reads (the guest's bits)",
            "kvm_pvm shows the guest the host CPU's CPUID bits, not the template's",
        );
    } else {
        assert_eq!(
            hex(&run.value("cpuid 0x1 ", "ecx")),
            (ecx & !0x201) | 0x8,
            "leaf 1 ECX with the template (host's {ecx:#x})"
        );
        assert_eq!(hex(&run.value("cpuid 0x1 ", "edx")), edx);
    }
    // A leaf KVM does not have is refused before the guest runs, in Firecracker's words.
    templated["cpu-config"]["cpuid_modifiers"][0]["leaf"] = json!("0x4fffffff");
    let path = s.file("bad.json", templated.to_string().as_bytes());
    let run = run_args(&["--no-api", "--config-file", &path]);
    run.assert_refused(
        "Template changes a CPUID entry not supported by KVM: Leaf: 0x4fffffff, Subleaf: 0x0",
    );
    assert!(run.guest_lines().is_empty());
}

#[test]
fn static_cpu_templates_are_checked_against_the_host_cpu() {
    let s = kvm_scratch!("static-template");
    // Firecracker's rule: T2, T2S, T2CL and C3 need an Intel CPU and T2A an AMD one, each of
    // the models the template was made for (Skylake, Cascade Lake, Ice Lake; Milan).
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let amd = cpuinfo.contains("AuthenticAMD");
    for template in ["T2", "T2S", "T2CL", "C3", "T2A"] {
        let mut cfg = config(test_guest::PVH_ELF, 1, 64, Some("cpuid"));
        cfg["machine-config"]["cpu_template"] = json!(template);
        let run = run_config(&s, &cfg);
        let same_vendor = amd == (template == "T2A");
        if run.status == Some(0) {
            assert!(same_vendor, "{template} ran on the other vendor's CPU");
            continue;
        }
        let expected = if same_vendor {
            "Failed to get CPU template: The current CPU model is not permitted to apply the CPU template."
        } else {
            "Failed to get CPU template: CPU vendor mismatched between actual CPU and CPU template."
        };
        assert!(run.stderr.contains(expected), "{template}: {}", run.stderr);
        assert_eq!(run.status, Some(1), "{template}");
    }
}

#[test]
fn a_guest_on_huge_pages_runs_on_2_mib_pages_reserved_at_its_start() {
    require_kvm!();
    let pool = or_skip!(huge_pages::huge_pages_or_skip, 64);
    let boot =
        json!({"kernel_image_path": test_guest::PVH_ELF, "boot_args": "console=ttyS0 ticks"});
    let s = Scratch::new("huge-pages");

    // More than the pool holds: refused at InstanceStart with what the pool has.
    let available = pool.available();
    let too_many = (available + 1) * 2;
    let ember = api::Ember::start(&s, &[]);
    let mut c = ember.client();
    let machine = json!({"vcpu_count": 1, "mem_size_mib": too_many, "huge_pages": "2M"});
    c.configure(&machine, &boot, &[]);
    let reply = c.put("/actions", &json!({"action_type": "InstanceStart"}));
    assert_eq!(reply.status, 400, "{}", reply.body);
    let wanted = format!(
        "it needs {} huge pages of 2 MiB and the host's pool has {available} unreserved",
        available + 1
    );
    assert!(reply.fault().contains(&wanted), "{}", reply.fault());
    drop(ember);

    // 128 MiB: all 64 pages reserved at the start, the guest sees its 128 MiB and runs.
    let s = Scratch::new("huge-pages");
    let mut ember = api::Ember::start(&s, &[]);
    let mut c = ember.client();
    let machine = json!({"vcpu_count": 2, "mem_size_mib": 128, "huge_pages": "2M"});
    c.configure(&machine, &boot, &[]);
    c.instance_start();
    ember.wait_for("tick 2", Duration::from_secs(60));
    assert_eq!(pool.available(), available - 64);
    assert_eq!(huge_pages::huge_mapped_kib(ember.child.id()), 128 << 10);
    let hole = 0x10_0000u64 - 0x9_fc00;
    let ram = format!("ram_bytes={:#x}", (128u64 << 20) - hole);
    assert!(ember.stdout().contains(&ram), "{}", ember.stdout());
    assert_eq!(c.get("/machine-config").json()["huge_pages"], "2M");
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
    assert_eq!(
        pool.available(),
        available,
        "the pages went back to the pool"
    );
}

/// A signal that interrupts KVM_CREATE_VM (the kernel answers EINTR when one is pending) does
/// not fail the start at once: ember tries again, as QEMU and Firecracker do. Here a seccomp
/// filter interrupts every attempt, so the retries end after five tries with the reason.
#[test]
fn an_interrupted_kvm_create_vm_is_tried_again_a_few_times() {
    use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition};
    use std::os::unix::process::CommandExt;
    /// `_IO(KVMIO, 0x01)`.
    const KVM_CREATE_VM: u64 = 0xae01;
    let s = kvm_scratch!("create-vm-eintr");
    let is_create_vm =
        SeccompCondition::new(1, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, KVM_CREATE_VM).unwrap();
    let filter = seccompiler::SeccompFilter::new(
        [(
            libc::SYS_ioctl,
            vec![seccompiler::SeccompRule::new(vec![is_create_vm]).unwrap()],
        )]
        .into_iter()
        .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EINTR as u32),
        seccompiler::TargetArch::x86_64,
    )
    .unwrap();
    let program: seccompiler::BpfProgram = filter.try_into().unwrap();
    let cfg = config(test_guest::PVH_ELF, 1, 32, Some("console=ttyS0"));
    let path = s.file("vm.json", cfg.to_string().as_bytes());
    let mut command = std::process::Command::new(EMBER);
    command.args(["--no-api", "--config-file", &path, "--level", "Info"]);
    // SAFETY: between fork and exec the child only installs a compiled filter (prctl and
    // seccomp system calls on memory it already holds).
    unsafe {
        command
            .pre_exec(move || seccompiler::apply_filter(&program).map_err(std::io::Error::other));
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("KVM_CREATE_VM was interrupted").count(),
        4,
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "ember: cannot start the microVM: cannot create the KVM VM: Interrupted system call"
        ),
        "{stderr}"
    );
}
