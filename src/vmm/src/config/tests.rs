use super::*;
use crate::resources::VmResources;

fn temp_file(name: &str) -> String {
    let path =
        std::env::temp_dir().join(format!("ember-config-test-{}-{name}", std::process::id()));
    std::fs::write(&path, b"x").unwrap();
    path.to_string_lossy().into_owned()
}

fn error_of(json: &str) -> String {
    VmResources::from_json(json).unwrap_err().to_string()
}

#[test]
fn a_full_config_parses_with_firecracker_defaults() {
    let kernel = temp_file("kernel");
    let disk = temp_file("disk");
    let json = format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}},
            "drives": [{{"drive_id": "data", "path_on_host": "{disk}", "is_root_device": false}},
                       {{"drive_id": "rootfs", "path_on_host": "{disk}", "is_root_device": true, "is_read_only": true}}],
            "machine-config": {{"vcpu_count": 2, "mem_size_mib": 256}}}}"#
    );
    let res = VmResources::from_json(&json).unwrap();
    assert_eq!(res.machine_config.vcpu_count, 2);
    assert!(!res.machine_config.smt);
    assert_eq!(res.drives()[0].drive_id, "rootfs", "root drive first");
    assert_eq!(res.drives()[1].cache_type, CacheType::Unsafe);
    assert!(res
        .boot_source
        .unwrap()
        .boot_args()
        .starts_with("reboot=k panic=1"));
}

#[test]
fn machine_config_defaults_to_one_vcpu_and_128_mib() {
    let kernel = temp_file("kernel2");
    let res = VmResources::from_json(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}}}"#
    ))
    .unwrap();
    assert_eq!(
        (
            res.machine_config.vcpu_count,
            res.machine_config.mem_size_mib
        ),
        (1, 128)
    );
}

#[test]
fn unknown_keys_are_named_at_every_level() {
    let kernel = temp_file("kernel3");
    let e = error_of(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, "network": 1}}"#
    ));
    assert!(e.contains("unknown field `network`"), "{e}");
    let e = error_of(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}", "cmdline": "x"}}}}"#
    ));
    assert!(
        e.contains("boot-source") && e.contains("unknown field `cmdline`"),
        "{e}"
    );
    let e = error_of(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 1, "vcpus": 2}}}}"#
    ));
    assert!(e.contains("machine-config") && e.contains("`vcpus`"), "{e}");
}

#[test]
fn wrong_types_name_the_field() {
    let kernel = temp_file("kernel4");
    let e = error_of(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, "machine-config": {{"vcpu_count": "2", "mem_size_mib": 1}}}}"#
    ));
    assert!(
        e.contains("machine-config.vcpu_count") && e.contains("invalid type"),
        "{e}"
    );
    let e = error_of(&format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, "drives": [{{"drive_id": "a", "path_on_host": "{kernel}", "is_root_device": "yes"}}]}}"#
    ));
    assert!(e.contains("drives[0].is_root_device"), "{e}");
}

#[test]
fn malformed_json_gives_line_and_column() {
    let e = error_of("{\n  \"boot-source\": {\n    \"kernel_image_path\": \"x\",\n  }\n}");
    assert!(e.contains("line 4 column 3"), "{e}");
    let e = error_of("{\"boot-source\": {\"kernel_image_path\": \"x\"}} trailing");
    assert!(e.contains("trailing"), "{e}");
}

#[test]
fn machine_limits() {
    let check = |vcpus: u8, mem: usize, smt: bool| {
        MachineConfig {
            vcpu_count: vcpus,
            mem_size_mib: mem,
            smt,
            ..MachineConfig::default()
        }
        .validate()
    };
    assert!(matches!(
        check(0, 128, false),
        Err(ConfigError::VcpuCount(0))
    ));
    assert!(matches!(
        check(33, 128, false),
        Err(ConfigError::VcpuCount(33))
    ));
    assert!(matches!(
        check(3, 128, true),
        Err(ConfigError::SmtOddVcpus(3))
    ));
    assert!(matches!(check(1, 0, false), Err(ConfigError::MemoryZero)));
    assert!(matches!(
        check(1, usize::MAX, false),
        Err(ConfigError::MemoryTooLarge(_))
    ));
    assert!(check(32, 128, false).is_ok());
    assert!(check(1, 128, true).is_ok());
}

