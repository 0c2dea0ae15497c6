//! Rate limiting for a device queue: a bandwidth bucket (bytes) and an ops bucket
//! (requests), either optional, and a timerfd that wakes the device's event loop when a
//! throttled request can go. A device asks [`RateLimiter::consume`] before serving a request;
//! on `false` it leaves the request where it is (in the guest's ring, or the frame it holds)
//! and serves it when the timer fires, so nothing is lost, nothing is served twice, and
//! nothing spins while it waits.

mod bucket;

use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

pub use bucket::{TokenBucket, TokenBucketConfig};
use vmm_sys_util::timerfd::TimerFd;

/// A change to one bucket of a running limiter (`PATCH` after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketUpdate {
    /// Leave the bucket as it is.
    Keep,
    /// Remove the bucket: no limit of that kind.
    Disable,
    /// A new, full bucket.
    Set(TokenBucketConfig),
}

/// The limits of one device queue: Firecracker's `RateLimiter` body, a `bandwidth` bucket
/// (bytes) and an `ops` bucket (requests). A bucket left out, or one of size 0, limits
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    pub bandwidth: Option<TokenBucketConfig>,
    pub ops: Option<TokenBucketConfig>,
}

/// A bucket with tokens that would refill infinitely fast: Firecracker silently drops that
/// limit, Ember refuses it, since it cannot be what the caller meant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {what} bucket has size {size} but refill_time 0: refill_time is the milliseconds it takes to refill the bucket and must be at least 1 (a bucket of size 0 sets no limit)")]
pub struct RefillTimeError {
    pub what: &'static str,
    pub size: u64,
}

impl RateLimiterConfig {
    pub fn validate(&self) -> Result<(), RefillTimeError> {
        for (what, bucket) in [("bandwidth", &self.bandwidth), ("ops", &self.ops)] {
            if let Some(b) = bucket {
                b.validate(what)?;
            }
        }
        Ok(())
    }

    /// What a `PATCH` does to a running limiter: a bucket left out stays as it is, a bucket
    /// that limits nothing is removed, any other replaces the old one.
    pub fn updates(&self) -> (BucketUpdate, BucketUpdate) {
        let update = |bucket: Option<TokenBucketConfig>| match bucket {
            None => BucketUpdate::Keep,
            Some(b) if !b.limits() => BucketUpdate::Disable,
            Some(b) => BucketUpdate::Set(b),
        };
        (update(self.bandwidth), update(self.ops))
    }

    /// The limiter `current` after `patch`, as `GET /vm/config` shows it (None: no limit).
    pub fn patched(current: Option<Self>, patch: &Self) -> Option<Self> {
        let keep = |new: Option<TokenBucketConfig>, old| match new {
            None => old,
            Some(b) if !b.limits() => None,
            Some(b) => Some(b),
        };
        let old = current.unwrap_or_default();
        let merged = RateLimiterConfig {
            bandwidth: keep(patch.bandwidth, old.bandwidth),
            ops: keep(patch.ops, old.ops),
        };
        (merged != RateLimiterConfig::default()).then_some(merged)
    }
}

#[derive(Debug)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
    timer: TimerFd,
    blocked: bool,
    epoch: Instant,
}

/// The shortest timer: a zero timeout would disarm a timerfd instead of firing it.
const MIN_WAIT: Duration = Duration::from_micros(100);

impl RateLimiter {
    pub fn new(spec: RateLimiterConfig) -> std::io::Result<Self> {
        let timer = TimerFd::new().map_err(std::io::Error::from)?;
        let epoch = Instant::now();
        Ok(RateLimiter {
            bandwidth: spec.bandwidth.and_then(|b| TokenBucket::new(b, 0)),
            ops: spec.ops.and_then(|b| TokenBucket::new(b, 0)),
            timer,
            blocked: false,
            epoch,
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether any bucket is set.
    pub fn is_limiting(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }

    /// Whether a request is waiting for the timer.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Takes `bytes` from the bandwidth bucket and `ops` from the ops bucket, both or
    /// neither. On `false` the timer is set for when both can give, and every later call
    /// fails until [`RateLimiter::on_timer`].
    pub fn consume(&mut self, bytes: u64, ops: u64) -> bool {
        if self.blocked {
            return false;
        }
        if !self.is_limiting() {
            return true;
        }
        let now = self.now();
        let mut wait = 0;
        for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, ops)] {
            if let Some(b) = bucket {
                // A probe on a copy, so that a bucket that could give does not give alone.
                let mut probe = b.clone();
                if !probe.reduce(tokens, now) {
                    wait = wait.max(probe.wait_ns(tokens, now));
                }
            }
        }
        if wait == 0 {
            for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, ops)] {
                if let Some(b) = bucket {
                    let taken = b.reduce(tokens, now);
                    debug_assert!(taken);
                }
            }
            return true;
        }
        self.block(Duration::from_nanos(wait));
        false
    }

    fn block(&mut self, wait: Duration) {
        self.blocked = true;
        if let Err(e) = self.timer.reset(wait.max(MIN_WAIT), None) {
            // Without a timer nothing would wake the device: let it retry instead.
            log::error!("cannot set a rate limiter timer: {e}");
            self.blocked = false;
        }
    }

    /// The timer fired: requests may be tried again.
    pub fn on_timer(&mut self) {
        let _ = self.timer.wait();
        self.blocked = false;
    }

    /// Applies a `PATCH`: the changed buckets start full. A waiting request is released, so
    /// the device should serve its queue after this.
    pub fn update(&mut self, bandwidth: BucketUpdate, ops: BucketUpdate) {
        let now = self.now();
        for (bucket, update) in [(&mut self.bandwidth, bandwidth), (&mut self.ops, ops)] {
            match update {
                BucketUpdate::Keep => {}
                BucketUpdate::Disable => *bucket = None,
                BucketUpdate::Set(spec) => *bucket = TokenBucket::new(spec, now),
            }
        }
        if self.blocked {
            let _ = self.timer.clear();
            self.blocked = false;
        }
    }

    /// The buckets in force now.
    pub fn spec(&self) -> RateLimiterConfig {
        RateLimiterConfig {
            bandwidth: self.bandwidth.as_ref().map(TokenBucket::spec),
            ops: self.ops.as_ref().map(TokenBucket::spec),
        }
    }
}

