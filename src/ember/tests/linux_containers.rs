//! OCI containers in the Linux guest: the guest agent's container service
//! (`ember-agent containers`, protocol v1, docs/containers.md) driven over vsock as the
//! containerd shim drives it, with crun in the guest and the container's root filesystem a
//! second virtio disk (an ext4 image of busybox the test makes).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::api::Ember;
use common::linux::*;
use common::vsock::*;
use common::*;
use serde_json::{json, Value};

const PORT: u32 = 1025;

/// An ext4 image of a busybox tree: what a container image's layers would unpack to.
fn busybox_image(s: &Scratch) -> String {
    let tree = s.path("image");
    for dir in ["bin", "proc", "dev", "sys", "tmp", "etc", "root"] {
        std::fs::create_dir_all(tree.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", tree.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "sleep", "cat", "true", "hostname", "stty"] {
        std::os::unix::fs::symlink("busybox", tree.join("bin").join(applet)).unwrap();
    }
    let image = s.path("image.ext4");
    let ok = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(&image)
        .arg("16M")
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.ext4 of the container image");
    image.to_str().unwrap().to_string()
}

/// A minimal OCI runtime spec, as `crun spec` writes one, running `args`.
fn spec(args: &[&str], terminal: bool) -> Value {
    json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": terminal,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "TERM=xterm"],
            "cwd": "/"
        },
        "root": {"path": "/host/path/that/the/agent/replaces", "readonly": false},
        "hostname": "ember-container",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                           {"type": "network", "path": "/var/run/netns/on-the-host"}]
        }
    })
}

/// One request; its answer line, parsed.
fn ask(uds: &Path, request: &Value) -> Value {
    let mut s = connect(uds, PORT).expect("connect to the agent");
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    serde_json::from_str(read_line(&mut s).trim_end()).expect("a JSON answer")
}

fn ok(uds: &Path, request: &Value) -> Value {
    let answer = ask(uds, request);
    assert!(answer.get("ok").is_some(), "{request} answered {answer}");
    answer["ok"].clone()
}

/// A stream of a process: the connection after the agent's `ok`.
fn stream(uds: &Path, id: &str, exec_id: Option<&str>, which: &str) -> UnixStream {
    let mut s = connect(uds, PORT).unwrap();
    let request = json!({"v": 1, "op": "stdio", "id": id, "exec_id": exec_id, "stream": which});
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let answer = read_line(&mut s);
    assert!(answer.starts_with("{\"ok\""), "{answer}");
    s
}

fn rootfs() -> Value {
    json!({"device": "/dev/vdb", "fstype": "ext4"})
}

/// Creates `id` running `args`, takes its stdout, starts it, and returns its output and
/// exit status; then removes it.
fn run(uds: &Path, id: &str, args: &[&str]) -> (String, i64) {
    ok(
        uds,
        &json!({"v": 1, "op": "create", "id": id, "spec": spec(args, false), "rootfs": rootfs()}),
    );
    let mut out = stream(uds, id, None, "stdout");
    ok(uds, &json!({"v": 1, "op": "start", "id": id}));
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    let status = ok(uds, &json!({"v": 1, "op": "wait", "id": id}))["exit_status"]
        .as_i64()
        .unwrap();
    ok(uds, &json!({"v": 1, "op": "delete", "id": id}));
    (text, status)
}

