//! `entropy`: the virtio-rng device, with an optional rate limiter (Firecracker's
//! `EntropyDeviceConfig`).

use serde::{Deserialize, Serialize};

use super::{ConfigError, RateLimiterConfig};

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyDeviceConfig {
    #[serde(default)]
    pub rate_limiter: Option<RateLimiterConfig>,
}

impl EntropyDeviceConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.rate_limiter {
            Some(limiter) => Ok(limiter.validate()?),
            None => Ok(()),
        }
    }
}
