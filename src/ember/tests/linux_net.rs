//! virtio-net and the MMDS with the Linux guest, each in a network namespace the test makes
//! and removes: the TAP devices and their host addresses live there, and ember runs there
//! (`ip netns exec`), as the jailer's `--netns` would put it. Host-side peers are threads
//! that joined the namespace. The guest side is busybox and the guest agent.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::api::{Client, Ember};
use common::linux::*;
use common::netns::{sink, source, Capture, NetNs, Received};
use common::*;
use guest_agent::pattern_checksum;
use serde_json::json;

const MIB: u64 = 1 << 20;

/// On PVM hosts the guest kernel is emulated and its cost is per packet (docs/pvm.md): a
/// 64 KiB MTU moves the same bytes in a tenth of the time. Elsewhere, Ethernet's 1500.
fn mtu() -> u32 {
    match std::path::Path::new("/sys/module/kvm_pvm").exists() {
        true => 65520,
        false => 1500,
    }
}

fn start_linux(
    ns: &NetNs,
    s: &Scratch,
    img: &Images,
    ifaces: &[serde_json::Value],
    cmd: &str,
) -> (Ember, Client) {
    let ember = Ember::start_in(s, &[], Some(&ns.name));
    let mut c = ember.client();
    configure(&mut c, img, 2, 256, cmd);
    for iface in ifaces {
        let id = iface["iface_id"].as_str().unwrap();
        c.put(&format!("/network-interfaces/{id}"), iface)
            .expect(204, "");
    }
    (ember, c)
}