impl AsRawFd for RateLimiter {
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}

/// For tests: a bucket of `size` tokens refilled in `refill_ms`, without a one-time burst.
#[cfg(test)]
pub(crate) fn bucket(size: u64, refill_ms: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: None,
        refill_time: refill_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_buckets_give_or_neither_does() {
        let mut rl = RateLimiter::new(RateLimiterConfig {
            bandwidth: bucket(1000, 100_000),
            ops: bucket(2, 100_000),
        })
        .unwrap();
        assert!(rl.consume(400, 1));
        assert!(rl.consume(400, 1));
        // The ops bucket is empty: the bandwidth bucket keeps its 200 bytes.
        assert!(!rl.consume(100, 1));
        assert!(rl.is_blocked());
        assert!(!rl.consume(0, 0), "blocked until the timer fires");
        rl.update(BucketUpdate::Keep, BucketUpdate::Disable);
        assert!(!rl.is_blocked());
        assert!(rl.consume(200, 1));
        assert!(!rl.consume(1, 1));
    }

    #[test]
    fn a_throttled_limiter_fires_its_timer_when_tokens_are_back() {
        // 1000 bytes per 100 ms: 100 bytes take 10 ms.
        let mut rl = RateLimiter::new(RateLimiterConfig {
            bandwidth: bucket(1000, 100),
            ops: None,
        })
        .unwrap();
        assert!(rl.consume(1000, 1));
        let started = Instant::now();
        assert!(!rl.consume(100, 1));
        rl.on_timer(); // blocks until the timerfd expires
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(9), "{waited:?}");
        assert!(rl.consume(100, 1));
    }

    #[test]
    fn no_buckets_limit_nothing() {
        let mut rl = RateLimiter::new(RateLimiterConfig::default()).unwrap();
        assert!(!rl.is_limiting());
        assert!(rl.consume(u64::MAX, u64::MAX));
    }

    #[test]
    fn config_size_zero_is_no_limit_and_refill_zero_with_tokens_is_refused() {
        let none = RateLimiterConfig {
            bandwidth: bucket(0, 0),
            ops: bucket(0, 100),
        };
        assert!(none.validate().is_ok());
        assert!(RateLimiter::new(none).unwrap().spec() == RateLimiterConfig::default());
        let bad = RateLimiterConfig {
            bandwidth: None,
            ops: bucket(10, 0),
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "the ops bucket has size 10 but refill_time 0: refill_time is the milliseconds it takes to refill the bucket and must be at least 1 (a bucket of size 0 sets no limit)"
        );
    }

    #[test]
    fn a_patch_keeps_what_it_leaves_out_and_removes_a_zero_bucket() {
        let old = RateLimiterConfig {
            bandwidth: bucket(1000, 100),
            ops: bucket(10, 100),
        };
        let patch = RateLimiterConfig {
            bandwidth: None,
            ops: bucket(0, 0),
        };
        assert_eq!(patch.updates(), (BucketUpdate::Keep, BucketUpdate::Disable));
        assert_eq!(
            RateLimiterConfig::patched(Some(old), &patch),
            Some(RateLimiterConfig {
                bandwidth: bucket(1000, 100),
                ops: None
            })
        );
        let clear = RateLimiterConfig {
            bandwidth: bucket(0, 0),
            ops: None,
        };
        assert_eq!(
            RateLimiterConfig::patched(Some(old), &clear)
                .unwrap()
                .bandwidth,
            None
        );
    }
}
