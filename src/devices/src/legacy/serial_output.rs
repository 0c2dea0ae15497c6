//! Where the guest's console bytes go: ember's stdout, or the file `PUT /serial` names. The
//! guest decides how much it writes, so a destination that fails (closed, a broken or full
//! pipe) must not turn each byte into a log line: bytes that cannot be written are dropped and
//! counted (`uart.missed_write_count`), and the failure is logged once, then at most once a
//! minute with the count since. With a rate limiter, bytes over its rate are dropped and
//! counted too (`uart.rate_limiter_dropped_bytes`), as Firecracker does.

use std::io::{self, Write};
use std::sync::Arc;

use telemetry::metrics::UartMetrics;
use telemetry::Sparse;

use crate::rate_limiter::{TokenBucket, TokenBucketConfig};

pub struct SerialOutput<W> {
    out: W,
    metrics: Arc<UartMetrics>,
    log: Sparse,
    /// Bytes dropped since the last line about it.
    unlogged: u64,
    /// Bytes per second the guest may write, and the clock the bucket counts on.
    limit: Option<(TokenBucket, std::time::Instant)>,
}

impl<W> std::fmt::Debug for SerialOutput<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialOutput")
            .field("unlogged", &self.unlogged)
            .finish()
    }
}

impl<W: Write> SerialOutput<W> {
    pub fn new(out: W, metrics: Arc<UartMetrics>) -> Self {
        SerialOutput {
            out,
            metrics,
            log: Sparse::per_minute(),
            unlogged: 0,
            limit: None,
        }
    }

    /// Bounds the bytes written by `bucket` (None: no bound).
    pub fn with_limit(mut self, bucket: Option<TokenBucketConfig>) -> Self {
        let epoch = std::time::Instant::now();
        self.limit = bucket
            .and_then(|b| TokenBucket::new(b, 0))
            .map(|b| (b, epoch));
        self
    }

    /// False if the limiter has no room for `bytes` now.
    fn admitted(&mut self, bytes: usize) -> bool {
        let Some((bucket, epoch)) = &mut self.limit else {
            return true;
        };
        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        bucket.reduce(bytes as u64, now)
    }

    fn dropped(&mut self, bytes: usize, e: &io::Error) {
        self.metrics.missed_write_count.add(bytes as u64);
        self.unlogged += bytes as u64;
        match self.log.admit() {
            Some(0) if self.unlogged == bytes as u64 => log::warn!(
                "cannot write the guest's console output: {e}; what cannot be written is \
                 dropped, counted in the metrics (uart.missed_write_count) and logged at most \
                 once a minute"
            ),
            Some(_) => log::warn!(
                "dropped {} bytes of the guest's console output since the last line: {e}",
                self.unlogged
            ),
            None => return,
        }
        self.unlogged = 0;
    }
}

impl<W: Write> Write for SerialOutput<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.admitted(buf.len()) {
            self.metrics
                .rate_limiter_dropped_bytes
                .add(buf.len() as u64);
            return Ok(buf.len());
        }
        match self.out.write(buf) {
            Ok(n) => {
                self.metrics.write_count.add(n as u64);
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                self.dropped(buf.len(), &e);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Err(e) = self.out.flush() {
            self.dropped(0, &e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdout whose reader is gone.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn failed_output_is_counted_and_logged_once_not_per_byte() {
        let metrics = Arc::new(UartMetrics::default());
        let mut out = SerialOutput::new(Closed, metrics.clone());
        for _ in 0..1000 {
            assert_eq!(out.write(b".").unwrap(), 1);
        }
        assert_eq!(metrics.missed_write_count.total(), 1000);
        // One line was logged: the first failure; the rest wait for the next minute.
        assert_eq!(out.unlogged, 999);
    }

    #[test]
    fn written_bytes_are_counted() {
        let metrics = Arc::new(UartMetrics::default());
        let mut out = SerialOutput::new(Vec::new(), metrics.clone());
        out.write_all(b"hello").unwrap();
        assert_eq!(metrics.write_count.total(), 5);
        assert_eq!(out.out, b"hello");
    }
}