#[test]
fn drive_rules() {
    let disk = temp_file("disk5");
    let drive = |id: &str, root: bool| DriveConfig {
        drive_id: id.into(),
        path_on_host: disk.clone(),
        is_root_device: root,
        is_read_only: false,
        partuuid: None,
        cache_type: CacheType::Unsafe,
        io_engine: IoEngine::Sync,
        rate_limiter: None,
        socket: None,
    };
    let mut res = VmResources::default();
    res.add_drive(drive("a", true)).unwrap();
    assert!(matches!(
        res.add_drive(drive("b", true)),
        Err(ConfigError::TwoRootDevices(..))
    ));
    assert!(matches!(
        res.add_drive(drive("a", false)),
        Err(ConfigError::DuplicateDriveId(_))
    ));
    assert!(matches!(
        res.add_drive(drive("bad id", false)),
        Err(ConfigError::DriveId(_))
    ));
    let mut missing = drive("c", false);
    missing.path_on_host = "/nonexistent/disk.img".into();
    let e = res.add_drive(missing).unwrap_err().to_string();
    assert!(
        e.contains("/nonexistent/disk.img") && e.contains("No such file"),
        "{e}"
    );
    res.replace_drive(drive("a", false)).unwrap();
    res.add_drive(drive("b", true)).unwrap();
    assert_eq!(res.drives()[0].drive_id, "b");
    for i in 0..(crate::resources::MAX_DEVICES - 2) {
        res.add_drive(drive(&format!("d{i}"), false)).unwrap();
    }
    assert!(matches!(
        res.add_drive(drive("last", false)),
        Err(ConfigError::TooManyDevices { .. })
    ));
}

#[test]
fn firecracker_sections_without_a_device_here_are_named() {
    let kernel = temp_file("kernel9");
    let boot = format!(r#""boot-source": {{"kernel_image_path": "{kernel}"}}"#);
    // Empty sections, as Firecracker's GET /vm/config writes them, load.
    VmResources::from_json(&format!(
        r#"{{{boot}, "network-interfaces": [], "vsock": null, "balloon": null}}"#
    ))
    .unwrap();
    let e = error_of(&format!(
        r#"{{{boot}, "vsock": {{"guest_cid": 2, "uds_path": "/tmp/v.sock"}}}}"#
    ));
    assert!(e.contains("guest_cid must be at least 3"), "{e}");
    let e = error_of(&format!(
        r#"{{{boot}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 65, "huge_pages": "2M"}}}}"#
    ));
    assert!(
        e.contains("mem_size_mib 65 is not a whole number of 2 MiB huge pages"),
        "{e}"
    );
    VmResources::from_json(&format!(
        r#"{{{boot}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "2M"}}}}"#
    ))
    .unwrap();
}

#[test]
fn the_exported_configuration_loads_again() {
    let kernel = temp_file("kernel10");
    let disk = temp_file("disk10");
    let json = format!(
        r#"{{"boot-source": {{"kernel_image_path": "{kernel}", "boot_args": "console=ttyS0"}},
            "drives": [{{"drive_id": "root", "path_on_host": "{disk}", "is_root_device": true}}],
            "machine-config": {{"vcpu_count": 2, "mem_size_mib": 96, "smt": true}}}}"#
    );
    let first = VmResources::from_json(&json).unwrap();
    let exported = serde_json::to_string(&first.to_config()).unwrap();
    let second = VmResources::from_json(&exported).unwrap();
    assert_eq!(
        second.to_config().boot_source,
        first.to_config().boot_source
    );
    assert_eq!(second.drives(), first.drives());
    assert_eq!(second.machine_config, first.machine_config);
}

