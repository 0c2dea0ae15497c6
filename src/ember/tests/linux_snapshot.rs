//! A Linux guest snapshotted and restored in a new ember process: its open TCP connection to
//! a host peer carries on (over another TAP, by `network_overrides`), its disk holds what it
//! wrote and takes more, its clock has not gone back, its MMDS data and its console are
//! there, and vsock works again at the new socket (`vsock_override`) after the transport
//! reset.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::api::Ember;
use common::linux::*;
use common::netns::{accept, NetNs};
use common::snapshot::{create, pause};
use common::vsock::connect_when_up;
use common::*;
use serde_json::json;

const PORT: u32 = 5000;

/// An ember inside `ns` with its API socket at `<name>.sock`, with `--enable-pci` if `pci`.
fn ember_in(ns: &NetNs, s: &Scratch, name: &str, pci: bool) -> Ember {
    let sock = s.path(&format!("{name}.sock"));
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &ns.name, EMBER, "--api-sock"])
        .arg(&sock);
    if pci {
        command.arg("--enable-pci");
    }
    Ember::spawn(command, sock)
}

/// `RUN cmd` through the agent: everything it answered. A restored guest resets its old
/// vsock connections (the transport reset event), and Ember gives it nothing new until it
/// has: a connection made right after the restore is answered whole, and a cut answer fails
/// the test.
fn run(uds: &Path, cmd: &str) -> String {
    let mut s: UnixStream = connect_when_up(uds, PORT, linux_deadline());
    s.write_all(format!("RUN {cmd}\n").as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.contains("exit "), "the agent's answer was cut: {out:?}");
    out
}

