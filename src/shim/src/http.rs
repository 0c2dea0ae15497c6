//! A minimal HTTP/1.1 client for Ember's API socket: one request per connection, JSON in,
//! status and body out.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Ember answers in milliseconds; this only bounds a VMM that stopped answering.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Ember's answers are small; an endless one is not read.
const MAX_BODY: u64 = 1 << 20;

/// Sends `method path` with `body` (JSON) and returns the status and body of the answer.
pub fn request(
    sock: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("the API answered without an HTTP status line"))?;
    let mut length = 0u64;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| bad("bad Content-Length"))?;
            }
        }
    }
    let mut text = String::new();
    reader
        .take(length.min(MAX_BODY))
        .read_to_string(&mut text)?;
    Ok((status, text))
}
