//! vsock with the Linux guest and the guest agent (`ember-agent serve`): host-initiated and
//! guest-initiated streams with 100 MiB each way and matching checksums, 64 connections at
//! once, a host reader that stops (the guest writer blocks, ember's memory does not grow),
//! closes seen by the other side, and the clean failures (no listener, a malformed
//! `CONNECT`).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::api::Ember;
use common::linux::*;
use common::vsock::*;
use common::*;
use guest_agent::{pattern_checksum, read_checksum, write_pattern, Checksum};
use serde_json::json;

const PORT: u32 = 5000;
const MIB: u64 = 1 << 20;

/// Writes `len` bytes of `Pattern::new(seed)` to `s`.
fn send_pattern(s: &mut UnixStream, len: u64, seed: u64) {
    write_pattern(s, len, seed).unwrap();
}

/// Reads `s` to its end: the byte count and checksum.
fn drain(s: &mut impl Read) -> (u64, u64) {
    read_checksum(s, Checksum::default()).unwrap()
}

fn checksum_line(len: u64, seed: u64) -> String {
    format!(
        "received {len} checksum {:016x}",
        pattern_checksum(seed, len)
    )
}

#[test]
fn linux_streams_over_vsock_both_ways_with_flow_control_and_clean_failures() {
    let img = linux_images!();
    let s = Scratch::new("linux-vsock");
    let uds = s.path("v.sock");
    let metrics = s.path("metrics.json");
    let mut ember = Ember::start(&s, &["--metrics-path", metrics.to_str().unwrap()]);
    let mut c = ember.client();
    configure(&mut c, &img, 2, 256, &format!("ember-agent serve {PORT}"));
    c.put(
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": uds.to_str().unwrap()}),
    )
    .expect(204, "");
    // A second device, or a path in use, is refused; a PUT of the same path replaces it.
    c.put("/vsock", &json!({"guest_cid": 2, "uds_path": "/tmp/x"}))
        .expect(400, "guest_cid must be at least 3");
    let taken = s.file("taken", b"");
    c.put("/vsock", &json!({"guest_cid": 4, "uds_path": taken}))
        .expect(400, "cannot listen on the vsock socket");
    c.put(
        "/vsock",
        &json!({"guest_cid": 3, "uds_path": uds.to_str().unwrap()}),
    )
    .expect(204, "");
    let config = c.get("/vm/config").expect(200, "").json();
    assert_eq!(config["vsock"]["uds_path"], uds.to_str().unwrap());

    let started = Instant::now();
    c.instance_start();
    let mut first = connect_when_up(&uds, PORT, linux_deadline());
    first.write_all(b"INFO\n").unwrap();
    let info = read_line(&mut first);
    eprintln!(
        "first answer {} ms after InstanceStart: {info}",
        started.elapsed().as_millis()
    );
    assert!(info.starts_with("cpus 2 memtotal_kib "), "{info}");

    // Commands run in the guest.
    let mut run = connect(&uds, PORT).unwrap();
    run.write_all(b"RUN echo from-the-guest $((6 * 7)); exit 3\n")
        .unwrap();
    let mut out = String::new();
    run.read_to_string(&mut out).unwrap();
    assert_eq!(out, "from-the-guest 42\nexit 3\n");

    // 100 MiB host to guest, then guest to host.
    let mut sink = connect(&uds, PORT).unwrap();
    sink.write_all(b"SINK\n").unwrap();
    let t = Instant::now();
    send_pattern(&mut sink, 100 * MIB, 1);
    sink.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_line(&mut sink).trim_end(), checksum_line(100 * MIB, 1));
    eprintln!("host to guest: 100 MiB in {} ms", t.elapsed().as_millis());
    let mut source = connect(&uds, PORT).unwrap();
    source.write_all(b"SOURCE 104857600 2\n").unwrap();
    let t = Instant::now();
    let (n, sum) = drain(&mut source);
    eprintln!("guest to host: 100 MiB in {} ms", t.elapsed().as_millis());
    assert_eq!((n, sum), (100 * MIB, pattern_checksum(2, 100 * MIB)));

    // The guest connects to the host: 1 MiB each way on uds_path_6000, nothing on 6001.
    let listener = UnixListener::bind(format!("{}_6000", uds.display())).unwrap();
    let host = std::thread::spawn(move || {
        let (mut a, _) = listener.accept().unwrap();
        let got = drain(&mut a);
        a.write_all(b"thanks\n").unwrap();
        drop(a);
        let (mut b, _) = listener.accept().unwrap();
        send_pattern(&mut b, MIB, 4);
        got
    });
    let sent = request(&uds, PORT, "SEND 6000 1048576 3");
    assert_eq!(
        sent,
        format!(
            "sent 1048576 checksum {:016x} reply thanks",
            pattern_checksum(3, MIB)
        )
    );
    assert_eq!(request(&uds, PORT, "FETCH 6000"), checksum_line(MIB, 4));
    assert_eq!(host.join().unwrap(), (MIB, pattern_checksum(3, MIB)));
    let refused = request(&uds, PORT, "FETCH 6001");
    assert!(refused.starts_with("refused "), "{refused}");

    sixty_four_connections_at_once(&uds);
    a_stopped_reader_blocks_the_guest_writer(&ember, &uds);

    // Closing either side: the host ends its side of an echo, the guest echoes what it had
    // and closes, and the host reads that end.
    let mut echo = connect(&uds, PORT).unwrap();
    echo.write_all(b"ECHO\nlast words").unwrap();
    echo.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    echo.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "last words");
    // The host closes without a word: the guest's agent sees the end, and its thread ends.
    drop(connect(&uds, PORT).unwrap());

    // Clean failures: no listener on the port, a malformed line; ember carries on.
    let t = Instant::now();
    assert_eq!(connect(&uds, 5001).unwrap_err(), "");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for bad in [
        "CONNECT\n",
        "CONNECT 5000 5000\n",
        "connect 5000\n",
        "CONNECT 99999999999\n",
    ] {
        let mut s = UnixStream::connect(&uds).unwrap();
        s.write_all(bad.as_bytes()).unwrap();
        assert_eq!(read_line(&mut s), "", "{bad:?}");
    }
    assert!(request(&uds, PORT, "INFO").starts_with("cpus 2"));

    // Every connection ended on both sides: ember holds none.
    std::thread::sleep(Duration::from_secs(1));
    drop(first);
    c.put("/actions", &json!({"action_type": "FlushMetrics"}))
        .expect(204, "");
    let lines = metrics_lines(&metrics);
    let (added, removed) = (
        metric_sum(&lines, "vsock", "conns_added"),
        metric_sum(&lines, "vsock", "conns_removed"),
    );
    eprintln!("connections added {added}, removed {removed}");
    assert!(added >= 80, "{added}");
    // The first connection (dropped just now) may still be closing.
    assert!(removed + 1 >= added, "{added} added, {removed} removed");
    assert!(metric_sum(&lines, "vsock", "rx_bytes_count") >= 100 * MIB);
    assert!(metric_sum(&lines, "vsock", "tx_bytes_count") >= 100 * MIB);
    assert_eq!(ember.terminate(), Some(143));
}

