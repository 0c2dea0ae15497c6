//! HTTP/1.1 for the API socket: what Firecracker's clients send (a request line, headers,
//! a Content-Length body; persistent connections, pipelined requests) and nothing more.
//! Bytes from the socket are untrusted: the header block and the body have limits, every
//! malformed request gives a precise error, and nothing here panics or grows without bound.

/// The header block (request line and headers) may not be longer than this.
pub const MAX_HEADER_BLOCK: usize = 8 * 1024;
/// Firecracker's default for `--http-api-max-payload-size`.
pub const DEFAULT_MAX_PAYLOAD: usize = 51_200;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, without a query string.
    pub path: String,
    pub body: Vec<u8>,
    /// Whether the client keeps the connection open after the response.
    pub keep_alive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("the request line is not `METHOD PATH HTTP/1.x`")]
    RequestLine,
    #[error("HTTP version {0} is not supported; use HTTP/1.1")]
    Version(String),
    #[error("header line {0} is not `Name: value`")]
    Header(usize),
    #[error("the request headers are over the limit of {MAX_HEADER_BLOCK} bytes")]
    HeadersTooLarge,
    #[error("the Content-Length header is not a number (digits only)")]
    ContentLength,
    #[error("the request has more than one Content-Length header")]
    DuplicateContentLength,
    #[error("the request payload of {size} bytes is over the limit of {limit} bytes")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("Transfer-Encoding is not supported; send a Content-Length")]
    TransferEncoding,
    #[error("the request head is not valid UTF-8")]
    Utf8,
}

impl ParseError {
    /// The status code of the response that reports this error.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::PayloadTooLarge { .. } => 413,
            ParseError::HeadersTooLarge => 431,
            ParseError::Version(_) => 505,
            ParseError::TransferEncoding => 501,
            _ => 400,
        }
    }
}

/// Collects bytes from one connection and cuts them into requests.
#[derive(Debug)]
pub struct RequestParser {
    buf: Vec<u8>,
    max_payload: usize,
    /// How much of `buf` is known to hold no end of headers, so that a client sending one
    /// byte at a time costs linear time, not quadratic.
    scanned: usize,
    /// The request waiting for its body asked for `100 Continue`, not yet sent.
    continue_due: bool,
    /// `100 Continue` was already sent for the request waiting for its body.
    continue_sent: bool,
}

impl RequestParser {
    pub fn new(max_payload: usize) -> Self {
        RequestParser {
            buf: Vec::new(),
            max_payload,
            scanned: 0,
            continue_due: false,
            continue_sent: false,
        }
    }

    /// True once per request whose client sent `Expect: 100-continue` and waits for the
    /// interim `100 Continue` before it sends the body (curl does, for larger bodies).
    pub fn take_continue(&mut self) -> bool {
        std::mem::take(&mut self.continue_due)
    }

    /// Appends bytes read from the socket.
    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole request, None if more bytes are needed, or the error that ends the
    /// connection. The buffer never holds more than one header block and one body (plus
    /// what the last read brought), since anything larger is an error.
    pub fn next_request(&mut self) -> Result<Option<Request>, ParseError> {
        let from = self.scanned.saturating_sub(3);
        let Some(head_end) = find(&self.buf[from..], b"\r\n\r\n").map(|i| i + from) else {
            if self.buf.len() > MAX_HEADER_BLOCK {
                return Err(ParseError::HeadersTooLarge);
            }
            self.scanned = self.buf.len();
            return Ok(None);
        };
        if head_end > MAX_HEADER_BLOCK {
            return Err(ParseError::HeadersTooLarge);
        }
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|_| ParseError::Utf8)?;
        let head = parse_head(head)?;
        if head.content_length > self.max_payload {
            return Err(ParseError::PayloadTooLarge {
                size: head.content_length,
                limit: self.max_payload,
            });
        }
        let body_start = head_end + 4;
        let total = body_start + head.content_length;
        if self.buf.len() < total {
            if head.expect_continue && !self.continue_sent {
                self.continue_sent = true;
                self.continue_due = true;
            }
            return Ok(None);
        }
        let body = self.buf[body_start..total].to_vec();
        self.buf.drain(..total);
        self.scanned = 0;
        self.continue_sent = false;
        self.continue_due = false;
        Ok(Some(Request {
            method: head.method,
            path: head.path,
            body,
            keep_alive: head.keep_alive,
        }))
    }
}

