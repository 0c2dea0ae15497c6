//! containerd runs OCI containers in Ember microVMs: a containerd of the test's own whose
//! runtime `io.containerd.ember.v2` is `containerd-shim-ember-v2`, driven with `ctr` as a
//! user drives it (docs/containers.md). Each sandbox is one VM of the project's guest.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::containerd::*;
use common::linux::*;
use common::*;

fn setup(test: &str, mem_mib: u32, template: bool) -> Option<(Scratch, Containerd)> {
    let img = linux_or_skip(test)?;
    if !containerd_or_skip(test) {
        return None;
    }
    // Short paths: containerd's sockets live in its directory (104 bytes at most).
    let s = Scratch::new("ctd");
    let c = Containerd::start(&s, &img, mem_mib, template);
    Some((s, c))
}

#[test]
fn linux_containerd_runs_containers_in_ember_vms() {
    let (_s, c) = or_skip!(setup, 256, false);
    // Output, and exit statuses as the container's process gave them.
    let out = c.run("hello", &[], &["echo", "hello"]);
    assert_eq!(text(&out.stdout), "hello\n", "{}", text(&out.stderr));
    assert!(out.status.success());
    let out = c.run("exit7", &[], &["sh", "-c", "echo to-stderr >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "to-stderr\n");

    // A second process in a running container (ctr task exec), then SIGTERM to the init
    // (ctr task kill), whose trap answers it.
    let (mut init, mut lines) = c.spawn_run(
        "svc",
        &[
            "sh",
            "-c",
            "trap 'echo got-term; exit 3' TERM; echo up; while true; do sleep 1; done",
        ],
    );
    assert_eq!(lines.next().unwrap().unwrap(), "up");
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "svc",
        "sh",
        "-c",
        "echo from-exec; cat /proc/1/comm; exit 5",
    ]);
    assert_eq!(
        text(&out.stdout),
        "from-exec\nsh\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(5));
    let out = c.ctr(&["task", "ls"]);
    assert!(
        text(&out.stdout).contains("RUNNING"),
        "{}",
        text(&out.stdout)
    );
    let out = c.ctr(&["task", "kill", "svc"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(lines.next().unwrap().unwrap(), "got-term");
    let status = init.wait().unwrap();
    assert_eq!(status.code(), Some(3));

    // An interactive shell on a terminal (ctr run -t), typed into through script(1)'s pty.
    let mut tty = std::process::Command::new("script")
        .args(["-q", "-e", "-c"])
        .arg(format!(
            "ctr --address {} run -t --rm --runtime {RUNTIME} {IMAGE} tty1 sh",
            c.sock.display()
        ))
        .arg("/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut typed = tty.stdin.take().unwrap();
    let reader = tty.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut seen = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            seen.push_str(&line);
            line.clear();
            let _ = tx.send(seen.clone());
        }
    });
    let until = |what: &str| {
        let start = Instant::now();
        loop {
            match rx.recv_timeout(linux_deadline()) {
                Ok(seen) if seen.contains(what) => return seen,
                Ok(_) => {}
                Err(e) => panic!("the terminal never showed {what:?}: {e}"),
            }
            assert!(start.elapsed() < linux_deadline());
        }
    };
    typed.write_all(b"tty; echo $((6*7))-answer\n").unwrap();
    let seen = until("42-answer");
    assert!(seen.contains("/dev/pts/0"), "{seen}");
    typed.write_all(b"stty size; exit 4\n").unwrap();
    let status = tty.wait().unwrap();
    assert_eq!(status.code(), Some(4));
    drop(typed);

    c.assert_nothing_left();
}

#[test]
fn linux_containerd_sandboxes_hold_pods_and_limits() {
    let (_s, c) = or_skip!(setup, 256, false);
    // A memory limit in the spec sizes the VM (limit + the guest's overhead) and is the
    // container's cgroup limit in the guest.
    // (Privileged, to mount the guest's cgroup hierarchy: ctr's spec gives no cgroup
    // namespace, so the container's /sys/fs/cgroup shows nothing of its own.)
    let out = c.run(
        "limited",
        &["--memory-limit", "134217728", "--privileged"],
        &[
            "sh",
            "-c",
            "mkdir /tmp/cg; mount -t cgroup2 cgroup2 /tmp/cg; \
             p=$(cat /proc/self/cgroup); cat /tmp/cg${p#0::}/memory.max; \
             grep MemTotal /proc/meminfo",
        ],
    );
    let seen = text(&out.stdout);
    assert!(out.status.success(), "{seen} {}", text(&out.stderr));
    let mut lines = seen.lines();
    assert_eq!(lines.next(), Some("134217728"), "{}", text(&out.stderr));
    let kib: u64 = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (150_000..200_000).contains(&kib),
        "the guest has {kib} KiB for a 128 + 64 MiB VM"
    );

    // Two containers of one sandbox share its VM; each sees the other's processes only
    // when its spec joins the other's PID namespace.
    let pod = ["--annotation", "io.kubernetes.cri.sandbox-id=pod1"];
    c.run_detached("pod1", &pod, &["sleep", "1000"]);
    let listing = text(&c.ctr(&["task", "ls"]).stdout);
    let pid = listing
        .lines()
        .find(|l| l.starts_with("pod1 "))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("{listing}"))
        .to_string();
    // Its stats come from its cgroup in the guest: one process, memory in use, no limit.
    let out = c.ctr(&["task", "metrics", "--format", "json", "pod1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let metrics: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(metrics["pids"]["current"], 1, "{metrics}");
    assert!(
        metrics["memory"]["usage"].as_u64().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert_eq!(metrics["memory"]["usage_limit"], u64::MAX, "{metrics}");
    let ns = format!("pid:/proc/{pid}/ns/pid");
    let mut joined = pod.to_vec();
    joined.extend_from_slice(&["--with-ns", &ns]);
    let out = c.run("pod1-b", &joined, &["ps", "-o", "args"]);
    let seen = text(&out.stdout);
    assert!(seen.contains("sleep 1000"), "{seen} {}", text(&out.stderr));
    let out = c.run("pod1-c", &pod, &["ps", "-o", "args"]);
    let seen = text(&out.stdout);
    assert!(
        !seen.contains("sleep 1000") && seen.contains("ps -o args"),
        "{seen} {}",
        text(&out.stderr)
    );
    let embers = c.embers();
    assert_eq!(embers.len(), 1, "one VM for the pod: {embers:?}");
    c.kill_and_delete("pod1");
    c.assert_nothing_left();
}

#[test]
fn linux_containerd_starts_ten_sandboxes_at_once_from_one_template() {
    let (_s, c) = or_skip!(setup, 128, true);
    let c = std::sync::Arc::new(c);
    let runs: Vec<_> = (0..10)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                let id = format!("many{i}");
                let out = c.run(&id, &[], &["echo", &id]);
                (id, out)
            })
        })
        .collect();
    for run in runs {
        let (id, out) = run.join().unwrap();
        assert_eq!(
            text(&out.stdout),
            format!("{id}\n"),
            "{}",
            text(&out.stderr)
        );
    }
    // The first sandbox booted the guest and made the template; all ten were restored from
    // it (each needs a snapshot to restore from, so one made and kept is all of them).
    let templates: Vec<_> = std::fs::read_dir(c.dir.join("cache/templates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    assert_eq!(templates.len(), 1, "{templates:?}");
    for file in ["vmstate", "mem", "done"] {
        assert!(templates[0].join(file).exists(), "{file}");
    }
    c.assert_nothing_left();
}

#[test]
fn linux_containerd_reports_failures_and_leaks_nothing() {
    let (_s, c) = or_skip!(setup, 256, false);
    // A bundle the guest cannot run: the error reaches ctr.
    let out = c.run("badprog", &[], &["/no/such/program"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("/no/such/program"), "{err}");
    // An image that is not there: containerd says so before any shim runs.
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "docker.io/library/none:1",
        "noimg",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    c.assert_nothing_left();

    // Ember dies under a running container: the task ends with an error status.
    let (mut victim, mut lines) = c.spawn_run("vmdies", &["sh", "-c", "echo up; sleep 1000"]);
    assert_eq!(lines.next().unwrap().unwrap(), "up");
    let embers = c.embers();
    assert_eq!(embers.len(), 1, "{embers:?}");
    let _ = std::process::Command::new("kill")
        .args(["-9", &embers[0].0.to_string()])
        .status();
    let status = victim.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(255),
        "the task's status when its VM died"
    );
    c.assert_nothing_left();

    // The shim is killed under a running container: containerd cleans up after it (the
    // shim's delete), and the VM goes with its shim.
    c.run_detached("shimdies", &[], &["sleep", "1000"]);
    let shim = std::process::Command::new("pgrep")
        .args(["-f", "containerd-shim-ember-v2 .*-id shimdies"])
        .output()
        .unwrap();
    let pids = text(&shim.stdout);
    let pid = pids
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no shim for shimdies"));
    let _ = std::process::Command::new("kill")
        .args(["-9", pid])
        .status();
    let start = Instant::now();
    loop {
        let listing = text(&c.ctr(&["task", "ls"]).stdout);
        if !listing.contains("RUNNING") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{listing}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = c.ctr(&["task", "delete", "shimdies"]);
    let out = c.ctr(&["container", "delete", "shimdies"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    c.assert_nothing_left();
}

/// A sandbox in a network namespace set up by CNI (Debian's bridge and host-local plugins,
/// run in a second namespace that stands for the host): the container has the address and
/// MAC CNI gave and reaches the bridge's address in that other namespace, booted cold and
/// restored from the template (two pods restored from one template, each with its own).
#[test]
fn linux_containerd_gives_a_sandbox_its_cni_network() {
    let test = &test_name();
    if !std::path::Path::new("/usr/lib/cni/bridge").exists() {
        return skip(test, "containernetworking-plugins is not installed");
    }
    let (s, c) = or_skip!(setup, 256, false);
    let (Some(host), Some(pod)) = (
        common::netns::NetNs::new_or_skip(test),
        common::netns::NetNs::new_or_skip(test),
    ) else {
        return;
    };
    let conf = serde_json::json!({"cniVersion": "0.4.0", "name": "embertest", "type": "bridge",
        "bridge": "ember-cni0", "isGateway": true, "ipMasq": false,
        "ipam": {"type": "host-local", "subnet": "10.99.0.0/24",
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": s.path("ipam")}});
    // The CNI bridge plugin, run in `host` for the pod namespace `pod` (container ID `id`).
    let cni = |command: &str, pod: &common::netns::NetNs, id: &str| {
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &host.name, "/usr/lib/cni/bridge"])
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", format!("/var/run/netns/{}", pod.name))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "CNI {command}: {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    // A container in the pod's namespace has CNI's address and MAC, and pings the bridge.
    let run_in_pod = |pod: &common::netns::NetNs, id: &str, address: &str, mac: &str| {
        let ns = format!("network:/var/run/netns/{}", pod.name);
        let out = c.run(
            id,
            &["--with-ns", &ns],
            &["sh", "-c", "ip addr show eth0; ping -c 1 -W 10 10.99.0.1"],
        );
        let seen = text(&out.stdout);
        assert!(out.status.success(), "{seen} {}", text(&out.stderr));
        assert!(seen.contains(&format!("inet {address}")), "{seen}");
        assert!(seen.contains(&format!("link/ether {mac}")), "{seen}");
        assert!(seen.contains("1 packets received"), "{seen}");
        c.assert_nothing_left();
        // The TAP went with the sandbox.
        let links = pod.exec(&["ip", "-o", "link", "show"]);
        assert!(!links.contains("tap0"), "{links}");
    };
    let added: serde_json::Value = serde_json::from_str(&cni("ADD", &pod, "cni1")).unwrap();
    let address = added["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(address.starts_with("10.99.0."), "{added}");
    let mac = pod.exec(&["cat", "/sys/class/net/eth0/address"]);
    run_in_pod(&pod, "cni1", &address, mac.trim());

    // From the template: the first sandbox makes it (with a NIC, in its namespace) and a
    // second pod's sandbox restores it; each guest has its own pod's address and MAC.
    c.use_template(true);
    run_in_pod(&pod, "cni2", &address, mac.trim());
    let pod2 = or_skip!(common::netns::NetNs::new_or_skip);
    let added2: serde_json::Value = serde_json::from_str(&cni("ADD", &pod2, "cni3")).unwrap();
    let address2 = added2["ips"][0]["address"].as_str().unwrap().to_string();
    let mac2 = pod2.exec(&["cat", "/sys/class/net/eth0/address"]);
    assert_ne!(mac.trim(), mac2.trim());
    run_in_pod(&pod2, "cni3", &address2, mac2.trim());
    cni("DEL", &pod2, "cni3");
    cni("DEL", &pod, "cni1");
}

/// CRI's way: 64-character IDs, and host files and the pod's /dev/shm bind-mounted into each
/// container (containerd's CRI mounts its sandbox's `hosts`, `hostname`, `resolv.conf` and
/// `shm` so). The guest gets copies; the pod's containers share one /dev/shm. A mount that
/// cannot reach the guest fails the create with its cause, and leaves nothing.
#[test]
fn linux_containerd_cri_ids_and_host_mounts_reach_the_guest() {
    let (s, c) = or_skip!(setup, 128, true);
    let hosts = s.path("hosts");
    std::fs::write(&hosts, "10.1.2.3 pod-peer\n").unwrap();
    let shm = s.path("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let sandbox_id = "5f".repeat(32);
    let pod = format!("io.kubernetes.cri.sandbox-id={sandbox_id}");
    let mounts = [
        format!(
            "type=bind,src={},dst=/etc/hosts,options=rbind:ro",
            hosts.display()
        ),
        format!(
            "type=bind,src={},dst=/dev/shm,options=rbind:rw",
            shm.display()
        ),
    ];
    let first = "a1".repeat(32);
    let options = [
        "--annotation",
        &pod,
        "--mount",
        &mounts[0],
        "--mount",
        &mounts[1],
    ];
    let marker = "echo from-first > /dev/shm/marker; sleep 1000";
    c.run_detached(&first, &options, &["sh", "-c", marker]);
    let second = "b2".repeat(32);
    let start = Instant::now();
    let seen = loop {
        let out = c.run(
            &second,
            &options,
            &["sh", "-c", "cat /etc/hosts /dev/shm/marker"],
        );
        let seen = text(&out.stdout);
        if seen.contains("from-first") || start.elapsed() > linux_deadline() {
            break seen + &text(&out.stderr);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(seen, "10.1.2.3 pod-peer\nfrom-first\n");
    assert_eq!(c.embers().len(), 1, "one VM for the pod");
    c.kill_and_delete(&first);
    // A mount of something the guest cannot get: refused before any VM starts.
    let missing = format!(
        "type=bind,src={},dst=/x,options=rbind",
        s.path("missing").display()
    );
    let out = c.run("bad-mount", &["--mount", &missing], &["true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot copy the mount source") && err.contains("missing"),
        "{err}"
    );
    c.assert_nothing_left();
}
