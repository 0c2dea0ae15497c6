//! `PUT /serial` (Firecracker's `SerialDevice`): where the guest's console output goes
//! instead of ember's stdout (a file, a named pipe or a character device; the guest then gets
//! no input), and a bucket that bounds its bytes per second (what exceeds it is dropped and
//! counted). API only, as in Firecracker: not a config file section.

use serde::Deserialize;

use super::{ConfigError, TokenBucketConfig};

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    pub serial_out_path: Option<String>,
    pub rate_limiter: Option<TokenBucketConfig>,
}

impl SerialConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(bucket) = &self.rate_limiter {
            bucket.validate("serial rate_limiter")?;
        }
        Ok(())
    }
}
