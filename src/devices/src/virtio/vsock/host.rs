//! The host side of vsock: Unix sockets. `CONNECT <port>\n` from a host process names the
//! guest port it wants; guest-initiated connections go to `<uds_path>_<port>`.

/// The longest `CONNECT` line taken: "CONNECT 4294967295\n" is 19 bytes.
pub const MAX_CONNECT_LINE: usize = 32;

/// The guest port a complete `CONNECT <port>\n` line names; `None` for anything else.
pub fn parse_connect(line: &[u8]) -> Option<u32> {
    let digits = line.strip_prefix(b"CONNECT ")?.strip_suffix(b"\n")?;
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_connect_line_names_a_port() {
        assert_eq!(parse_connect(b"CONNECT 52\n"), Some(52));
        assert_eq!(parse_connect(b"CONNECT 4294967295\n"), Some(u32::MAX));
        for bad in [
            &b"CONNECT 4294967296\n"[..],
            b"CONNECT 52",
            b"CONNECT \n",
            b"CONNECT -1\n",
            b"CONNECT 5 2\n",
            b"connect 52\n",
            b"CONNECT  52\n",
            b"CONNECT 52\r\n",
            b"CONNECT 00000000052\n",
            b"HELLO\n",
        ] {
            assert_eq!(
                parse_connect(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
