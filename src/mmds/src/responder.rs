//! What the MMDS answers to one guest request, with Firecracker's rules: GET reads the store
//! (V2 wants a session token), `PUT /latest/api/token` issues a token, other methods get 405.

use std::time::Instant;

use crate::request::GuestRequest;
use crate::store::{DataStore, Format, StoreError, Version};

const TOKEN_PATH: &str = "/latest/api/token";
const TOKEN_HEADERS: [&str; 2] = ["X-metadata-token", "X-aws-ec2-metadata-token"];
const TTL_HEADERS: [&str; 2] = [
    "X-metadata-token-ttl-seconds",
    "X-aws-ec2-metadata-token-ttl-seconds",
];

/// One HTTP response, ready to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    pub allow: Option<&'static str>,
}

impl Answer {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Answer {
            status,
            content_type: "text/plain",
            body: body.into(),
            allow: None,
        }
    }

    /// The response's bytes; `close` adds `Connection: close`.
    pub fn to_bytes(&self, close: bool) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nServer: Ember MMDS\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(allow) = self.allow {
            head.push_str(&format!("Allow: {allow}\r\n"));
        }
        if close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(self.body.as_bytes());
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        501 => "Not Implemented",
        _ => "Internal Server Error",
    }
}

fn header<'a>(req: &'a GuestRequest, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| req.header(n))
}

/// Answers `req` from `store` at time `now`.
pub fn answer(store: &mut DataStore, req: &GuestRequest, now: Instant) -> Answer {
    match req.method.as_str() {
        "GET" => get(store, req, now),
        "PUT" => put(store, req, now),
        _ => Answer {
            allow: Some("GET, PUT"),
            ..Answer::text(405, "Not allowed HTTP method.")
        },
    }
}

fn get(store: &DataStore, req: &GuestRequest, now: Instant) -> Answer {
    if store.version() == Version::V2 {
        match header(req, &TOKEN_HEADERS) {
            None => {
                return Answer::text(
                    401,
                    "No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` header to specify the session token.",
                )
            }
            Some(token) if !store.token_is_valid(token, now) => {
                return Answer::text(401, "MMDS token not valid.")
            }
            Some(_) => {}
        }
    }
    let wants_json = req
        .header("Accept")
        .is_some_and(|a| a.contains("application/json"));
    let format = match wants_json && !store.imds_compat() {
        true => Format::Json,
        false => Format::Imds,
    };
    match store.get(&req.path, format) {
        Ok(body) => Answer {
            content_type: match format {
                Format::Json => "application/json",
                Format::Imds => "text/plain",
            },
            ..Answer::text(200, body)
        },
        Err(StoreError::UnsupportedType) => {
            Answer::text(501, StoreError::UnsupportedType.to_string())
        }
        Err(_) => Answer::text(404, format!("Resource not found: {}.", req.path)),
    }
}

fn put(store: &mut DataStore, req: &GuestRequest, now: Instant) -> Answer {
    if req.path != TOKEN_PATH {
        return Answer::text(404, format!("Resource not found: {}.", req.path));
    }
    if req.header("X-Forwarded-For").is_some() {
        return Answer::text(
            400,
            "Invalid header. Reason: Unsupported header name. Key: X-Forwarded-For",
        );
    }
    let Some(ttl) = header(req, &TTL_HEADERS) else {
        return Answer::text(
            400,
            "Token time to live value not found. Use `X-metadata-token-ttl-seconds` or `X-aws-ec2-metadata-token-ttl-seconds` header to specify the token's lifetime.",
        );
    };
    let Ok(ttl) = ttl.parse::<u32>() else {
        return Answer::text(
            400,
            format!("Invalid time to live value provided for token: {ttl}. Please provide a value between 1 and 21600."),
        );
    };
    match store.issue_token(ttl, now) {
        Ok(token) => Answer::text(200, token),
        Err(e @ StoreError::Token(crate::token::TokenError::Ttl(_))) => {
            Answer::text(400, e.to_string())
        }
        Err(e) => Answer::text(500, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::request::{parse, Parsed};

    fn req(text: &str) -> GuestRequest {
        match parse(text.as_bytes()) {
            Parsed::Request(r, _) => r,
            other => panic!("{other:?}"),
        }
    }

    fn store(version: Version) -> DataStore {
        let mut s = DataStore::default();
        s.configure(version, false);
        s.put(json!({"latest": {"meta-data": {"id": "i-1"}}, "n": 1}))
            .unwrap();
        s
    }

    #[test]
    fn v1_needs_no_token() {
        let mut s = store(Version::V1);
        let now = Instant::now();
        let a = answer(
            &mut s,
            &req("GET /latest/meta-data/id HTTP/1.1\r\n\r\n"),
            now,
        );
        assert_eq!((a.status, a.body.as_str()), (200, "i-1"));
        let a = answer(
            &mut s,
            &req(
                "GET /latest HTTP/1.1\r\nAccept: application/json\r\nX-metadata-token: bad\r\n\r\n",
            ),
            now,
        );
        assert_eq!(a.status, 200);
        assert_eq!(a.content_type, "application/json");
        assert_eq!(a.body, r#"{"meta-data":{"id":"i-1"}}"#);
        assert_eq!(
            answer(&mut s, &req("GET /n HTTP/1.1\r\n\r\n"), now).status,
            501
        );
        assert_eq!(
            answer(&mut s, &req("GET /x HTTP/1.1\r\n\r\n"), now).status,
            404
        );
        let a = answer(&mut s, &req("POST / HTTP/1.1\r\n\r\n"), now);
        assert_eq!((a.status, a.allow), (405, Some("GET, PUT")));
        assert!(String::from_utf8(a.to_bytes(true))
            .unwrap()
            .contains("Allow: GET, PUT\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn v2_wants_a_live_token() {
        let mut s = store(Version::V2);
        let now = Instant::now();
        let get = |token: &str| {
            format!("GET /latest/meta-data/id HTTP/1.1\r\nX-metadata-token: {token}\r\n\r\n")
        };
        assert_eq!(
            answer(&mut s, &req("GET / HTTP/1.1\r\n\r\n"), now).status,
            401
        );
        assert_eq!(answer(&mut s, &req(&get("nope")), now).status, 401);
        let t = answer(
            &mut s,
            &req("PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n"),
            now,
        );
        assert_eq!(t.status, 200);
        assert_eq!(answer(&mut s, &req(&get(&t.body)), now).body, "i-1");
        let later = now + Duration::from_secs(5);
        assert_eq!(answer(&mut s, &req(&get(&t.body)), later).status, 401);
        for bad in [
            "PUT /latest/api/token HTTP/1.1\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: x\r\n\r\n",
            "PUT /latest/api/token HTTP/1.1\r\nX-Forwarded-For: a\r\nX-metadata-token-ttl-seconds: 5\r\n\r\n",
        ] {
            assert_eq!(answer(&mut s, &req(bad), now).status, 400, "{bad}");
        }
        assert_eq!(
            answer(&mut s, &req("PUT /x HTTP/1.1\r\n\r\n"), now).status,
            404
        );
    }

    #[test]
    fn imds_compat_ignores_accept() {
        let mut s = store(Version::V1);
        s.configure(Version::V1, true);
        let a = answer(
            &mut s,
            &req("GET /latest HTTP/1.1\r\nAccept: application/json\r\n\r\n"),
            Instant::now(),
        );
        assert_eq!(
            (a.body.as_str(), a.content_type),
            ("meta-data/", "text/plain")
        );
    }
}
