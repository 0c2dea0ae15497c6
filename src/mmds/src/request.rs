//! The guest's HTTP/1.x requests to the MMDS, read from a TCP stream as bytes arrive. The
//! guest is untrusted: a request is at most [`MAX_REQUEST`] bytes, headers included, or it is
//! refused.

/// The largest request (request line, headers and body) the MMDS reads.
pub const MAX_REQUEST: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRequest {
    pub method: String,
    /// The path, without a scheme, host or query.
    pub path: String,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    /// Whether the connection ends after the response.
    pub close: bool,
}

impl GuestRequest {
    /// The value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// A request, and how many bytes of the input it took.
    Request(GuestRequest, usize),
    /// Not HTTP the MMDS can read; the connection is answered with 400 and closed.
    Bad(&'static str),
}

/// Reads the first request in `input`.
pub fn parse(input: &[u8]) -> Parsed {
    let Some(head_end) = find(input, b"\r\n\r\n") else {
        return match input.len() > MAX_REQUEST {
            true => Parsed::Bad("the request headers are too long"),
            false => Parsed::Incomplete,
        };
    };
    if head_end + 4 > MAX_REQUEST {
        return Parsed::Bad("the request headers are too long");
    }
    let Ok(head) = std::str::from_utf8(&input[..head_end]) else {
        return Parsed::Bad("the request headers are not text");
    };
    let mut lines = head.split("\r\n");
    let mut start = lines.next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (start.next(), start.next(), start.next(), start.next())
    else {
        return Parsed::Bad("the request line is malformed");
    };
    let keep_alive_default = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Parsed::Bad("the HTTP version is not 1.0 or 1.1"),
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Parsed::Bad("the request method is malformed");
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Parsed::Bad("a header line has no ':'");
        };
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Parsed::Bad("a header name is malformed");
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let request = GuestRequest {
        method: method.to_string(),
        path: path_of(target),
        close: false,
        headers,
    };
    let body_len = match request.header("content-length") {
        None => 0,
        Some(v) => match v.parse::<usize>() {
            Ok(n) => n,
            Err(_) => return Parsed::Bad("Content-Length is not a number"),
        },
    };
    if request.header("transfer-encoding").is_some() {
        return Parsed::Bad("chunked bodies are not supported");
    }
    let total = head_end + 4 + body_len;
    if total > MAX_REQUEST {
        return Parsed::Bad("the request body is too long");
    }
    if input.len() < total {
        return Parsed::Incomplete;
    }
    let close = match request.header("connection") {
        Some(v) if v.eq_ignore_ascii_case("close") => true,
        Some(v) if v.eq_ignore_ascii_case("keep-alive") => false,
        _ => !keep_alive_default,
    };
    Parsed::Request(GuestRequest { close, ..request }, total)
}

/// `http://host/a/b?x` and `/a/b?x` both name `/a/b`.
fn path_of(target: &str) -> String {
    let rest = match target.split_once("://") {
        Some((_, after)) => after.find('/').map_or("/", |i| &after[i..]),
        None => target,
    };
    let path = rest.split(['?', '#']).next().unwrap_or("");
    match path.starts_with('/') {
        true => path.to_string(),
        false => format!("/{path}"),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> GuestRequest {
        match parse(text.as_bytes()) {
            Parsed::Request(r, n) => {
                assert_eq!(n, text.len());
                r
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_and_their_headers() {
        let r = request("GET /latest/meta-data?x=1 HTTP/1.1\r\nHost: 169.254.169.254\r\nAccept: application/json\r\n\r\n");
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/latest/meta-data");
        assert_eq!(r.header("ACCEPT"), Some("application/json"));
        assert!(!r.close);
        let r = request("GET http://169.254.169.254/a HTTP/1.0\r\n\r\n");
        assert_eq!(r.path, "/a");
        assert!(r.close);
        let r = request(
            "PUT /latest/api/token HTTP/1.1\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert!(r.close);
    }

    #[test]
    fn partial_and_hostile_input() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost"), Parsed::Incomplete);
        assert_eq!(
            parse(b"PUT / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"),
            Parsed::Incomplete
        );
        assert!(matches!(parse(b"GET /\r\n\r\n"), Parsed::Bad(_)));
        assert!(matches!(parse(b"get / HTTP/1.1\r\n\r\n"), Parsed::Bad(_)));
        assert!(matches!(parse(b"GET / HTTP/2\r\n\r\n"), Parsed::Bad(_)));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
            Parsed::Bad(_)
        ));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nContent-Length: 99999\r\n\r\n"),
            Parsed::Bad(_)
        ));
        let huge = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_REQUEST));
        assert!(matches!(parse(huge.as_bytes()), Parsed::Bad(_)));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nnocolon\r\n\r\n"),
            Parsed::Bad(_)
        ));
        assert!(matches!(
            parse(&[0xff, b'\r', b'\n', b'\r', b'\n']),
            Parsed::Bad(_)
        ));
    }
}
