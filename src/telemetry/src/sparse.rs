//! Log lines that a guest can cause, as often as it likes, must not fill the host's disk:
//! [`Sparse`] lets the first through and then at most one per interval, and says how many
//! were held back in between.

use std::time::{Duration, Instant};

/// At most one line per interval for one kind of event.
#[derive(Debug)]
pub struct Sparse {
    interval: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Sparse {
    /// One line per minute.
    pub fn per_minute() -> Self {
        Sparse::new(Duration::from_secs(60))
    }

    pub fn new(interval: Duration) -> Self {
        Sparse {
            interval,
            last: None,
            held: 0,
        }
    }

    /// Called once per event: `Some(n)` if this one may be logged, `n` being how many were
    /// held back since the last line; `None` if it is held back.
    pub fn admit(&mut self) -> Option<u64> {
        match self.last {
            Some(at) if at.elapsed() < self.interval => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(Instant::now());
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_passes_then_one_per_interval_with_the_count_held() {
        let mut s = Sparse::new(Duration::from_millis(50));
        assert_eq!(s.admit(), Some(0));
        for _ in 0..100 {
            assert_eq!(s.admit(), None);
        }
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.admit(), Some(100));
        assert_eq!(s.admit(), None);
    }
}