/// The value after `key ` in the agent line that starts with `prefix`.
fn agent_field(lines: &[String], prefix: &str, key: &str) -> String {
    let line = lines
        .iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in {lines:#?}"));
    let mut words = line.split_whitespace();
    words.find(|w| *w == key);
    words.next().unwrap_or_default().to_string()
}

#[test]
fn linux_pings_and_moves_100_mib_each_way_on_two_interfaces() {
    let img = linux_images!();
    let ns = or_skip!(NetNs::new_or_skip);
    let mtu = mtu();
    ns.add_tap("tap0", Some("10.50.1.1/24"), mtu);
    ns.add_tap("tap1", Some("10.50.2.1/24"), mtu);
    let big = 100 * MIB;
    let sink0 = sink(&ns, "10.50.1.1:5001", 0);
    let source0 = source(&ns, "10.50.1.1:5002", big, 2);
    let sink1 = sink(&ns, "10.50.2.1:5003", 0);
    let source1 = source(&ns, "10.50.2.1:5004", MIB, 4);
    let cmd = format!(
        "ip addr add 10.50.1.2/24 dev eth0; ip addr add 10.50.2.2/24 dev eth1; \
         ip link set eth0 up; ip link set eth1 up; \
         for i in eth0 eth1; do echo net-$i mac $(cat /sys/class/net/$i/address) mtu $(cat /sys/class/net/$i/mtu); done; \
         ping -c 2 -w 30 10.50.1.1 >/dev/null && echo ping-eth0-ok; \
         ping -c 2 -w 30 10.50.2.1 >/dev/null && echo ping-eth1-ok; \
         ember-agent send 10.50.1.1 5001 {big} 1; ember-agent recv 10.50.1.1 5002; \
         ember-agent send 10.50.2.1 5003 {MIB} 3; ember-agent recv 10.50.2.1 5004"
    );
    let s = Scratch::new("linux-net");
    let ifaces = [
        json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:0a:32:01:02", "mtu": mtu}),
        json!({"iface_id": "eth1", "host_dev_name": "tap1", "guest_mac": "06:00:0a:32:02:02", "mtu": mtu}),
    ];
    let (mut ember, mut c) = start_linux(&ns, &s, &img, &ifaces, &cmd);
    let started = Instant::now();
    c.instance_start();
    // While the guest runs (a TAP that goes down forgets its neighbours), the host has
    // learnt each configured MAC from the guest's ARP.
    ember.wait_for("\nping-eth1-ok", linux_deadline());
    assert!(ns
        .exec(&["ip", "neigh", "show", "dev", "tap0"])
        .contains("06:00:0a:32:01:02"));
    assert!(ns
        .exec(&["ip", "neigh", "show", "dev", "tap1"])
        .contains("06:00:0a:32:02:02"));
    ember.wait_clean_exit(linux_deadline());
    let lines = command_lines(&ember.stdout());
    eprintln!("guest run {:?}: {lines:#?}", started.elapsed());

    // The guest sees the configured MACs (and MTU); so does the host, from its ARP table.
    for (i, mac) in [("eth0", "06:00:0a:32:01:02"), ("eth1", "06:00:0a:32:02:02")] {
        assert_eq!(agent_field(&lines, &format!("net-{i}"), "mac"), mac);
        assert_eq!(
            agent_field(&lines, &format!("net-{i}"), "mtu"),
            mtu.to_string()
        );
    }
    assert!(lines.iter().any(|l| l == "ping-eth0-ok"), "{lines:#?}");
    assert!(lines.iter().any(|l| l == "ping-eth1-ok"), "{lines:#?}");

    // Guest to host: what arrived is what the guest sent, and what the pattern is.
    for (peer, len, seed, prefix) in [
        (sink0, big, 1, format!("ember-agent: sent {big} ")),
        (sink1, MIB, 3, format!("ember-agent: sent {MIB} ")),
    ] {
        let Received {
            bytes: got,
            checksum: sum,
            ..
        } = peer.join().unwrap();
        let expected = pattern_checksum(seed, len);
        assert_eq!(got, len);
        assert_eq!(sum, expected, "guest to host, {len} bytes");
        assert_eq!(
            agent_field(&lines, &prefix, "checksum"),
            format!("{expected:016x}")
        );
    }
    // Host to guest.
    source0.join().unwrap();
    source1.join().unwrap();
    for (len, seed) in [(big, 2), (MIB, 4)] {
        let prefix = format!("ember-agent: received {len} ");
        let expected = format!("{:016x}", pattern_checksum(seed, len));
        assert_eq!(
            agent_field(&lines, &prefix, "checksum"),
            expected,
            "host to guest, {len} bytes"
        );
    }
    for l in lines.iter().filter(|l| l.starts_with("ember-agent: ")) {
        eprintln!("{l}");
    }
}

/// Counts frames on a TAP that name `ip` (IPv4 source or destination, ARP sender or target),
/// and frames from `mac`, until stopped.
fn watch_tap(
    ns: &NetNs,
    tap: &str,
    ip: [u8; 4],
    mac: [u8; 6],
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    let tap = tap.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = ns.spawn(move || {
        let capture = Capture::open(&tap);
        tx.send(()).unwrap();
        let (mut naming, mut from_guest) = (0, 0);
        while !stop.load(Ordering::SeqCst) {
            let Some(f) = capture.next() else { continue };
            if f.len() < 34 {
                continue;
            }
            from_guest += usize::from(f[6..12] == mac);
            let names = match [f[12], f[13]] {
                [0x08, 0x00] => f[26..30] == ip || f[30..34] == ip,
                [0x08, 0x06] => f.len() >= 42 && (f[28..32] == ip || f[38..42] == ip),
                _ => false,
            };
            naming += usize::from(names);
        }
        (naming, from_guest)
    });
    rx.recv().unwrap();
    watcher
}

#[test]
fn linux_reads_the_mmds_v2_with_tokens_and_never_through_the_tap() {
    let img = linux_images!();
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", Some("10.51.0.1/24"), mtu());
    let stop = Arc::new(AtomicBool::new(false));
    let mac = [0x06, 0, 0x0a, 0x33, 0, 2];
    let watcher = watch_tap(&ns, "tap0", [169, 254, 169, 254], mac, stop.clone());
    const URL: &str = "http://169.254.169.254/latest/meta-data";
    const AGENT: &str = "ember-agent http 169.254.169.254";
    let cmd = format!(
        "ip addr add 10.51.0.2/24 dev eth0; ip link set eth0 up; ip route add 169.254.169.254 dev eth0; \
         ping -c 1 -w 30 10.51.0.1 >/dev/null && echo ping-ok; \
         wget -q -O- {URL}/instance-id || echo wget-without-token-refused; \
         {AGENT} GET /latest/meta-data/instance-id; \
         {AGENT} PUT /latest/api/token; \
         T=$({AGENT} PUT /latest/api/token X-metadata-token-ttl-seconds:60 | sed 's/.* body //'); echo token-length ${{#T}}; \
         echo id $(wget -q -O- --header X-metadata-token:$T {URL}/instance-id); \
         echo keys $(wget -q -O- --header X-metadata-token:$T {URL}/); \
         {AGENT} GET /latest/meta-data X-metadata-token:$T Accept:application/json; \
         S=$({AGENT} PUT /latest/api/token X-aws-ec2-metadata-token-ttl-seconds:1 | sed 's/.* body //'); sleep 2; \
         echo expired; {AGENT} GET /latest/meta-data/instance-id X-metadata-token:$S; \
         echo mmds-wait-patch; \
         until wget -q -O- --header X-metadata-token:$T {URL}/phase | grep -q two; do sleep 1; done; \
         echo phase-two-seen"
    );
    let s = Scratch::new("linux-mmds");
    let iface = json!({"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:0a:33:00:02", "mtu": mtu()});
    let (mut ember, mut c) = start_linux(&ns, &s, &img, &[iface], &cmd);
    c.put(
        "/mmds/config",
        &json!({"version": "V2", "network_interfaces": ["eth0"]}),
    )
    .expect(204, "");
    c.put(
        "/mmds",
        &json!({"latest": {"meta-data": {"instance-id": "i-ember", "phase": "one", "net": {"mac": "x"}}}}),
    )
    .expect(204, "");
    c.instance_start();
    ember.wait_for("\nmmds-wait-patch", linux_deadline());
    let patched = Instant::now();
    c.patch("/mmds", &json!({"latest": {"meta-data": {"phase": "two"}}}))
        .expect(204, "");
    ember.wait_clean_exit(linux_deadline());
    eprintln!("the guest saw the PATCH {:?} after it", patched.elapsed());
    stop.store(true, Ordering::SeqCst);
    let (naming_mmds, from_guest) = watcher.join().unwrap();
    let lines = command_lines(&ember.stdout());
    eprintln!("{lines:#?}");

    let has = |l: &str| lines.iter().any(|x| x == l);
    assert!(has("ping-ok"));
    assert!(has("wget-without-token-refused"));
    assert!(has("ember-agent: status 401 body No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` header to specify the session token."), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l
                .starts_with("ember-agent: status 400 body Token time to live value not found."))
    );
    assert!(has("token-length 64"));
    assert!(has("id i-ember"));
    assert!(has("keys instance-id net/ phase"));
    assert!(
        has(
            r#"ember-agent: status 200 body {"instance-id":"i-ember","net":{"mac":"x"},"phase":"one"}"#
        ),
        "{lines:#?}"
    );
    let expired = lines.iter().position(|l| l == "expired").unwrap();
    assert_eq!(
        lines[expired + 1],
        "ember-agent: status 401 body MMDS token not valid."
    );
    assert!(has("phase-two-seen"));
    // The guest's own traffic went through the TAP; none of the MMDS's did.
    assert!(from_guest > 0, "the capture saw nothing from the guest");
    assert_eq!(naming_mmds, 0, "frames for the MMDS reached the TAP");
}

