//! One token bucket, as pure arithmetic on a caller-supplied clock (nanoseconds), so that
//! tests can drive time by hand, backwards included.
//!
//! The model is Firecracker's: a bucket of `size` tokens that refills at `size` tokens per
//! `refill_time` milliseconds, never above `size`; `one_time_burst` extra tokens that are spent first
//! and never come back; and a request larger than the whole bucket is admitted when the bucket
//! is full, leaving a debt that the refill pays before anything else is admitted.

/// What a bucket holds and how fast it refills: Firecracker's `TokenBucket` body, the
/// API's and the snapshot's type as well as the device's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    pub size: u64,
    pub one_time_burst: Option<u64>,
    /// Milliseconds to refill the whole bucket.
    pub refill_time: u64,
}

impl TokenBucketConfig {
    /// Refuses a bucket with tokens but a refill time of 0 (`what` names it).
    pub fn validate(&self, what: &'static str) -> Result<(), super::RefillTimeError> {
        match self.size > 0 && self.refill_time == 0 {
            true => Err(super::RefillTimeError {
                what,
                size: self.size,
            }),
            false => Ok(()),
        }
    }

    /// Whether the bucket limits anything: a size or refill time of 0 is how Firecracker
    /// spells "no limit".
    pub fn limits(&self) -> bool {
        self.size > 0 && self.refill_time > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    spec: TokenBucketConfig,
    /// Tokens available now, at most `spec.size`.
    budget: u64,
    /// Tokens owed by an admitted request that was larger than the bucket.
    debt: u64,
    /// What is left of the one-time burst.
    burst: u64,
    /// The time up to which refills have been counted. Behind "now" by less than one
    /// token's worth while the bucket is not full, so that no fraction of a token is lost.
    counted_until: u64,
}

impl TokenBucket {
    /// A full bucket at time `now`; None for a bucket that limits nothing (size or refill
    /// time 0, which is how Firecracker spells "no limit").
    pub fn new(spec: TokenBucketConfig, now: u64) -> Option<Self> {
        if !spec.limits() {
            return None;
        }
        Some(TokenBucket {
            spec,
            budget: spec.size,
            debt: 0,
            burst: spec.one_time_burst.unwrap_or(0),
            counted_until: now,
        })
    }

    pub fn spec(&self) -> TokenBucketConfig {
        self.spec
    }

    /// Tokens available now, the one-time burst included.
    pub fn available(&self) -> u64 {
        self.budget.saturating_add(self.burst)
    }

    pub fn one_time_burst_left(&self) -> u64 {
        self.burst
    }

    fn refill_ns(&self) -> u128 {
        u128::from(self.spec.refill_time) * 1_000_000
    }

    /// Adds the tokens earned since the last call. A clock that went backwards restarts the
    /// count from its new reading and earns nothing for the gap.
    pub fn refill(&mut self, now: u64) {
        // A full bucket earns nothing, and banks no time either: else the time it sat full
        // would pay for tokens taken after it (found by a rate test that ran slowly).
        if now <= self.counted_until || (self.budget == self.spec.size && self.debt == 0) {
            self.counted_until = now;
            return;
        }
        let elapsed = u128::from(now - self.counted_until);
        let size = u128::from(self.spec.size);
        let earned = elapsed * size / self.refill_ns();
        if earned == 0 {
            return;
        }
        // The time those whole tokens took; the rest of `elapsed` carries to the next call.
        let took = earned * self.refill_ns() / size;
        let paid = earned.min(u128::from(self.debt));
        self.debt -= paid as u64;
        let earned = earned - paid;
        let budget = (u128::from(self.budget) + earned).min(size) as u64;
        self.budget = budget;
        self.counted_until = match budget == self.spec.size {
            // A full bucket earns nothing more; its carry is dropped.
            true => now,
            false => self.counted_until + took as u64,
        };
    }

    /// Takes `tokens` if the bucket (with its burst) can give them now; refills first.
    pub fn reduce(&mut self, tokens: u64, now: u64) -> bool {
        self.refill(now);
        let from_burst = self.burst.min(tokens);
        let rest = tokens - from_burst;
        if rest == 0 {
            self.burst -= from_burst;
            return true;
        }
        if self.debt > 0 {
            return false;
        }
        if rest <= self.budget {
            self.budget -= rest;
        } else if rest > self.spec.size && self.budget == self.spec.size {
            self.debt = rest - self.spec.size;
            self.budget = 0;
        } else {
            return false;
        }
        self.burst -= from_burst;
        true
    }

