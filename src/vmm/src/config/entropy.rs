//! `entropy`: the virtio-rng device, with an optional rate limiter (Firecracker's
//! `EntropyDeviceConfig`).

use devices::virtio::rng::{Entropy, EntropyConfig};
use serde::{Deserialize, Serialize};

use super::{ConfigError, RateLimiterConfig};
use crate::builder::{BuildError, VirtioSpec, Wiring};

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EntropyDeviceConfig {
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

impl VirtioSpec for EntropyDeviceConfig {
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError> {
        let config = EntropyConfig {
            limiter: self.rate_limiter.unwrap_or_default(),
            metrics: w.metrics().entropy.clone(),
        };
        let rng = Entropy::new(&config).map_err(BuildError::EventFd)?;
        w.attach_virtio("entropy", rng)
    }
}
