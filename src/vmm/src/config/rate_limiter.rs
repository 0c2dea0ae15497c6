//! `rate_limiter`, `rx_rate_limiter`, `tx_rate_limiter`: Firecracker's `RateLimiter` body, a
//! `bandwidth` bucket (bytes) and an `ops` bucket (requests), each
//! `{size, one_time_burst, refill_time}` with `refill_time` in milliseconds.

use devices::rate_limiter::{BucketSpec, BucketUpdate, LimiterSpec};
use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    pub size: u64,
    #[serde(default)]
    pub one_time_burst: Option<u64>,
    pub refill_time: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    #[serde(default)]
    pub bandwidth: Option<TokenBucketConfig>,
    #[serde(default)]
    pub ops: Option<TokenBucketConfig>,
}

impl TokenBucketConfig {
    /// A bucket of size 0 limits nothing, as in Firecracker. A bucket with tokens but a
    /// refill time of 0 would refill infinitely fast: Firecracker silently drops that limit,
    /// Ember refuses it, since it cannot be what the caller meant.
    pub fn validate(&self, what: &'static str) -> Result<(), ConfigError> {
        if self.size > 0 && self.refill_time == 0 {
            return Err(ConfigError::RefillTime {
                what,
                size: self.size,
            });
        }
        Ok(())
    }

    /// The bucket, or None for one that limits nothing.
    pub fn spec(&self) -> Option<BucketSpec> {
        (self.size > 0 && self.refill_time > 0).then_some(BucketSpec {
            size: self.size,
            one_time_burst: self.one_time_burst.unwrap_or(0),
            refill_time_ms: self.refill_time,
        })
    }

    fn update(bucket: Option<&Self>) -> BucketUpdate {
        match bucket {
            None => BucketUpdate::Keep,
            Some(b) => b.spec().map_or(BucketUpdate::Disable, BucketUpdate::Set),
        }
    }
}

impl RateLimiterConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(b) = &self.bandwidth {
            b.validate("bandwidth")?;
        }
        if let Some(b) = &self.ops {
            b.validate("ops")?;
        }
        Ok(())
    }

    /// The limits of a device built with this limiter.
    pub fn spec(limiter: Option<&Self>) -> LimiterSpec {
        let Some(l) = limiter else {
            return LimiterSpec::default();
        };
        LimiterSpec {
            bandwidth: l.bandwidth.as_ref().and_then(TokenBucketConfig::spec),
            ops: l.ops.as_ref().and_then(TokenBucketConfig::spec),
        }
    }

    /// What a `PATCH` does to a running limiter: a bucket left out stays as it is, a bucket
    /// of size 0 is removed, any other replaces the old one.
    pub fn updates(&self) -> (BucketUpdate, BucketUpdate) {
        (
            TokenBucketConfig::update(self.bandwidth.as_ref()),
            TokenBucketConfig::update(self.ops.as_ref()),
        )
    }

    /// This limiter after `patch`, as `GET /vm/config` shows it.
    pub fn patched(current: Option<Self>, patch: &Self) -> Option<Self> {
        let keep = |new: Option<TokenBucketConfig>, old: Option<TokenBucketConfig>| match new {
            None => old,
            Some(b) if b.spec().is_none() => None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(size: u64, refill_time: u64) -> Option<TokenBucketConfig> {
        Some(TokenBucketConfig {
            size,
            one_time_burst: None,
            refill_time,
        })
    }

    #[test]
    fn size_zero_is_no_limit_and_refill_zero_with_tokens_is_refused() {
        let none = RateLimiterConfig {
            bandwidth: bucket(0, 0),
            ops: bucket(0, 100),
        };
        assert!(none.validate().is_ok());
        assert_eq!(RateLimiterConfig::spec(Some(&none)), LimiterSpec::default());
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
