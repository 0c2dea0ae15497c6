//! MMDS V2 session tokens. A token is 32 random bytes (hex), good until its time to live runs
//! out. Firecracker seals the expiry into an encrypted token; Ember keeps a bounded table of
//! the tokens it issued instead, which needs no cipher and refuses a guessed token as surely.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Firecracker's bounds on `X-metadata-token-ttl-seconds`.
pub const MIN_TTL_SECONDS: u32 = 1;
pub const MAX_TTL_SECONDS: u32 = 21_600;
/// At most this many live tokens; issuing one more forgets the one that expires first.
pub const MAX_TOKENS: usize = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("Invalid time to live value provided for token: {0}. Please provide a value between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}.")]
    Ttl(u32),
    #[error("cannot get random bytes for a token: {0}")]
    Random(String),
}

#[derive(Debug, Default)]
pub struct TokenTable {
    expiry: HashMap<String, Instant>,
}

impl TokenTable {
    /// Issues a token that is valid for `ttl_seconds` from `now`.
    pub fn issue(&mut self, ttl_seconds: u32, now: Instant) -> Result<String, TokenError> {
        if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl_seconds) {
            return Err(TokenError::Ttl(ttl_seconds));
        }
        self.expiry.retain(|_, t| *t > now);
        if self.expiry.len() >= MAX_TOKENS {
            if let Some(first) = self
                .expiry
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone())
            {
                self.expiry.remove(&first);
            }
        }
        let token = random_hex(32)?;
        self.expiry.insert(
            token.clone(),
            now + Duration::from_secs(u64::from(ttl_seconds)),
        );
        Ok(token)
    }

    /// Whether `token` was issued here and has not expired at `now`.
    pub fn is_valid(&self, token: &str, now: Instant) -> bool {
        self.expiry.get(token).is_some_and(|t| *t > now)
    }
}

fn random_hex(bytes: usize) -> Result<String, TokenError> {
    let mut buf = vec![0u8; bytes];
    random_bytes(&mut buf).map_err(|e| TokenError::Random(e.to_string()))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Fills `buf` from the kernel's random source (getrandom(2)).
pub fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`, which we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_expire_and_unknown_ones_are_refused() {
        let mut table = TokenTable::default();
        let now = Instant::now();
        let token = table.issue(2, now).unwrap();
        assert_eq!(token.len(), 64);
        assert!(table.is_valid(&token, now + Duration::from_secs(1)));
        assert!(!table.is_valid(&token, now + Duration::from_secs(2)));
        assert!(!table.is_valid("0000", now));
        assert_eq!(table.issue(0, now), Err(TokenError::Ttl(0)));
        assert_eq!(table.issue(21_601, now), Err(TokenError::Ttl(21_601)));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut table = TokenTable::default();
        let now = Instant::now();
        let first = table.issue(10, now).unwrap();
        for _ in 0..MAX_TOKENS + 10 {
            table.issue(100, now).unwrap();
        }
        assert_eq!(table.expiry.len(), MAX_TOKENS);
        assert!(!table.is_valid(&first, now));
    }
}