#[test]
fn linux_hostile_traffic_to_the_mmds_leaves_it_answering() {
    let img = linux_images!();
    let ns = or_skip!(NetNs::new_or_skip);
    ns.add_tap("tap0", Some("10.52.0.1/24"), mtu());
    const AGENT: &str = "ember-agent";
    const IP: &str = "169.254.169.254";
    let cmd = format!(
        "ip addr add 10.52.0.2/24 dev eth0; ip link set eth0 up; ip route add {IP} dev eth0; \
         echo before $(wget -q -O- http://{IP}/latest/id); echo hostile-start; \
         {AGENT} raw-tcp {IP} 80; \
         {AGENT} connect-many {IP} 80 1000; \
         {AGENT} connect-many {IP} 81 3; \
         {AGENT} http {IP} GET /latest/id pad:65536; \
         {AGENT} http {IP} GET /latest/id pad:3000; \
         {AGENT} http {IP} DELETE /latest/id; \
         sleep 2; echo after $(wget -q -O- http://{IP}/latest/id); \
         echo hostile-done; sleep 3"
    );
    let s = Scratch::new("linux-hostile");
    let iface = json!({"iface_id": "eth0", "host_dev_name": "tap0", "mtu": mtu()});
    let (mut ember, mut c) = start_linux(&ns, &s, &img, &[iface], &cmd);
    c.put("/mmds/config", &json!({"network_interfaces": ["eth0"]}))
        .expect(204, "");
    c.put("/mmds", &json!({"latest": {"id": "i-1"}}))
        .expect(204, "");
    c.instance_start();
    ember.wait_for("\nhostile-start", linux_deadline());
    let before = ember.rss_kib();
    // After boot: PATCH may change only rate limiters; the rest is refused as Firecracker does.
    c.patch("/network-interfaces/eth0", &json!({"iface_id": "eth0"}))
        .expect(204, "");
    c.patch(
        "/network-interfaces/eth0",
        &json!({"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 0, "refill_time": 100}}}),
    )
    .expect(204, "");
    c.patch(
        "/network-interfaces/eth0",
        &json!({"iface_id": "eth0", "tx_rate_limiter": {"ops": {"size": 10, "refill_time": 0}}}),
    )
    .expect(400, "refill_time");
    c.patch("/network-interfaces/eth7", &json!({"iface_id": "eth7"}))
        .expect(400, "there is no network interface with iface_id eth7");
    c.put(
        "/network-interfaces/eth1",
        &json!({"iface_id": "eth1", "host_dev_name": "tap0"}),
    )
    .expect(400, "not supported after starting the microVM");
    c.put("/mmds/config", &json!({"network_interfaces": ["eth0"]}))
        .expect(400, "not supported after starting the microVM");
    ember.wait_for("\nhostile-done", linux_deadline());
    let after = ember.rss_kib();
    ember.wait_clean_exit(linux_deadline());
    let lines = command_lines(&ember.stdout());
    eprintln!("{lines:#?}\nember RSS {before} KiB before, {after} KiB after");

    let has = |l: &str| lines.iter().any(|x| x == l);
    assert!(has("before i-1"));
    assert!(lines
        .iter()
        .any(|l| l.starts_with("ember-agent: raw packets sent ")));
    // The guest holds every connection it gets open. The MMDS takes 32 at a time and drops
    // one after 5 s without a request, so some of the 1,000 are accepted and the others
    // refused at once (RST); none hang.
    let accepted: usize = agent_field(&lines, "ember-agent: accepted", "accepted")
        .parse()
        .unwrap();
    let refused: usize = agent_field(&lines, "ember-agent: accepted", "refused")
        .parse()
        .unwrap();
    assert!(accepted >= 32 && refused > 0, "{lines:#?}");
    assert_eq!(accepted + refused, 1000, "{lines:#?}");
    assert!(
        has("ember-agent: accepted 0 refused 3 failed 0"),
        "a closed port refuses"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            "ember-agent: status 400 body Bad request: the request headers are too long."
        )),
        "{lines:#?}"
    );
    assert!(has("ember-agent: status 200 body i-1"));
    assert!(has("ember-agent: status 405 body Not allowed HTTP method."));
    assert!(has("after i-1"), "{lines:#?}");
    assert!(
        after < before + 8 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
}