struct Head {
    method: String,
    path: String,
    content_length: usize,
    keep_alive: bool,
    expect_continue: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn parse_head(head: &str) -> Result<Head, ParseError> {
    let mut lines = head.split("\r\n");
    let request_line = lines.next().ok_or(ParseError::RequestLine)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::RequestLine);
    };
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic());
    if !token(method) || !target.starts_with('/') {
        return Err(ParseError::RequestLine);
    }
    let mut keep_alive = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        v if v.starts_with("HTTP/") => return Err(ParseError::Version(v.to_string())),
        _ => return Err(ParseError::RequestLine),
    };
    let path = target.split('?').next().unwrap_or(target).to_string();
    let mut content_length = None;
    let mut expect_continue = false;
    for (i, line) in lines.enumerate() {
        let (name, value) = line.split_once(':').ok_or(ParseError::Header(i + 1))?;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(ParseError::Header(i + 1));
        }
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            // Digits only: `+36` or ` 36, 36` would parse somewhere and frame differently
            // elsewhere, and two lengths leave the body's end ambiguous (request smuggling).
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ParseError::ContentLength);
            }
            if content_length.is_some() {
                return Err(ParseError::DuplicateContentLength);
            }
            content_length = Some(value.parse().map_err(|_| ParseError::ContentLength)?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ParseError::TransferEncoding);
        } else if name.eq_ignore_ascii_case("expect") {
            expect_continue = value.eq_ignore_ascii_case("100-continue");
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                keep_alive = false;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                keep_alive = true;
            }
        }
    }
    Ok(Head {
        method: method.to_string(),
        path,
        content_length: content_length.unwrap_or(0),
        keep_alive,
        expect_continue,
    })
}

/// A response: a status and, for 200 and errors, a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Option<String>,
    /// Headers besides Server, Content-Type and Content-Length (Allow, Connection).
    pub headers: Vec<(&'static str, String)>,
}

impl Response {
    pub fn no_content() -> Self {
        Response {
            status: 204,
            body: None,
            headers: Vec::new(),
        }
    }

    pub fn json(status: u16, body: String) -> Self {
        Response {
            status,
            body: Some(body),
            headers: Vec::new(),
        }
    }

