//! `rate_limiter`, `rx_rate_limiter`, `tx_rate_limiter`: Firecracker's `RateLimiter` body, a
//! `bandwidth` bucket (bytes) and an `ops` bucket (requests), each
//! `{size, one_time_burst, refill_time}` with `refill_time` in milliseconds. The types are the
//! devices' own: what the API takes is what a device's limiter runs on.

pub use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