    /// Nanoseconds from `now` until [`TokenBucket::reduce`] of `tokens` can succeed (0 if it
    /// can now). Call after a failed `reduce`, which refilled the bucket at `now`.
    pub fn wait_ns(&self, tokens: u64, now: u64) -> u64 {
        let rest = tokens.saturating_sub(self.burst);
        if rest == 0 {
            return 0;
        }
        let target = rest.min(self.spec.size);
        let needed = u128::from(self.debt) + u128::from(target.saturating_sub(self.budget));
        if needed == 0 {
            return 0;
        }
        let size = u128::from(self.spec.size);
        let ns = match needed.checked_mul(self.refill_ns()) {
            Some(product) => product.div_ceil(size),
            None => u128::MAX,
        };
        let carried = u128::from(now.saturating_sub(self.counted_until));
        ns.saturating_sub(carried).min(u128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// 1000 tokens a second, all taken at time 0.
    fn emptied() -> TokenBucket {
        let mut b = bucket(1000, 0, 1000);
        assert!(b.reduce(1000, 0));
        b
    }

    fn bucket(size: u64, burst: u64, refill_ms: u64) -> TokenBucket {
        let spec = TokenBucketConfig {
            size,
            one_time_burst: Some(burst),
            refill_time: refill_ms,
        };
        TokenBucket::new(spec, 0).unwrap()
    }

    #[test]
    fn zero_size_or_refill_time_means_no_limit() {
        for (size, refill) in [(0, 1000), (1000, 0), (0, 0)] {
            let spec = TokenBucketConfig {
                size,
                one_time_burst: Some(5),
                refill_time: refill,
            };
            assert_eq!(TokenBucket::new(spec, 0), None);
        }
    }

    #[test]
    fn time_spent_full_pays_for_nothing_taken_later() {
        // Full from 0 to 49 ms: the first token taken after that is due 50 ms later, not at
        // 50 ms after the bucket was made.
        let mut b = bucket(2, 0, 100);
        assert!(b.reduce(1, 49 * MS));
        assert!(b.reduce(1, 49 * MS));
        assert!(
            !b.reduce(1, 98 * MS),
            "one token earned in 49 ms of a 50 ms rate"
        );
        assert!(b.reduce(1, 99 * MS));
    }

    #[test]
    fn starts_full_and_refills_at_size_per_refill_time() {
        let mut b = emptied();
        assert!(!b.reduce(1, 0));
        // 1 ms earns 1 token.
        assert!(!b.reduce(2, MS));
        assert!(b.reduce(1, MS));
        // Half a refill time earns half the bucket, never more than the bucket.
        assert!(b.reduce(500, 501 * MS));
        b.refill(100 * S);
        assert_eq!(b.available(), 1000);
    }

    #[test]
    fn fractions_of_a_token_are_carried_not_lost() {
        // 3 tokens per 1000 ms: one every 333.33 ms.
        let mut b = bucket(3, 0, 1000);
        assert!(b.reduce(3, 0));
        let mut got = 0;
        for step in 1..=3000u64 {
            if b.reduce(1, step * MS) {
                got += 1;
            }
        }
        assert_eq!(got, 9, "3 s at 3 tokens/s");
    }

    #[test]
    fn large_values_do_not_overflow() {
        let mut b = bucket(u64::MAX, u64::MAX, u64::MAX);
        assert!(b.reduce(u64::MAX, 0));
        assert!(b.reduce(u64::MAX, 0));
        assert!(!b.reduce(u64::MAX, 0));
        b.refill(u64::MAX);
        // u64::MAX ns of a u64::MAX ms refill time earns a millionth of the bucket.
        assert_eq!(b.available(), u64::MAX / 1_000_000);
        assert!(b.wait_ns(u64::MAX, u64::MAX) > 0);

        let mut fast = bucket(u64::MAX, 0, 1);
        assert!(fast.reduce(u64::MAX, 0));
        fast.refill(u64::MAX);
        assert_eq!(fast.available(), u64::MAX);
    }

    #[test]
    fn the_one_time_burst_goes_first_and_does_not_come_back() {
        let mut b = bucket(100, 250, 1000);
        assert_eq!(b.available(), 350);
        assert!(b.reduce(200, 0));
        assert_eq!(b.one_time_burst_left(), 50);
        // A request that spans the burst and the bucket takes from both.
        assert!(b.reduce(120, 0));
        assert_eq!(b.one_time_burst_left(), 0);
        assert_eq!(b.available(), 30);
        // A request the two cannot cover takes nothing.
        assert!(!b.reduce(31, 0));
        assert_eq!(b.available(), 30);
        b.refill(10 * S);
        assert_eq!(b.available(), 100, "the burst is not refilled");
    }

    #[test]
    fn a_request_larger_than_the_bucket_waits_for_a_full_bucket_then_leaves_a_debt() {
        let mut b = bucket(100, 0, 1000);
        assert!(b.reduce(10, 0));
        assert!(!b.reduce(250, 0), "the bucket is not full");
        assert_eq!(b.wait_ns(250, 0), 100 * MS);
        assert!(b.reduce(250, 100 * MS));
        // 150 tokens are owed: 1.5 s before even one token is available again.
        assert!(!b.reduce(1, 100 * MS));
        assert_eq!(b.wait_ns(1, 100 * MS), 1510 * MS);
        assert!(!b.reduce(1, 1600 * MS));
        assert!(b.reduce(1, 1610 * MS));
    }

    #[test]
    fn wait_ns_is_exactly_the_time_until_reduce_succeeds() {
        let mut b = emptied();
        assert!(!b.reduce(400, 123));
        let wait = b.wait_ns(400, 123);
        assert!(!b.reduce(400, 123 + wait - 1));
        assert!(b.reduce(400, 123 + wait));
    }

    #[test]
    fn time_going_backwards_earns_nothing_and_loses_nothing_after() {
        let mut b = bucket(1000, 0, 1000);
        assert!(b.reduce(1000, 10 * S));
        assert!(!b.reduce(1, 5 * S), "going back earns nothing");
        // Counting restarts at 5 s: 100 ms later, 100 tokens.
        assert!(b.reduce(100, 5 * S + 100 * MS));
        assert!(!b.reduce(1, 5 * S + 100 * MS));
    }
}
