//! ember-agent: commands for the tests, one per invocation, each printing one result line.
//!
//!   ember-agent send HOST PORT BYTES SEED   connect, send the test pattern, print its checksum
//!   ember-agent recv HOST PORT [SKIP]       connect, read to the end, print count and checksum,
//!                                           and the rate (bytes/s) after the first SKIP bytes
//!   ember-agent connect-many IP PORT N      open N TCP connections at once; print how many
//!                                           were accepted and how many refused
//!   ember-agent raw-tcp IP PORT             send malformed and flooding TCP/IPv4 packets to
//!                                           IP:PORT through a raw socket
//!   ember-agent http-latency IP PATH N      N GETs, one connection each; prints the median,
//!                                           minimum and maximum time per request in µs
//!   ember-agent http IP METHOD PATH [NAME:VALUE]...
//!                                           one HTTP request to IP:80; prints the status and
//!                                           the body on one line. `pad:N` sends a header of
//!                                           N bytes.
//!   ember-agent dio read|write|randread|randwrite DEV BS COUNT [SKIP]
//!                                           SKIP then COUNT direct-I/O requests of BS
//!                                           bytes; prints bytes, requests, µs and bytes
//!                                           per second of the last COUNT
//!   ember-agent touch MIB                   write to every page of MIB MiB of fresh memory,
//!                                           then exit (the guest frees it, the host keeps it)
//!   ember-agent read FILE BYTES [SKIP]      read SKIP then BYTES bytes of FILE (e.g.
//!                                           /dev/hwrng); prints bytes, µs, bytes per second
//!                                           and how many distinct byte values the BYTES had
//!   ember-agent serve PORT                  answer requests on vsock PORT (see vsock.rs)
//!   ember-agent containers [PORT]           run OCI containers for the host on vsock PORT
//!                                           (1025; containers/, docs/containers.md)
//!   ember-agent echo-tcp HOST PORT          connect, then send back each line received as
//!                                           `echo LINE`, until the peer closes (a TCP
//!                                           connection that lives across a snapshot)

mod containers;
mod dio;
mod raw;
mod vsock;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use guest_agent::{receive, write_pattern};

const CHUNK: usize = 1 << 18;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["send", host, port, bytes, seed] => send(host, port, bytes, seed),
        ["recv", host, port] => recv(host, port, "0"),
        ["recv", host, port, skip] => recv(host, port, skip),
        ["connect-many", ip, port, n] => connect_many(ip, port, n),
        ["raw-tcp", ip, port] => raw::flood(ip, port),
        ["dio", mode, dev, bs, count] => dio::run(mode, dev, bs, count, "0"),
        ["dio", mode, dev, bs, count, skip] => dio::run(mode, dev, bs, count, skip),
        ["touch", mib] => touch(mib),
        ["serve", port] => vsock::serve(port),
        ["containers"] => containers::serve(containers::DEFAULT_PORT),
        ["containers", port] => port_number(port).and_then(containers::serve),
        ["echo-tcp", host, port] => echo_tcp(host, port),
        ["read", file, bytes] => read_rate(file, bytes, "0"),
        ["read", file, bytes, skip] => read_rate(file, bytes, skip),
        ["http-latency", ip, path, n] => http_latency(ip, path, n),
        ["http", ip, method, path, ref headers @ ..] => http(ip, method, path, headers),
        _ => Err("usage: see the comment at the top of src/guest-agent/src/main.rs".into()),
    };
    match result {
        Ok(line) => println!("ember-agent: {line}"),
        Err(e) => {
            println!("ember-agent: error: {e}");
            std::process::exit(1);
        }
    }
}

type Result<T> = std::result::Result<T, String>;

