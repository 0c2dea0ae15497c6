//! The host side of Ember's vsock (Firecracker's protocol): `CONNECT <port>\n` on the
//! device's Unix socket, `OK <host_port>\n` back, then a stream to the guest agent
//! (`ember-agent serve`, src/guest-agent/src/vsock.rs).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// One line, read a byte at a time so that nothing after it is consumed; "" at the end.
pub fn read_line(s: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while let Ok(1) = s.read(&mut b) {
        line.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// Connects to guest `port`; the stream once ember answered `OK`, or what it answered.
pub fn connect(uds: &Path, port: u32) -> Result<UnixStream, String> {
    let mut s = UnixStream::connect(uds).map_err(|e| e.to_string())?;
    s.write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let line = read_line(&mut s);
    match line.starts_with("OK ") {
        true => Ok(s),
        false => Err(line),
    }
}

/// Connects to guest `port`, retrying until the agent listens or `deadline` passes.
pub fn connect_when_up(uds: &Path, port: u32, deadline: Duration) -> UnixStream {
    let started = Instant::now();
    loop {
        match connect(uds, port) {
            Ok(s) => return s,
            Err(e) => assert!(
                started.elapsed() < deadline,
                "the guest agent never answered on port {port}: {e:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends one agent request and reads its one-line answer.
pub fn request(uds: &Path, port: u32, line: &str) -> String {
    let mut s = connect(uds, port).expect("connect to the agent");
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    read_line(&mut s).trim_end().to_string()
}