/// The guest's uptime in seconds, from `/proc/uptime` in `out`.
fn uptime(out: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with("uptime ")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn echo(tcp: &mut TcpStream, reader: &mut BufReader<TcpStream>, word: &str) -> String {
    tcp.write_all(format!("{word}\n").as_bytes()).unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    line.trim_end().to_string()
}

#[test]
fn linux_guest_restored_in_a_new_process_keeps_its_connection_disk_clock_and_mmds() {
    restored_in_a_new_process(false);
}

/// The same with every device on the PCI bus (`--enable-pci`): the guest finds them there,
/// not as virtio-mmio, and their MSI-X vectors and moved state survive the restore.
#[test]
fn linux_pci_guest_restored_in_a_new_process_keeps_its_connection_disk_clock_and_mmds() {
    restored_in_a_new_process(true);
}

/// What the guest says of its buses: the PCI functions' device IDs in slot order and how
/// many MSI-X interrupts and virtio-mmio devices it has.
const BUSES: &str = "echo pci $(cat /sys/bus/pci/devices/*/device 2>/dev/null | tr '\\n' ,); \
                     echo msi $(grep -c PCI-MSI /proc/interrupts); \
                     echo mmio $(ls /sys/bus/platform/devices | grep -c virtio-mmio)";

fn restored_in_a_new_process(pci: bool) {
    let pci = pci || all_on_pci();
    let img = linux_images!();
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", Some("10.53.0.1/24"), 1500);
    let listener = ns
        .spawn(|| TcpListener::bind("10.53.0.1:7000").unwrap())
        .join()
        .unwrap();
    let s = Scratch::new("linux-snapshot");
    let data = s.file("data.img", &vec![0u8; 1 << 20]);
    let (uds_a, uds_b) = (s.path("a.vsock"), s.path("b.vsock"));

    let mut a = ember_in(&ns, &s, "a", pci);
    let mut c = a.client();
    let cmd = "ip addr add 10.53.0.2/24 dev eth0; ip link set eth0 up; \
               ip route add 169.254.169.254 dev eth0; \
               ember-agent echo-tcp 10.53.0.1 7000 & ember-agent serve 5000";
    configure_bus(&mut c, &img, 2, 256, cmd, pci);
    c.put(
        "/drives/data",
        &json!({"drive_id": "data", "path_on_host": data, "is_root_device": false}),
    )
    .expect(204, "");
    c.put_eth0_with_mmds();
    c.put("/mmds", &json!({"role": "snapshotted"}))
        .expect(204, "");
    c.put("/vsock", &json!({"guest_cid": 3, "uds_path": uds_a}))
        .expect(204, "");
    c.instance_start();

    let mut tcp = accept(&listener, linux_deadline());
    tcp.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut reader = BufReader::new(tcp.try_clone().unwrap());
    assert_eq!(echo(&mut tcp, &mut reader, "before"), "echo before");
    let before = run(
        &uds_a,
        "printf on-disk-before > /dev/vdb; sync; echo uptime $(cut -d' ' -f1 /proc/uptime)",
    );
    let t1 = uptime(&before);
    let buses = run(&uds_a, BUSES);
    if pci {
        // The host bridge, then the root disk, the data disk, the NIC and vsock (virtio
        // device IDs 0x1040 + type), each with MSI-X vectors in use, and no virtio-mmio.
        assert!(
            buses.contains("pci 0x0008,0x1042,0x1042,0x1041,0x1053,\n"),
            "{buses}"
        );
        let msi: u32 = buses
            .split("msi ")
            .nth(1)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(msi >= 4, "{buses}");
        assert!(buses.contains("mmio 0\n"), "{buses}");
    } else {
        assert!(
            buses.contains("pci\n") && buses.contains("msi 0\n"),
            "{buses}"
        );
        assert!(buses.contains("mmio 4\n"), "{buses}");
    }
    pause(&mut c);
    let (state, mem) = (s.path("vm.snap"), s.path("vm.mem"));
    create(&mut c, &state, &mem, "Full");
    assert_eq!(a.terminate(), Some(128 + libc::SIGTERM));
    assert!(read(Path::new(&data)).starts_with(b"on-disk-before"));

    // Another TAP with the host's address and MAC, as after a move to another host.
    let mac = ns.exec(&["cat", "/sys/class/net/tap0/address"]);
    ns.exec(&["ip", "link", "del", "tap0"]);
    ns.exec(&["ip", "tuntap", "add", "tap1", "mode", "tap"]);
    ns.exec(&["ip", "link", "set", "tap1", "address", mac.trim()]);
    ns.exec(&["ip", "addr", "add", "10.53.0.1/24", "dev", "tap1"]);
    ns.exec(&["ip", "link", "set", "tap1", "up"]);

    let mut b = ember_in(&ns, &s, "b", pci);
    let mut c = b.client();
    let mut body = common::snapshot::load_body(&state, &mem, true);
    body["network_overrides"] = json!([{"iface_id": "eth0", "host_dev_name": "tap1"}]);
    body["vsock_override"] = json!({"uds_path": uds_b});
    c.put("/snapshot/load", &body).expect(204, "");
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["network-interfaces"][0]["host_dev_name"], "tap1");
    assert_eq!(config["vsock"]["uds_path"], uds_b.to_str().unwrap());

    // The TCP connection the guest opened before the snapshot carries on.
    assert_eq!(echo(&mut tcp, &mut reader, "after"), "echo after");
    let after = run(
        &uds_b,
        "echo uptime $(cut -d' ' -f1 /proc/uptime); echo disk $(head -c 14 /dev/vdb); \
         printf on-disk-after | dd of=/dev/vdb bs=512 seek=1 2>/dev/null; sync; \
         ember-agent http 169.254.169.254 GET /role; echo restored-console > /dev/console",
    );
    eprintln!("before: {before}\nafter: {after}");
    let t2 = uptime(&after);
    assert!(t2 >= t1, "the guest clock went back: {t1} -> {t2}");
    assert!(t2 < t1 + 60.0, "the guest clock jumped: {t1} -> {t2}");
    assert!(after.contains("disk on-disk-before"), "{after}");
    assert!(after.contains("status 200 body snapshotted"), "{after}");
    assert!(after.ends_with("exit 0\n"), "{after}");
    assert_eq!(run(&uds_b, BUSES), buses, "the restored guest's buses");
    b.wait_for("restored-console", Duration::from_secs(30));
    assert_eq!(&read(Path::new(&data))[512..525], b"on-disk-after");
    drop(tcp);
    assert_eq!(b.terminate(), Some(128 + libc::SIGTERM));
}