/// 64 echo streams open together, each carrying its own 64 KiB.
fn sixty_four_connections_at_once(uds: &Path) {
    let mut streams: Vec<UnixStream> = (0..64)
        .map(|i| {
            let mut s = connect(uds, PORT).unwrap_or_else(|e| panic!("connection {i}: {e:?}"));
            s.write_all(b"ECHO\n").unwrap();
            s
        })
        .collect();
    let t = Instant::now();
    let writers: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                send_pattern(&mut s, 64 << 10, 100 + i as u64);
                s.shutdown(std::net::Shutdown::Write).unwrap();
            })
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        assert_eq!(
            drain(s),
            (64 << 10, pattern_checksum(100 + i as u64, 64 << 10)),
            "connection {i}"
        );
    }
    for w in writers {
        w.join().unwrap();
    }
    eprintln!(
        "64 connections: 4 MiB echoed in {} ms",
        t.elapsed().as_millis()
    );
}

/// The host reads 1 MiB of a 64 MiB stream and stops: the guest's writer stops soon after
/// (its count stays put), and ember's RSS stays put; then the rest arrives intact.
fn a_stopped_reader_blocks_the_guest_writer(ember: &Ember, uds: &Path) {
    // The agent counts what all its SOURCE streams wrote.
    let written = || field(&request(uds, PORT, "STATUS"), "source_written");
    let base = written();
    let mut s = connect(uds, PORT).unwrap();
    s.write_all(b"SOURCE 67108864 5\n").unwrap();
    let mut head = vec![0u8; MIB as usize];
    s.read_exact(&mut head).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let rss_before = ember.rss_kib();
    let first = written() - base;
    std::thread::sleep(Duration::from_secs(3));
    let second = written() - base;
    let rss_after = ember.rss_kib();
    eprintln!(
        "stopped reader: the guest wrote {first} then {second} bytes; ember RSS {rss_before} -> {rss_after} KiB"
    );
    assert_eq!(first, second, "the guest writer kept going");
    assert!(second < 8 * MIB, "the guest wrote {second} bytes");
    assert!(
        rss_after < rss_before + 2048,
        "{rss_before} -> {rss_after} KiB"
    );
    let mut sum = Checksum::default();
    sum.update(&head);
    let (rest, sum) = read_checksum(&mut s, sum).unwrap();
    assert_eq!((rest + MIB, sum), (64 * MIB, pattern_checksum(5, 64 * MIB)));
}