/// `echo-tcp HOST PORT`: one connection, each line echoed back with `echo ` before it.
fn echo_tcp(host: &str, port: &str) -> Result<String> {
    use std::io::BufRead;
    let addr = format!("{host}:{port}");
    let stream = TcpStream::connect(&addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let mut out = stream.try_clone().map_err(|e| e.to_string())?;
    let mut lines = 0;
    for line in std::io::BufReader::new(stream).lines() {
        let line = line.map_err(|e| format!("read: {e}"))?;
        out.write_all(format!("echo {line}\n").as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        lines += 1;
    }
    Ok(format!("echoed {lines} lines"))
}

/// `touch MIB`: makes the guest's kernel back MIB MiB with pages, one write a page.
fn touch(mib: &str) -> Result<String> {
    let bytes = usize::try_from(number(mib)? << 20).map_err(|_| "too large".to_string())?;
    let started = Instant::now();
    let mut memory: Vec<u8> = Vec::new();
    memory
        .try_reserve_exact(bytes)
        .map_err(|e| format!("cannot allocate {mib} MiB: {e}"))?;
    memory.resize(bytes, 0);
    for page in memory.chunks_mut(4096) {
        page[0] = 1;
    }
    let sum: u64 = memory.iter().step_by(4096).map(|&b| u64::from(b)).sum();
    Ok(format!(
        "touched {mib} MiB pages {sum} us {}",
        started.elapsed().as_micros()
    ))
}

/// `read FILE BYTES [SKIP]`: plain reads, as a program reading a character device does.
fn read_rate(file: &str, bytes: &str, skip: &str) -> Result<String> {
    let (bytes, skip) = (number(bytes)?, number(skip)?);
    let mut f = std::fs::File::open(file).map_err(|e| format!("open {file}: {e}"))?;
    let mut buf = vec![0u8; 4096];
    let mut seen = [false; 256];
    let mut done = 0u64;
    let mut started = Instant::now();
    while done < skip + bytes {
        if done == skip {
            started = Instant::now();
        }
        // Up to the end of the skipped part, then up to the end.
        let stop = if done < skip { skip } else { skip + bytes };
        let want = (stop - done).min(buf.len() as u64) as usize;
        let n = f
            .read(&mut buf[..want])
            .map_err(|e| format!("read {file}: {e}"))?;
        if n == 0 {
            return Err(format!("{file} ended after {done} bytes"));
        }
        if done >= skip {
            for &b in &buf[..n] {
                seen[usize::from(b)] = true;
            }
        }
        done += n as u64;
    }
    let us = started.elapsed().as_micros().max(1) as u64;
    let distinct = seen.iter().filter(|&&s| s).count();
    Ok(format!(
        "read bytes {bytes} us {us} rate_bps {} distinct {distinct}",
        u128::from(bytes) * 1_000_000 / u128::from(us)
    ))
}

fn addr(host: &str, port: &str) -> Result<SocketAddr> {
    format!("{host}:{port}")
        .parse()
        .map_err(|e| format!("bad address {host}:{port}: {e}"))
}

fn port_number(s: &str) -> Result<u32> {
    u32::try_from(number(s)?).map_err(|_| format!("bad port {s}"))
}

fn number(s: &str) -> Result<u64> {
    s.parse().map_err(|e| format!("bad number {s}: {e}"))
}

fn send(host: &str, port: &str, bytes: &str, seed: &str) -> Result<String> {
    let (total, seed) = (number(bytes)?, number(seed)?);
    let mut stream = TcpStream::connect(addr(host, port)?).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let sum = write_pattern(&mut stream, total, seed).map_err(|e| e.to_string())?;
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    // Wait for the peer to finish reading, so the time covers the whole transfer.
    let _ = stream.read(&mut [0u8; 1]);
    Ok(format!(
        "sent {total} checksum {sum:016x} in {} ms",
        started.elapsed().as_millis()
    ))
}

fn recv(host: &str, port: &str, skip: &str) -> Result<String> {
    let skip = number(skip)?;
    let mut stream = TcpStream::connect(addr(host, port)?).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let got = receive(&mut stream, skip, CHUNK).map_err(|e| e.to_string())?;
    Ok(format!(
        "received {} checksum {:016x} in {} ms rate_bps {}",
        got.bytes,
        got.checksum,
        started.elapsed().as_millis(),
        got.rate
    ))
}

fn connect_many(ip: &str, port: &str, n: &str) -> Result<String> {
    let target = addr(ip, port)?;
    let n = number(n)?;
    let (mut accepted, mut refused, mut other) = (0, 0, 0);
    let mut open = Vec::new();
    for _ in 0..n {
        match TcpStream::connect_timeout(&target, std::time::Duration::from_secs(5)) {
            Ok(s) => {
                accepted += 1;
                open.push(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused += 1,
            Err(_) => other += 1,
        }
    }
    drop(open);
    Ok(format!(
        "accepted {accepted} refused {refused} failed {other}"
    ))
}

fn http_latency(ip: &str, path: &str, n: &str) -> Result<String> {
    let n = number(n)?.max(1);
    let mut times = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let line = http(ip, "GET", path, &[])?;
        times.push(started.elapsed().as_micros());
        if !line.starts_with("status 200") {
            return Err(format!("GET {path}: {line}"));
        }
    }
    times.sort_unstable();
    Ok(format!(
        "http-latency n {n} median_us {} min_us {} max_us {}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    ))
}

fn http(ip: &str, method: &str, path: &str, headers: &[&str]) -> Result<String> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n");
    for header in headers {
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| format!("bad header {header}"))?;
        match name {
            "pad" => request.push_str(&format!(
                "X-Padding: {}\r\n",
                "a".repeat(number(value)? as usize)
            )),
            _ => request.push_str(&format!("{name}: {value}\r\n")),
        }
    }
    request.push_str("\r\n");
    let mut stream = TcpStream::connect(addr(ip, "80")?).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    // A server that refuses early may close before it has read everything.
    let _ = stream.write_all(request.as_bytes());
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("none");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(format!("status {status} body {}", body.replace('\n', "|")))
}
