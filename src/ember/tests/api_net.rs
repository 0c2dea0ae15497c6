//! The network and MMDS API without a guest: Firecracker's bodies, status codes and rules,
//! and the bad input of the issue (unknown interface, missing TAP, duplicate MAC or TAP, MMDS
//! data over the limit, an MMDS config naming an unknown interface). The TAP devices live in
//! a network namespace the test makes.

mod common;

use common::api::Ember;
use common::netns::NetNs;
use common::shapes::Shapes;
use common::*;
use serde_json::{json, Value};

#[test]
fn network_interfaces_and_the_mmds_through_the_api() {
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", None, 1500);
    ns.add_tap("tap1", None, 1500);
    let s = Scratch::new("api-net");
    let ember = Ember::start_in(&s, &["--mmds-size-limit", "200"], Some(&ns.name));
    let mut c = ember.client();
    let eth0 =
        json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:0a:00:00:02"});
    c.put("/network-interfaces/eth0", &eth0).expect(204, "");
    // Replacing an interface before boot is allowed; its own MAC and TAP are no conflict.
    c.put("/network-interfaces/eth0", &eth0).expect(204, "");
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "tap0"}),
    )
    .expect(
        400,
        "the host device tap0 is already used by network interface eth0",
    );
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "tap1", "guest_mac": "06:00:0A:00:00:02"}),
    )
    .expect(
        400,
        "the MAC address 06:00:0a:00:00:02 is already used by network interface eth0",
    );
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "nosuchtap"}),
    )
    .expect(400, "there is no network device named nosuchtap");
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "tap1", "guest_mac": "zz"}),
    )
    .expect(
        400,
        "network-interfaces.guest_mac: \"zz\" is not a MAC address",
    );
    c.put(
        "/network-interfaces/eth2",
        &json!({"iface_id": "eth1", "host_dev_name": "tap1"}),
    )
    .expect(
        400,
        "The id from the path does not match the id from the body!",
    );
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "tap1", "mtu": 9000}),
    )
    .expect(204, "");
    c.patch("/network-interfaces/eth0", &json!({"iface_id": "eth0"}))
        .expect(400, "not supported before starting the microVM");

    // MMDS configuration: its interfaces must exist.
    c.put("/mmds/config", &json!({"network_interfaces": ["eth9"]}))
        .expect(
            400,
            "does not correspond to any existing network interface: eth9",
        );
    c.put("/mmds/config", &json!({"network_interfaces": []}))
        .expect(400, "is empty");
    c.put(
        "/mmds/config",
        &json!({"network_interfaces": ["eth0"], "ipv4_address": "169.254.0.1"}),
    )
    .expect(400, "not a link-local address");
    c.put(
        "/mmds/config",
        &json!({"network_interfaces": ["eth0"], "version": "V2", "ipv4_address": "169.254.170.2"}),
    )
    .expect(204, "");

    // The data store: {} before the first PUT, a merge patch, and the size limit (413).
    assert_eq!(c.get("/mmds").expect(200, "").json(), json!({}));
    c.patch("/mmds", &json!({"a": 1}))
        .expect(400, "The MMDS data store is not initialized.");
    c.put("/mmds", &json!({"latest": {"id": "i-1", "gone": "x"}}))
        .expect(204, "");
    c.patch("/mmds", &json!({"latest": {"gone": null, "new": [1, 2]}}))
        .expect(204, "");
    assert_eq!(
        c.get("/mmds").expect(200, "").json(),
        json!({"latest": {"id": "i-1", "new": [1, 2]}})
    );
    let big = json!({"latest": {"blob": "x".repeat(300)}});
    c.put("/mmds", &big)
        .expect(413, "more than its limit of 200 bytes");
    c.patch("/mmds", &big)
        .expect(413, "more than its limit of 200 bytes");
    assert_eq!(
        c.get("/mmds").expect(200, "").json()["latest"]["id"],
        json!("i-1")
    );
    c.request("PUT", "/mmds", Some("{\"a\": "))
        .expect(400, "EOF while parsing");
    let r = c.request("DELETE", "/mmds", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET, PUT, PATCH"));

    // GET /vm/config shows both sections in the config-file format.
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(
        config["network-interfaces"],
        json!([
            {"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:0a:00:00:02",
             "mtu": null, "rx_rate_limiter": null, "tx_rate_limiter": null},
            {"iface_id": "eth1", "host_dev_name": "tap1", "guest_mac": null, "mtu": 9000,
             "rx_rate_limiter": null, "tx_rate_limiter": null}
        ])
    );
    assert_eq!(
        config["mmds-config"],
        json!({"version": "V2", "network_interfaces": ["eth0"], "ipv4_address": "169.254.170.2", "imds_compat": false})
    );
}

#[test]
fn a_config_file_with_an_interface_that_does_not_exist_is_refused() {
    let s = Scratch::new("net-file");
    let kernel = s.file("kernel", b"not a kernel");
    let config = json!({
        "boot-source": {"kernel_image_path": kernel},
        "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "ember-none0"}],
    });
    let run = run_config(&s, &config);
    run.assert_refused("network interface eth0: there is no network device named ember-none0");
}

