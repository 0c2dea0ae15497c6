//! Counters that many threads bump and one thread reports. As in Firecracker's metrics, each
//! report says what happened since the previous one, so a reader sums lines for totals.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Counter {
    total: AtomicU64,
    reported: AtomicU64,
}

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    /// Everything counted so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// What was counted since the last `take`.
    pub fn take(&self) -> u64 {
        let total = self.total.load(Ordering::Relaxed);
        total.wrapping_sub(self.reported.swap(total, Ordering::Relaxed))
    }
}

/// The largest value seen since the last report.
#[derive(Debug, Default)]
pub struct MaxGauge(AtomicU64);

impl MaxGauge {
    pub fn observe(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }

    pub fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_take_reports_what_came_since_the_last() {
        let c = Counter::default();
        c.add(5);
        c.inc();
        assert_eq!(c.take(), 6);
        assert_eq!(c.take(), 0);
        c.add(2);
        assert_eq!(c.take(), 2);
        assert_eq!(c.total(), 8);

        let g = MaxGauge::default();
        g.observe(3);
        g.observe(9);
        g.observe(4);
        assert_eq!(g.take(), 9);
        assert_eq!(g.take(), 0);
    }
}
