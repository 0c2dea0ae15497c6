//! Every path and method of Firecracker's API file against a real ember: a good request, a
//! wrong type, a missing required field, an unknown field, each before and after boot,
//! checked for Firecracker's status and fault message.

mod common;

use common::api::{Client, Ember};
use common::shapes::Shapes;
use common::*;
use serde_json::{json, Value};

/// One path and method with a body.
struct Case {
    method: &'static str,
    path: &'static str,
    good: Value,
    /// (body, what the fault message says)
    wrong_type: (Value, &'static str),
    missing: (Value, &'static str),
    unknown: Value,
    allowed: Allowed,
}

/// When Firecracker accepts the request.
#[derive(Debug, Clone, Copy)]
enum Allowed {
    BeforeBoot,
    AfterBoot,
    Always,
}

impl Allowed {
    /// What the good request gets before boot, and after: (status, fault text).
    fn answers(self) -> [(u16, &'static str); 2] {
        match self {
            Allowed::BeforeBoot => [(204, ""), (400, POST_BOOT)],
            Allowed::AfterBoot => [(400, PRE_BOOT), (204, "")],
            Allowed::Always => [(204, ""), (204, "")],
        }
    }
}

const POST_BOOT: &str = "The requested operation is not supported after starting the microVM.";
const PRE_BOOT: &str = "The requested operation is not supported before starting the microVM.";
const HINTING: [(&str, &str); 3] = [
    ("PATCH", "/balloon/hinting/start"),
    ("GET", "/balloon/hinting/status"),
    ("PATCH", "/balloon/hinting/stop"),
];

fn cases(kernel: &str, disk: &str, log: &str, metrics: &str) -> Vec<Case> {
    let vsock = log.replace("ember.log", "v.sock");
    vec![
        Case {
            method: "PUT",
            path: "/machine-config",
            good: json!({"vcpu_count": 1, "mem_size_mib": 32}),
            wrong_type: (
                json!({"vcpu_count": "1", "mem_size_mib": 32}),
                "machine-config.vcpu_count: invalid type: string \"1\", expected u8",
            ),
            missing: (json!({"vcpu_count": 1}), "missing field `mem_size_mib`"),
            unknown: json!({"vcpu_count": 1, "mem_size_mib": 32, "vcpus": 2}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PATCH",
            path: "/machine-config",
            good: json!({"mem_size_mib": 48}),
            wrong_type: (json!({"smt": "yes"}), "machine-config.smt: invalid type"),
            // No field is required; an empty update is refused, as by Firecracker.
            missing: (json!({}), "Empty PATCH request."),
            unknown: json!({"memory": 48}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/boot-source",
            good: json!({"kernel_image_path": kernel, "boot_args": "hang nosmp"}),
            wrong_type: (
                json!({"kernel_image_path": 5}),
                "boot-source.kernel_image_path: invalid type: integer `5`, expected a string",
            ),
            missing: (
                json!({"boot_args": "x"}),
                "missing field `kernel_image_path`",
            ),
            unknown: json!({"kernel_image_path": kernel, "cmdline": "x"}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/drives/rootfs",
            good: json!({"drive_id": "rootfs", "path_on_host": disk, "is_root_device": true}),
            wrong_type: (
                json!({"drive_id": "rootfs", "path_on_host": disk, "is_root_device": "yes"}),
                "drives.is_root_device: invalid type",
            ),
            missing: (
                json!({"drive_id": "rootfs", "path_on_host": disk}),
                "missing field `is_root_device`",
            ),
            unknown: json!({"drive_id": "rootfs", "path_on_host": disk, "is_root_device": true, "rate": 1}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PATCH",
            path: "/drives/rootfs",
            good: json!({"drive_id": "rootfs", "path_on_host": disk}),
            wrong_type: (
                json!({"drive_id": "rootfs", "path_on_host": 7}),
                "drives.path_on_host: invalid type",
            ),
            missing: (json!({"path_on_host": disk}), "missing field `drive_id`"),
            unknown: json!({"drive_id": "rootfs", "is_read_only": true}),
            allowed: Allowed::AfterBoot,
        },
        Case {
            method: "PUT",
            path: "/drives/data",
            good: json!({"drive_id": "data", "path_on_host": disk, "is_root_device": false,
                         "rate_limiter": {"bandwidth": {"size": 1_000_000, "refill_time": 1000},
                                          "ops": {"size": 100, "one_time_burst": 50, "refill_time": 1000}}}),
            wrong_type: (
                json!({"drive_id": "data", "path_on_host": disk, "is_root_device": false,
                       "rate_limiter": {"bandwidth": {"size": -1, "refill_time": 1000}}}),
                "drives.rate_limiter.bandwidth.size: invalid value: integer `-1`, expected u64",
            ),
            missing: (
                json!({"drive_id": "data", "path_on_host": disk, "is_root_device": false,
                       "rate_limiter": {"ops": {"size": 5}}}),
                "missing field `refill_time`",
            ),
            unknown: json!({"drive_id": "data", "path_on_host": disk, "is_root_device": false,
                            "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 1, "rate": 2}}}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/actions",
            good: json!({"action_type": "BlockDeviceRescan", "payload": "rootfs"}),
            wrong_type: (
                json!({"action_type": "BlockDeviceRescan", "payload": 5}),
                "BlockDeviceRescan needs the drive's ID",
            ),
            missing: (
                json!({"action_type": "BlockDeviceRescan"}),
                "BlockDeviceRescan needs the drive's ID",
            ),
            unknown: json!({"action_type": "BlockDeviceRescan", "payload": "rootfs", "x": 1}),
            allowed: Allowed::AfterBoot,
        },
        Case {
            method: "PUT",
            path: "/logger",
            good: json!({"log_path": log, "level": "debug", "show_level": true, "show_log_origin": true}),
            wrong_type: (
                json!({"show_level": "yes"}),
                "logger.show_level: invalid type",
            ),
            // No field is required: a body that names no known level stands in for it.
            missing: (json!({"level": "Loud"}), "unknown log level \"Loud\""),
            unknown: json!({"log_path": log, "colour": true}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/entropy",
            good: json!({"rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}}}),
            wrong_type: (
                json!({"rate_limiter": 5}),
                "entropy.rate_limiter: invalid type: integer `5`",
            ),
            missing: (
                json!({"rate_limiter": {"ops": {"size": 5}}}),
                "missing field `refill_time`",
            ),
            unknown: json!({"rate_limiter": null, "quality": 1}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/vsock",
            good: json!({"guest_cid": 3, "uds_path": vsock}),
            wrong_type: (
                json!({"guest_cid": "3", "uds_path": vsock}),
                "vsock.guest_cid: invalid type: string \"3\"",
            ),
            missing: (json!({"guest_cid": 3}), "missing field `uds_path`"),
            unknown: json!({"guest_cid": 3, "uds_path": vsock, "port": 1}),
            allowed: Allowed::BeforeBoot,
        },
        // Firecracker routes `/vsock/{id}` to `/vsock`, with its deprecated `vsock_id`.
        Case {
            method: "PUT",
            path: "/vsock/vsock0",
            good: json!({"vsock_id": "vsock0", "guest_cid": 3, "uds_path": vsock}),
            wrong_type: (
                json!({"guest_cid": 3, "uds_path": 7}),
                "vsock.uds_path: invalid type: integer `7`",
            ),
            missing: (json!({"uds_path": vsock}), "missing field `guest_cid`"),
            unknown: json!({"guest_cid": 3, "uds_path": vsock, "cid": 1}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/cpu-config",
            good: json!({"kvm_capabilities": ["!56"], "cpuid_modifiers": [{"leaf": "0x1",
                "subleaf": "0x0", "flags": 0, "modifiers": [{"register": "ecx", "bitmap": "0bx1xxx"}]}],
                "msr_modifiers": []}),
            wrong_type: (
                json!({"cpuid_modifiers": [{"leaf": 1, "subleaf": "0x0", "flags": 0, "modifiers": []}]}),
                "cpu-config.cpuid_modifiers[0].leaf: invalid type: integer `1`, expected a string",
            ),
            missing: (
                json!({"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "modifiers": []}]}),
                "missing field `flags`",
            ),
            unknown: json!({"reg_modifiers": []}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/balloon",
            good: json!({"amount_mib": 8, "deflate_on_oom": true, "stats_polling_interval_s": 1}),
            wrong_type: (
                json!({"amount_mib": -1, "deflate_on_oom": true}),
                "balloon.amount_mib: invalid value: integer `-1`",
            ),
            missing: (json!({"amount_mib": 8}), "missing field `deflate_on_oom`"),
            unknown: json!({"amount_mib": 8, "deflate_on_oom": true, "size": 1}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PATCH",
            path: "/balloon",
            good: json!({"amount_mib": 4}),
            wrong_type: (
                json!({"amount_mib": "4"}),
                "balloon.amount_mib: invalid type",
            ),
            missing: (json!({}), "missing field `amount_mib`"),
            unknown: json!({"amount_mib": 4, "deflate_on_oom": false}),
            allowed: Allowed::Always,
        },
        Case {
            method: "PATCH",
            path: "/balloon/statistics",
            good: json!({"stats_polling_interval_s": 2}),
            wrong_type: (
                json!({"stats_polling_interval_s": true}),
                "balloon.stats_polling_interval_s: invalid type",
            ),
            missing: (json!({}), "missing field `stats_polling_interval_s`"),
            unknown: json!({"stats_polling_interval_s": 2, "now": 1}),
            allowed: Allowed::Always,
        },
        Case {
            method: "PUT",
            path: "/metrics",
            good: json!({"metrics_path": metrics}),
            wrong_type: (
                json!({"metrics_path": 1}),
                "metrics.metrics_path: invalid type",
            ),
            missing: (json!({}), "missing field `metrics_path`"),
            unknown: json!({"metrics_path": metrics, "period": 5}),
            allowed: Allowed::BeforeBoot,
        },
        Case {
            method: "PUT",
            path: "/actions",
            good: json!({"action_type": "FlushMetrics"}),
            wrong_type: (
                json!({"action_type": 5}),
                "actions.action_type: expected value",
            ),
            missing: (json!({}), "missing field `action_type`"),
            unknown: json!({"action_type": "FlushMetrics", "when": "now"}),
            allowed: Allowed::AfterBoot,
        },
        Case {
            method: "PUT",
            path: "/actions",
            good: json!({"action_type": "SendCtrlAltDel"}),
            wrong_type: (
                json!({"action_type": "Reboot"}),
                "actions.action_type: unknown variant `Reboot`",
            ),
            missing: (json!({"payload": "x"}), "missing field `action_type`"),
            unknown: json!({"action_type": "SendCtrlAltDel", "keys": 3}),
            allowed: Allowed::AfterBoot,
        },
        Case {
            method: "PATCH",
            path: "/vm",
            good: json!({"state": "Resumed"}),
            wrong_type: (json!({"state": 1}), "vm.state: expected value"),
            missing: (json!({}), "missing field `state`"),
            unknown: json!({"state": "Paused", "now": true}),
            allowed: Allowed::AfterBoot,
        },
    ]
}

/// The bad bodies get 400 whatever the VM's state: Firecracker parses before it checks.
fn check_bad_bodies(c: &mut Client, case: &Case, when: &str) {
    let ctx = format!("{} {} {when}", case.method, case.path);
    let r = c.call(case.method, case.path, &case.wrong_type.0);
    assert_eq!(r.status, 400, "{ctx} wrong type: {r:?}");
    assert!(
        r.fault().contains(case.wrong_type.1),
        "{ctx}: {}",
        r.fault()
    );
    let r = c.call(case.method, case.path, &case.missing.0);
    assert_eq!(r.status, 400, "{ctx} missing: {r:?}");
    assert!(r.fault().contains(case.missing.1), "{ctx}: {}", r.fault());
    let r = c.call(case.method, case.path, &case.unknown);
    assert_eq!(r.status, 400, "{ctx} unknown: {r:?}");
    assert!(r.fault().contains("unknown field"), "{ctx}: {}", r.fault());
}

fn check_good(c: &mut Client, case: &Case, (status, text): (u16, &str), when: &str) {
    let r = c.call(case.method, case.path, &case.good);
    assert_eq!(
        r.status, status,
        "{} {} {when}: {r:?}",
        case.method, case.path
    );
    if status == 204 {
        assert!(r.body.is_empty());
    } else {
        assert!(
            r.fault().contains(text),
            "{} {when}: {}",
            case.path,
            r.fault()
        );
    }
}

#[test]
fn every_path_with_a_body_before_and_after_boot() {
    let s = kvm_scratch!("conformance");
    let disk = s.file("root.img", &noise(64 << 10, 2));
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let log = s.path("ember.log").to_string_lossy().into_owned();
    let metrics = s.path("metrics.json").to_string_lossy().into_owned();
    let cases = cases(test_guest::PVH_ELF, &disk, &log, &metrics);

    // Before boot.
    let info = c.get("/").expect(200, "").json();
    assert_eq!(info["state"], "Not started");
    assert_eq!(info["app_name"], "Ember");
    assert!(info["vmm_version"].is_string() && info["id"].is_string());
    let machine = c.get("/machine-config").expect(200, "").json();
    assert_eq!(
        machine,
        json!({"vcpu_count": 1, "mem_size_mib": 128, "smt": false,
               "track_dirty_pages": false, "huge_pages": "None"}),
        "Firecracker's defaults"
    );
    for case in &cases {
        check_bad_bodies(&mut c, case, "before boot");
        check_good(&mut c, case, case.allowed.answers()[0], "before boot");
    }
    // PUT replaced the machine config and PATCH changed only the memory.
    let machine = c.get("/machine-config").json();
    assert_eq!(
        (
            machine["vcpu_count"].clone(),
            machine["mem_size_mib"].clone()
        ),
        (json!(1), json!(48))
    );
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["machine-config"], machine);
    assert_eq!(
        config["entropy"],
        json!({"rate_limiter": {"bandwidth": {"size": 1000, "one_time_burst": null, "refill_time": 100},
            "ops": null}})
    );
    let balloon = json!({"amount_mib": 4, "deflate_on_oom": true, "stats_polling_interval_s": 2,
        "free_page_hinting": false, "free_page_reporting": false});
    assert_eq!(config["balloon"], balloon);
    assert_eq!(
        config["vsock"],
        json!({"guest_cid": 3, "uds_path": s.path("v.sock")}),
        "the deprecated vsock_id is not shown, as in Firecracker"
    );
    assert_eq!(c.get("/balloon").expect(200, "").json(), balloon);
    assert_eq!(config["drives"][0]["path_on_host"], disk.as_str());

    // Hinting runs are for a running balloon.
    for (method, path) in HINTING {
        c.request(method, path, None).expect(400, PRE_BOOT);
    }

    c.instance_start();
    ember.wait_for("guest: hanging", std::time::Duration::from_secs(30));

    // After boot.
    assert_eq!(c.get("/").json()["state"], "Running");
    for case in &cases {
        check_bad_bodies(&mut c, case, "after boot");
        check_good(&mut c, case, case.allowed.answers()[1], "after boot");
    }
    c.put("/actions", &json!({"action_type": "InstanceStart"}))
        .expect(400, POST_BOOT);
    // The balloon after boot: statistics (the test guest has no driver: only the sizes), a
    // target past guest memory, and statistics turned off.
    let stats = c.get("/balloon/statistics").expect(200, "").json();
    let problems = Shapes::load().check(&stats, "BalloonStats", "/balloon/statistics");
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        (stats["target_mib"].clone(), stats["actual_mib"].clone()),
        (json!(4), json!(0))
    );
    c.patch("/balloon", &json!({"amount_mib": 100_000}))
        .expect(400, "more than the guest's memory");
    // This balloon was configured without free page hinting; a bad start body is refused
    // before that is even looked at.
    for (method, path) in HINTING {
        c.request(method, path, None)
            .expect(400, "free page hinting is not enabled on the balloon");
    }
    c.patch("/balloon/hinting/start", &json!({"acknowledge_on_stop": 1}))
        .expect(400, "balloon.acknowledge_on_stop: invalid type");
    c.patch("/balloon/hinting/start", &json!({"ack": true}))
        .expect(400, "unknown field `ack`");
    c.patch(
        "/balloon/statistics",
        &json!({"stats_polling_interval_s": 0}),
    )
    .expect(400, "cannot be turned on or off after the microVM started");
    assert_eq!(
        c.get("/machine-config").json(),
        machine,
        "nothing changed after boot"
    );
    assert_eq!(c.get("/vm/config").json(), config);
    assert_eq!(
        c.get("/version").expect(200, "").json()["firecracker_version"],
        "1.16.1"
    );

    // Drive updates after boot that cannot be done: a clear 400, and the guest runs on.
    for (body, fault) in [
        (
            json!({"drive_id": "data", "path_on_host": "/nonexistent/disk.img"}),
            "cannot read the disk image /nonexistent/disk.img: No such file or directory",
        ),
        (
            json!({"drive_id": "data", "rate_limiter": {"ops": {"size": 10, "refill_time": 0}}}),
            "the ops bucket has size 10 but refill_time 0",
        ),
        (
            json!({"drive_id": "data", "rate_limiter": {"bandwidth": {"size": 1, "refill_time": 1}, "iops": 1}}),
            "drives.rate_limiter.iops: unknown field `iops`",
        ),
    ] {
        c.patch("/drives/data", &body).expect(400, fault);
    }
    // A drive that does not exist, patched or rescanned.
    #[rustfmt::skip]
    let unknown_drive = [
        ("PATCH", "/drives/nope", json!({"drive_id": "nope", "path_on_host": disk})),
        ("PUT", "/actions", json!({"action_type": "BlockDeviceRescan", "payload": "nope"})),
    ];
    for (method, path, body) in unknown_drive {
        c.call(method, path, &body)
            .expect(400, "there is no drive with drive_id nope");
    }
    // A good one is kept in the configuration: the bucket left out stays, a size 0 goes.
    c.patch(
        "/drives/data",
        &json!({"drive_id": "data", "rate_limiter": {"ops": {"size": 0, "refill_time": 0}}}),
    )
    .expect(204, "");
    let limiter = &c.get("/vm/config").json()["drives"][1]["rate_limiter"];
    assert_eq!(
        *limiter,
        json!({"bandwidth": {"size": 1_000_000, "one_time_burst": null, "refill_time": 1000},
            "ops": null})
    );
    assert_eq!(c.get("/").json()["state"], "Running");

    // The logger took its settings, and FlushMetrics wrote a line that counted the API.
    let log_text = std::fs::read_to_string(&log).unwrap();
    let line = line_with(&log_text, "API request: InstanceStart");
    assert!(line.contains(":DEBUG:src/vmm/src/controller.rs:"), "{line}");
    let lines = metrics_lines(std::path::Path::new(&metrics));
    let sum = |section: &str, field: &str| metric_sum(&lines, section, field);
    assert!(sum("put_api_requests", "drive_count") >= 6, "{lines:?}");
    assert!(sum("put_api_requests", "drive_fails") >= 4, "{lines:?}");
    assert!(sum("api_server", "request_count") > 20, "{lines:?}");
    assert!(sum("vcpu", "exit_io_out") > 0, "{lines:?}");
}

#[test]
fn gets_refuse_bodies_and_puts_need_them() {
    let ember = Ember::in_scratch("conformance-bodies");
    let mut c = ember.client();
    for path in ["/", "/version", "/machine-config", "/vm/config"] {
        assert_eq!(c.get(path).status, 200, "{path}");
        c.request("GET", path, Some("{}"))
            .expect(400, "GET request cannot have a body.");
    }
    for path in [
        "/boot-source",
        "/drives/rootfs",
        "/actions",
        "/machine-config",
    ] {
        c.request("PUT", path, None)
            .expect(400, "Empty PUT request.");
    }
    for path in ["/vm", "/machine-config", "/drives/rootfs"] {
        c.request("PATCH", path, None)
            .expect(400, "Empty PATCH request.");
    }
}

#[test]
fn drive_ids_in_the_path_follow_firecracker() {
    let s = Scratch::new("conformance-ids");
    let disk = s.file("d.img", &[0u8; 4096]);
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let body = |id: &str| json!({"drive_id": id, "path_on_host": disk, "is_root_device": false});
    c.put("/drives/a", &body("b")).expect(
        400,
        "The id from the path does not match the id from the body!",
    );
    c.put("/drives/bad-id", &body("bad-id"))
        .expect(400, "letters, digits and '_' only");
    c.put("/drives/data", &body("data")).expect(204, "");
    // PUT again replaces it, as before boot in Firecracker.
    c.put("/drives/data", &json!({"drive_id": "data", "path_on_host": disk, "is_root_device": false, "is_read_only": true}))
        .expect(204, "");
    let config = c.get("/vm/config").json();
    assert_eq!(config["drives"].as_array().unwrap().len(), 1);
    assert_eq!(config["drives"][0]["is_read_only"], true);
    c.put(
        "/drives/x",
        &json!({"drive_id": "x", "path_on_host": "/nonexistent/x.img", "is_root_device": false}),
    )
    .expect(400, "cannot read the disk image /nonexistent/x.img");
    c.patch("/drives/nope", &json!({"drive_id": "nope"}))
        .expect(400, PRE_BOOT);
}

#[test]
fn unknown_paths_wrong_methods_and_later_features() {
    let ember = Ember::in_scratch("conformance-paths");
    let mut c = ember.client();
    let r = c.get("/no/such/path").expect(
        404,
        "Invalid request method and/or path: GET /no/such/path.",
    );
    assert!(r
        .header("Content-Type")
        .unwrap()
        .contains("application/json"));
    for (method, path, allow) in [
        ("POST", "/actions", "PUT"),
        ("DELETE", "/drives/rootfs", "PUT, PATCH"),
        ("PUT", "/", "GET"),
        ("GET", "/vm", "PATCH"),
        ("PATCH", "/boot-source", "PUT"),
    ] {
        let r = c
            .request(method, path, Some("{}"))
            .expect(405, "Invalid request method and/or path");
        assert_eq!(r.header("Allow"), Some(allow), "{method} {path}");
    }
    // Paths of features Ember does not have yet: 400 naming the feature.
    for (method, path, feature) in [
        ("PUT", "/pmem/p0", "virtio-pmem"),
        ("GET", "/hotplug/memory", "memory hotplug"),
    ] {
        let body = (method != "GET").then_some("{}");
        let r = c.request(method, path, body).expect(400, feature);
        assert!(r.fault().contains("Ember"), "{path}: {}", r.fault());
    }
    // The connection survived all of it.
    assert_eq!(c.get("/").status, 200);
}

#[test]
fn the_same_mistake_gets_the_same_sentence_from_the_api_and_a_config_file() {
    let s = Scratch::new("conformance-same");
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    let kernel = s.file("k", b"x");
    for (section, body) in [
        (
            "machine-config",
            json!({"vcpu_count": 0, "mem_size_mib": 64}),
        ),
        (
            "machine-config",
            json!({"vcpu_count": 3, "mem_size_mib": 64, "smt": true}),
        ),
        (
            "machine-config",
            json!({"vcpu_count": 1, "mem_size_mib": 65, "huge_pages": "2M"}),
        ),
        (
            "boot-source",
            json!({"kernel_image_path": "/nonexistent/vmlinux"}),
        ),
        (
            "entropy",
            json!({"rate_limiter": {"ops": {"size": 1, "refill_time": 0}}}),
        ),
        ("vsock", json!({"guest_cid": 1, "uds_path": "/tmp/v.sock"})),
    ] {
        let api = c.put(&format!("/{section}"), &body);
        assert_eq!(api.status, 400);
        let mut file = json!({"boot-source": {"kernel_image_path": kernel}});
        file[section] = body.clone();
        let run = common::run_config(&s, &file);
        assert_eq!(run.status, Some(1));
        let cli = run
            .stderr
            .trim()
            .strip_prefix("ember: ")
            .unwrap()
            .to_string();
        assert_eq!(api.fault(), cli, "{section} {body}");
    }
}