#[test]
fn every_get_answers_with_the_keys_of_firecrackers_api_file() {
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", None, 1500);
    let s = Scratch::new("api-shapes");
    let shapes = Shapes::load();
    // The check itself sees a key left out, a key too many, and a nested one.
    let broken = json!({"vcpu_count": 1, "mem_size_mib": 8, "smt": false, "huge_pages": "None",
        "gdb": 1});
    assert_eq!(
        shapes.check(&broken, "MachineConfiguration", "m"),
        [
            "m.gdb: not a key of MachineConfiguration in the API file",
            "m.track_dirty_pages: missing"
        ]
    );
    let nested = json!({"rate_limiter": {"bandwidth": {"size": 1, "refill_time": 1}, "ops": null}});
    assert_eq!(
        shapes.check(&nested, "EntropyDevice", "e"),
        ["e.rate_limiter.bandwidth.one_time_burst: missing"]
    );
    let ember = Ember::start_in(&s, &[], Some(&ns.name));
    let mut c = ember.client();
    // Nothing configured: every section is there, null or empty.
    let config = c.get("/vm/config").expect(200, "").json();
    let problems = shapes.check(&config, "FullVmConfiguration", "/vm/config");
    assert!(problems.is_empty(), "{problems:#?}\n{config:#}");
    for section in [
        "balloon",
        "cpu-config",
        "logger",
        "metrics",
        "mmds-config",
        "vsock",
    ] {
        assert_eq!(config[section], Value::Null, "{section}");
    }
    for section in ["drives", "network-interfaces", "pmem"] {
        assert_eq!(config[section], json!([]), "{section}");
    }
    assert_eq!(config["boot-source"]["kernel_image_path"], "");

    // Everything configured, each with its optional parts left out.
    let bucket = json!({"size": 1000, "refill_time": 100});
    let disk = s.file("disk.img", &[0u8; 4096]);
    c.put(
        "/boot-source",
        &json!({"kernel_image_path": test_guest::PVH_ELF}),
    )
    .expect(204, "");
    c.put(
        "/machine-config",
        &json!({"vcpu_count": 2, "mem_size_mib": 64, "cpu_template": "T2"}),
    )
    .expect(204, "");
    assert_eq!(c.get("/machine-config").json()["cpu_template"], "T2");
    c.put(
        "/drives/rootfs",
        &json!({"drive_id": "rootfs", "path_on_host": disk,
        "is_root_device": true, "rate_limiter": {"ops": bucket}}),
    )
    .expect(204, "");
    c.put(
        "/network-interfaces/eth0",
        &json!({"iface_id": "eth0", "host_dev_name": "tap0",
        "rx_rate_limiter": {"bandwidth": bucket}}),
    )
    .expect(204, "");
    let r = c
        .put("/mmds/config", &json!({"network_interfaces": ["eth0"]}))
        .expect(204, "");
    assert_eq!(r.header("Deprecation"), Some("true"), "MMDS V1");
    c.put(
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": s.path("v.sock")}),
    )
    .expect(204, "");
    c.put("/entropy", &json!({})).expect(204, "");
    c.put(
        "/balloon",
        &json!({"amount_mib": 1, "deflate_on_oom": false}),
    )
    .expect(204, "");
    c.put(
        "/cpu-config",
        &json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0",
        "flags": 0, "modifiers": [{"register": "ecx", "bitmap": "0b1xxx"}]}]}),
    )
    .expect(204, "");
    let mut answered = Vec::new();
    for (path, definition) in shapes.gets() {
        let reply = c.get(&path);
        if reply.status != 200 {
            answered.push(format!("{path} {}", reply.status));
            continue;
        }
        let value = reply.json();
        let problems = shapes.check(&value, &definition, &path);
        assert!(problems.is_empty(), "{problems:#?}\n{value:#}");
    }
    // Before boot, these have nothing to show: the balloon's statistics and hinting status
    // are checked after boot (api_conformance, linux_balloon); memory hotplug is a device
    // Ember does not have.
    assert_eq!(
        answered,
        [
            "/balloon/hinting/status 400",
            "/balloon/statistics 400",
            "/hotplug/memory 400"
        ]
    );
    let config = c.get("/vm/config").json();
    // The custom template replaced the static one, as in Firecracker.
    assert_eq!(config["machine-config"].get("cpu_template"), None);
    assert_eq!(config["cpu-config"]["cpuid_modifiers"][0]["leaf"], "0x1");
    assert_eq!(
        config["drives"][0]["rate_limiter"]["bandwidth"],
        Value::Null
    );
    assert_eq!(config["drives"][0]["io_engine"], "Sync");
    assert_eq!(
        config["network-interfaces"][0]["tx_rate_limiter"],
        Value::Null
    );
    assert_eq!(config["balloon"]["free_page_reporting"], false);
}