    /// An error in Firecracker's format: `{"fault_message": "..."}`.
    pub fn fault(status: u16, message: &str) -> Self {
        Response::json(
            status,
            serde_json::json!({ "fault_message": message }).to_string(),
        )
    }

    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The bytes to write to the socket.
    #[cfg(test)]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out);
        out
    }

    /// Appends the bytes to write to the socket to `out`, which a connection reuses from
    /// one response to the next: musl's allocator maps and unmaps a page when a response
    /// buffer is freed and made again, two system calls per request and a TLB flush.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let body = self.body.as_deref();
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 4)
            .sum();
        out.reserve(96 + headers + body.map_or(0, str::len));
        // Writing to a Vec cannot fail.
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\nServer: Ember API\r\n",
            self.status,
            reason(self.status)
        );
        for (name, value) in &self.headers {
            let _ = write!(out, "{name}: {value}\r\n");
        }
        match body {
            Some(body) => {
                let _ = write!(
                    out,
                    "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
            None => out.extend_from_slice(b"\r\n"),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> RequestParser {
        RequestParser::new(DEFAULT_MAX_PAYLOAD)
    }

    #[test]
    fn a_put_with_a_body() {
        let mut p = parser();
        p.feed(b"PUT /machine-config HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"vcpu_count\":2}");
        let r = p.next_request().unwrap().unwrap();
        assert_eq!(r.method, "PUT");
        assert_eq!(r.path, "/machine-config");
        assert_eq!(r.body, b"{\"vcpu_count\":2".to_vec());
        assert!(r.keep_alive);
        // The 16th byte is the start of the next request, which is incomplete.
        assert_eq!(p.next_request(), Ok(None));
    }

    #[test]
    fn pipelined_requests_and_one_byte_writes() {
        let stream =
            b"GET / HTTP/1.1\r\n\r\nGET /version?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n";
        let mut p = parser();
        let mut got = Vec::new();
        for b in stream {
            p.feed(&[*b]);
            while let Some(r) = p.next_request().unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].path, "/");
        assert_eq!(got[1].path, "/version");
        assert!(!got[1].keep_alive);
    }

    #[test]
    fn expect_100_continue_is_due_once_while_the_body_is_missing() {
        let mut p = parser();
        p.feed(b"PUT /boot-source HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
        assert_eq!(p.next_request(), Ok(None));
        assert!(p.take_continue());
        assert_eq!(p.next_request(), Ok(None));
        assert!(!p.take_continue(), "only once");
        p.feed(b"{}");
        assert_eq!(p.next_request().unwrap().unwrap().body, b"{}");
        assert!(!p.take_continue());
    }

    #[test]
    fn http_1_0_closes_unless_asked() {
        let mut p = parser();
        p.feed(b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(!p.next_request().unwrap().unwrap().keep_alive);
        assert!(p.next_request().unwrap().unwrap().keep_alive);
    }

    #[test]
    fn limits() {
        let mut p = parser();
        p.feed(&vec![b'a'; MAX_HEADER_BLOCK + 1]);
        assert_eq!(p.next_request(), Err(ParseError::HeadersTooLarge));
        let mut p = parser();
        p.feed(b"PUT /drives/x HTTP/1.1\r\nContent-Length: 51201\r\n\r\n");
        let e = p.next_request().unwrap_err();
        assert_eq!(
            e,
            ParseError::PayloadTooLarge {
                size: 51201,
                limit: 51200
            }
        );
        assert_eq!(e.status(), 413);
        let mut p = parser();
        p.feed(b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n");
        assert_eq!(p.next_request(), Err(ParseError::ContentLength));
    }

    #[test]
    fn malformed_heads() {
        for (bytes, err) in [
            (&b"GET\r\n\r\n"[..], ParseError::RequestLine),
            (b"GET / HTTP/1.1 extra\r\n\r\n", ParseError::RequestLine),
            (b"G3T / HTTP/1.1\r\n\r\n", ParseError::RequestLine),
            (b"GET nopath HTTP/1.1\r\n\r\n", ParseError::RequestLine),
            (
                b"GET / HTTP/2.0\r\n\r\n",
                ParseError::Version("HTTP/2.0".into()),
            ),
            (b"GET / FTP\r\n\r\n", ParseError::RequestLine),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: +36\r\n\r\n",
                ParseError::ContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: -0\r\n\r\n",
                ParseError::ContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 3\r\n\r\n",
                ParseError::DuplicateContentLength,
            ),
            (
                b"PUT / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
                ParseError::DuplicateContentLength,
            ),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", ParseError::Header(1)),
            (
                b"GET / HTTP/1.1\r\nA: b\r\nBad Name: x\r\n\r\n",
                ParseError::Header(2),
            ),
            (
                b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                ParseError::TransferEncoding,
            ),
            (b"GET /\xff HTTP/1.1\r\n\r\n", ParseError::Utf8),
        ] {
            let mut p = parser();
            p.feed(bytes);
            assert_eq!(
                p.next_request(),
                Err(err),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn responses() {
        assert_eq!(
            Response::no_content().to_bytes(),
            b"HTTP/1.1 204 No Content\r\nServer: Ember API\r\n\r\n".to_vec()
        );
        let r = Response::json(400, r#"{"fault_message":"x"}"#.into()).to_bytes();
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(text.ends_with("Content-Length: 21\r\n\r\n{\"fault_message\":\"x\"}"));
    }
}