#[test]
fn patch_changes_only_the_fields_it_names() {
    let current = MachineConfig {
        vcpu_count: 2,
        mem_size_mib: 512,
        ..MachineConfig::default()
    };
    let update: MachineConfigUpdate = parse_json(r#"{"mem_size_mib": 256}"#).unwrap();
    let next = update.apply(&current);
    assert_eq!((next.vcpu_count, next.mem_size_mib), (2, 256));
    assert!(parse_json::<MachineConfigUpdate>("{}").unwrap().is_empty());
}

#[test]
fn network_interfaces_and_mmds_config_are_checked() {
    let kernel = temp_file("kernel11");
    let boot = format!(r#""boot-source": {{"kernel_image_path": "{kernel}"}}"#);
    let iface = |fields: &str| {
        error_of(&format!(
            r#"{{{boot}, "network-interfaces": [{{"iface_id": "eth0", {fields}}}]}}"#
        ))
    };
    let e = iface(r#""host_dev_name": "tap0", "guest_mac": "06:00:00:00:00""#);
    assert!(
        e.contains("network-interfaces[0].guest_mac") && e.contains("not a MAC address"),
        "{e}"
    );
    let e = iface(r#""host_dev_name": "no-such-tap9""#);
    assert!(
        e.contains("there is no network device named no-such-tap9"),
        "{e}"
    );
    let e = iface(r#""host_dev_name": "a/b""#);
    assert!(e.contains("TAP device name"), "{e}");
    let e = iface(r#""host_dev_name": "tap0", "mtu": 20"#);
    assert!(e.contains("mtu must be between 68 and 65535"), "{e}");
    let e = iface(
        r#""host_dev_name": "tap0", "rx_rate_limiter": {"bandwidth": {"size": 1, "refill_time": 0}}"#,
    );
    assert!(
        e.contains("the bandwidth bucket has size 1 but refill_time 0"),
        "{e}"
    );
    let e = iface(r#""host_dev_name": "tap0", "allow_mmds_requests": true"#);
    assert!(e.contains("unknown field `allow_mmds_requests`"), "{e}");

    let mmds = |body: &str| error_of(&format!(r#"{{{boot}, "mmds-config": {body}}}"#));
    let e = mmds(r#"{"network_interfaces": ["eth0"]}"#);
    assert!(
        e.contains("does not correspond to any existing network interface: eth0"),
        "{e}"
    );
    let e = mmds(r#"{"network_interfaces": []}"#);
    assert!(e.contains("is empty"), "{e}");
    let e = mmds(r#"{"network_interfaces": ["eth0"], "ipv4_address": "10.0.0.1"}"#);
    assert!(e.contains("not a link-local address"), "{e}");
    let e = mmds(r#"{"network_interfaces": ["eth0"], "version": "V3"}"#);
    assert!(
        e.contains("mmds-config.version") && e.contains("unknown variant `V3`"),
        "{e}"
    );
    let e = mmds(r#"{"version": "V2"}"#);
    assert!(e.contains("missing field `network_interfaces`"), "{e}");
}

#[test]
fn rate_limiters_logger_and_metrics_in_a_config_file() {
    let kernel = temp_file("kernel-limits");
    let disk = temp_file("disk-limits");
    let with = |limiter: &str, extra: &str| {
        format!(
            r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, {extra}
                "drives": [{{"drive_id": "d", "path_on_host": "{disk}", "is_root_device": true,
                             "rate_limiter": {limiter}}}]}}"#
        )
    };
    let good = with(
        r#"{"bandwidth": {"size": 1000, "one_time_burst": 50, "refill_time": 100}}"#,
        r#""logger": {"level": "Info", "show_level": true}, "metrics": {"metrics_path": "/tmp/m"},"#,
    );
    let res = VmResources::from_json(&good).unwrap();
    let limiter = res.drives()[0].rate_limiter.unwrap();
    assert_eq!(limiter.bandwidth.unwrap().one_time_burst, Some(50));
    assert_eq!(res.logger.unwrap().show_level, Some(true));
    assert_eq!(res.metrics.unwrap().metrics_path, "/tmp/m");
    // The same sentences as the API's.
    assert!(
        error_of(&with(r#"{"ops": {"size": 3, "refill_time": 0}}"#, ""))
            .contains("the ops bucket has size 3 but refill_time 0")
    );
    assert!(
        error_of(&with(r#"{"ops": {"size": -3, "refill_time": 10}}"#, ""))
            .contains("drives[0].rate_limiter.ops.size: invalid value: integer `-3`, expected u64"),
    );
    assert!(error_of(&with(r#"{"bandwidth": {"refill_time": 10}}"#, ""))
        .contains("missing field `size`"));
    assert!(error_of(&with("{}", r#""logger": {"level": "loud"},"#))
        .contains("logger.level: unknown log level \"loud\""));
}

#[test]
fn the_entropy_section_is_a_device_with_an_optional_limiter() {
    let kernel = temp_file("kernel-entropy");
    let with = |entropy: &str| {
        format!(r#"{{"boot-source": {{"kernel_image_path": "{kernel}"}}, "entropy": {entropy}}}"#)
    };
    let res = VmResources::from_json(&with(
        r#"{"rate_limiter": {"ops": {"size": 10, "refill_time": 100}}}"#,
    ))
    .unwrap();
    assert_eq!(
        res.entropy()
            .unwrap()
            .rate_limiter
            .unwrap()
            .ops
            .unwrap()
            .size,
        10
    );
    let shown = serde_json::to_value(res.to_config()).unwrap();
    assert_eq!(shown["entropy"]["rate_limiter"]["ops"]["refill_time"], 100);
    assert!(VmResources::from_json(&with("null"))
        .unwrap()
        .entropy()
        .is_none());
    assert!(VmResources::from_json(&with("{}"))
        .unwrap()
        .entropy()
        .is_some());
    let e = error_of(&with(r#"{"quality": 3}"#));
    assert!(
        e.contains("entropy") && e.contains("unknown field `quality`"),
        "{e}"
    );
    // It takes one of the interrupt lines the drives and interfaces share.
    let mut res = VmResources::default();
    for i in 0..crate::resources::MAX_DEVICES {
        let disk = temp_file(&format!("disk-entropy-{i}"));
        let drive =
            format!(r#"{{"drive_id": "d{i}", "path_on_host": "{disk}", "is_root_device": false}}"#);
        res.add_drive(parse_json(&drive).unwrap()).unwrap();
    }
    assert!(matches!(
        res.set_entropy(EntropyDeviceConfig::default()),
        Err(ConfigError::TooManyDevices { .. })
    ));
}
