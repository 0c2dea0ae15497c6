//! `balloon`: the memory balloon (Firecracker's `Balloon`, `BalloonUpdate` and
//! `BalloonStatsUpdate` bodies).

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonDeviceConfig {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    #[serde(default)]
    pub free_page_hinting: bool,
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// `PATCH /balloon`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    pub amount_mib: u32,
}

/// `PATCH /balloon/statistics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    pub stats_polling_interval_s: u16,
}

impl BalloonDeviceConfig {
    /// The target fits in guest RAM.
    pub fn validate(&self, mem_size_mib: usize) -> Result<(), ConfigError> {
        check_amount(self.amount_mib, mem_size_mib)
    }
}

pub fn check_amount(amount_mib: u32, mem_size_mib: usize) -> Result<(), ConfigError> {
    match amount_mib as usize > mem_size_mib {
        true => Err(ConfigError::BalloonTooLarge {
            amount_mib,
            mem_size_mib,
        }),
        false => Ok(()),
    }
}