#[test]
fn linux_runs_oci_containers_for_the_host_with_crun() {
    let img = linux_images!();
    let s = Scratch::new("linux-containers");
    let uds = s.path("v.sock");
    let image = busybox_image(&s);
    let ember = Ember::start(&s, &[]);
    let mut c = ember.client();
    configure(&mut c, &img, 2, 256, "ember-agent containers");
    c.put(
        "/drives/image",
        &json!({"drive_id": "image", "path_on_host": image, "is_root_device": false}),
    )
    .expect(204, "");
    c.put("/vsock", &json!({"guest_cid": 3, "uds_path": uds}))
        .expect(204, "");
    c.instance_start();
    let mut first = connect_when_up(&uds, PORT, linux_deadline());
    first.write_all(b"{\"v\": 1, \"op\": \"ping\"}\n").unwrap();
    let pong = read_line(&mut first);
    assert!(pong.contains("\"version\":1"), "{pong}");

    // Output and exit statuses, in the container's own namespaces.
    let (out, status) = run(&uds, "hello", &["echo", "hello"]);
    assert_eq!((out.as_str(), status), ("hello\n", 0));
    let (out, status) = run(&uds, "exit7", &["sh", "-c", "hostname; echo $$; exit 7"]);
    assert_eq!((out.as_str(), status), ("ember-container\n1\n", 7));

    // A second process in a running container; a signal to its init.
    let init = [
        "sh",
        "-c",
        "trap 'exit 3' TERM; echo up; while true; do sleep 1; done",
    ];
    ok(
        &uds,
        &json!({"v": 1, "op": "create", "id": "svc", "spec": spec(&init, false), "rootfs": rootfs()}),
    );
    let mut init_out = stream(&uds, "svc", None, "stdout");
    ok(&uds, &json!({"v": 1, "op": "start", "id": "svc"}));
    assert_eq!(read_line_of(&mut init_out), "up\n");
    let process = json!({"args": ["sh", "-c", "cat /proc/1/comm; echo from-exec; exit 5"],
        "env": ["PATH=/bin"], "cwd": "/", "user": {"uid": 0, "gid": 0}});
    ok(
        &uds,
        &json!({"v": 1, "op": "exec", "id": "svc", "exec_id": "e1", "process": process}),
    );
    let mut exec_out = stream(&uds, "svc", Some("e1"), "stdout");
    ok(
        &uds,
        &json!({"v": 1, "op": "start", "id": "svc", "exec_id": "e1"}),
    );
    let mut text = String::new();
    exec_out.read_to_string(&mut text).unwrap();
    assert_eq!(
        text, "sh\nfrom-exec\n",
        "the exec sees the init as its PID 1"
    );
    let waited = ok(
        &uds,
        &json!({"v": 1, "op": "wait", "id": "svc", "exec_id": "e1"}),
    );
    assert_eq!(waited["exit_status"], 5);
    let state = ok(&uds, &json!({"v": 1, "op": "state", "id": "svc"}));
    assert_eq!(state["status"], "running");
    ok(
        &uds,
        &json!({"v": 1, "op": "kill", "id": "svc", "signal": 15}),
    );
    let waited = ok(&uds, &json!({"v": 1, "op": "wait", "id": "svc"}));
    assert_eq!(
        waited["exit_status"], 3,
        "SIGTERM reached the container's trap"
    );
    ok(
        &uds,
        &json!({"v": 1, "op": "delete", "id": "svc", "exec_id": "e1"}),
    );
    ok(&uds, &json!({"v": 1, "op": "delete", "id": "svc"}));

    // A terminal: what is typed reaches the shell, which answers on the same stream.
    ok(
        &uds,
        &json!({"v": 1, "op": "create", "id": "tty", "spec": spec(&["sh"], true), "rootfs": rootfs()}),
    );
    let mut term = stream(&uds, "tty", None, "stdout");
    let mut keys = stream(&uds, "tty", None, "stdin");
    ok(
        &uds,
        &json!({"v": 1, "op": "resize", "id": "tty", "width": 100, "height": 40}),
    );
    ok(&uds, &json!({"v": 1, "op": "start", "id": "tty"}));
    keys.write_all(b"echo answer-$((6 * 7)); stty size; exit 9\n")
        .unwrap();
    let mut screen = String::new();
    term.read_to_string(&mut screen).unwrap();
    assert!(screen.contains("answer-42"), "{screen:?}");
    assert!(screen.contains("40 100"), "{screen:?}");
    let waited = ok(&uds, &json!({"v": 1, "op": "wait", "id": "tty"}));
    assert_eq!(waited["exit_status"], 9);
    ok(&uds, &json!({"v": 1, "op": "delete", "id": "tty"}));

    // Bad requests get one error line each, and the service goes on.
    for (request, error) in [
        ("not json".to_string(), "not JSON"),
        (json!({"op": "ping"}).to_string(), "no protocol version"),
        (
            json!({"v": 2, "op": "ping"}).to_string(),
            "protocol version 2 is not spoken",
        ),
        (json!({"v": 1, "op": "fly"}).to_string(), "bad request"),
        (
            json!({"v": 1, "op": "ping", "extra": 1}).to_string(),
            "bad request",
        ),
        (
            json!({"v": 1, "op": "start", "id": "nobody"}).to_string(),
            "no container nobody",
        ),
        (
            json!({"v": 1, "op": "create", "id": "../x", "spec": {}, "rootfs": rootfs()})
                .to_string(),
            "is not 1 to 64",
        ),
        (
            json!({"v": 1, "op": "create", "id": "nodev", "spec": spec(&["true"], false),
            "rootfs": {"device": "/dev/vdz", "fstype": "ext4"}})
            .to_string(),
            "cannot mount /dev/vdz",
        ),
        ("x".repeat(2 << 20), "longer than"),
    ] {
        let mut s = connect(&uds, PORT).unwrap();
        let _ = s.write_all(format!("{request}\n").as_bytes());
        let answer = read_line(&mut s);
        assert!(answer.contains(error), "{:.80} answered {answer}", request);
    }
    // A program the image lacks: crun refuses it at create (or the start fails, or the
    // process ends with an error status); either way the ID can be used again afterwards.
    let bad = json!({"v": 1, "op": "create", "id": "badspec",
        "spec": spec(&["/no/such/program"], false), "rootfs": rootfs()});
    let answer = ask(&uds, &bad);
    eprintln!("a missing program: {answer}");
    if answer.get("ok").is_some() {
        let started = ask(&uds, &json!({"v": 1, "op": "start", "id": "badspec"}));
        eprintln!("its start: {started}");
        if started.get("ok").is_some() {
            let waited = ok(&uds, &json!({"v": 1, "op": "wait", "id": "badspec"}));
            assert_ne!(waited["exit_status"], 0);
        }
        ok(&uds, &json!({"v": 1, "op": "delete", "id": "badspec"}));
    } else {
        assert!(
            answer["error"].as_str().unwrap().contains("crun create"),
            "{answer}"
        );
    }
    let (out, status) = run(&uds, "badspec", &["echo", "again"]);
    assert_eq!((out.as_str(), status), ("again\n", 0));
    drop(ember);
}

/// One line from a stream, without reading past it.
fn read_line_of(s: &mut UnixStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    read_line(s)
}
