//! The API socket's HTTP parser: arbitrary bytes, fed in arbitrary pieces.
#![no_main]
use api::http::RequestParser;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parser = RequestParser::new(4096);
    // The first byte cuts the rest into reads of that size, as a slow client would send them.
    let (step, rest) = match data.split_first() {
        Some((s, rest)) => (usize::from(*s).max(1), rest),
        None => return,
    };
    for piece in rest.chunks(step) {
        parser.feed(piece);
        loop {
            match parser.next_request() {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => return,
            }
        }
        let _ = parser.take_continue();
    }
});
