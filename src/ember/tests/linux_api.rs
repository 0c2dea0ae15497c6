//! The REST API with the Linux guest: configured and started through the socket, its
//! configuration replayed as a config file, Ctrl+Alt+Del seen by the guest's keyboard
//! driver, and pause/resume of a running Linux.

mod common;

use std::time::Duration;

use common::api::{Client, Ember};
use common::linux::*;
use common::*;
use serde_json::json;

/// The guest opens its keyboard's event device, says so, then prints every key event it gets
/// in the second after the first one. (No double quotes: the kernel command line cannot hold
/// them inside a value.)
const READ_KEYS: &str = r#"ember_cmd="exec 3</dev/input/event0; echo ember-keyboard-ready; (dd bs=24 count=1 <&3; sleep 1; dd bs=4096 count=1 <&3) 2>/dev/null | od -An -v -tu2 -w24 | while read s1 s2 s3 s4 u1 u2 u3 u4 t c v w; do [ $t = 1 ] && echo ember-key code=$c value=$v; done""#;

/// An ember running the Linux guest (2 vCPUs, 256 MiB, a root and a data drive) with `cmd`.
fn start_configured(img: &Images, s: &Scratch, cmd: &str) -> (Ember, Client) {
    let ember = Ember::start(s, &[]);
    let mut c = ember.client();
    let root = s.path("rootfs.ext4");
    std::fs::copy(img.file("rootfs.ext4"), &root).unwrap();
    let data = s.file("data.img", &vec![0u8; 1 << 20]);
    c.configure(
        &json!({"vcpu_count": 2, "mem_size_mib": 256}),
        &json!({"kernel_image_path": img.file("vmlinux"), "boot_args": format!("{} {cmd}", base_args(all_on_pci()))}),
        &[("rootfs", root.to_str().unwrap(), true), ("data", &data, false)],
    );
    c.instance_start();
    (ember, c)
}

/// Sends Ctrl+Alt+Del once the guest listens, and returns the key events it printed.
fn press_ctrl_alt_del(ember: &mut Ember, c: &mut Client) -> Vec<String> {
    // At a line start: the kernel echoes its command line, which holds the same words.
    ember.wait_for("\nember-keyboard-ready", linux_deadline());
    c.put("/actions", &json!({"action_type": "SendCtrlAltDel"}))
        .expect(204, "");
    ember.wait_clean_exit(linux_deadline());
    after_prefix(&ember.stdout(), "ember-key ")
        .into_iter()
        .map(|key| key.trim_end().to_string())
        .collect()
}

#[test]
fn linux_configured_through_the_api_boots_sees_ctrl_alt_del_and_replays() {
    let img = linux_images!();
    let s = Scratch::new("linux-api");
    let (mut ember, mut c) = start_configured(&img, &s, READ_KEYS);
    ember.wait_for("ember-linux: cpus=2 ", linux_deadline());
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["machine-config"]["mem_size_mib"], 256);
    assert_eq!(config["drives"].as_array().unwrap().len(), 2);

    let keys = press_ctrl_alt_del(&mut ember, &mut c);
    // Left Ctrl (29), left Alt (56) and Delete (111) pressed (1), then released (0).
    assert_eq!(
        keys,
        [
            "code=29 value=1",
            "code=56 value=1",
            "code=111 value=1",
            "code=111 value=0",
            "code=56 value=0",
            "code=29 value=0",
        ],
        "{}",
        ember.stdout()
    );

    // The saved configuration boots the same guest.
    let s2 = Scratch::new("linux-api-replay");
    let saved = s2.file("saved.json", config.to_string().as_bytes());
    let mut second = Ember::start(&s2, &["--config-file", &saved]);
    let mut c2 = second.client();
    second.wait_for("ember-linux: cpus=2 ", linux_deadline());
    assert_eq!(press_ctrl_alt_del(&mut second, &mut c2), keys);
}

#[test]
fn linux_paused_makes_no_progress_until_resumed() {
    let img = linux_images!();
    let s = Scratch::new("linux-pause");
    let cmd = r#"ember_cmd="i=0; while [ $i -lt 100000 ]; do echo ember-tick $i; i=$((i+1)); sleep 1; done""#;
    let (mut ember, mut c) = start_configured(&img, &s, cmd);
    ember.wait_for("ember-tick 2", linux_deadline());
    let count = |e: &Ember| e.stdout().matches("\nember-tick ").count();

    c.patch("/vm", &json!({"state": "Paused"})).expect(204, "");
    std::thread::sleep(Duration::from_millis(200));
    let paused_at = count(&ember);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(count(&ember), paused_at, "no ticks while paused");
    assert_eq!(c.get("/").json()["state"], "Paused");

    c.patch("/vm", &json!({"state": "Resumed"})).expect(204, "");
    ember.wait_for(&format!("ember-tick {}", paused_at + 1), linux_deadline());
    assert_eq!(ember.terminate(), Some(128 + libc::SIGTERM));
}
