//! `balloon`: the memory balloon (Firecracker's `Balloon`, `BalloonUpdate` and
//! `BalloonStatsUpdate` bodies).

use devices::virtio::balloon::{Balloon, BalloonConfig};
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::builder::{BuildError, VirtioSpec, Wiring};

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

impl VirtioSpec for BalloonDeviceConfig {
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError> {
        let config = BalloonConfig {
            amount_mib: self.amount_mib,
            deflate_on_oom: self.deflate_on_oom,
            stats_polling_interval_s: self.stats_polling_interval_s,
            free_page_hinting: self.free_page_hinting,
            free_page_reporting: self.free_page_reporting,
            host_page_size: w.resources().machine_config.huge_pages.page_size(),
            metrics: w.metrics().balloon.clone(),
        };
        let balloon = Balloon::new(&config).map_err(BuildError::EventFd)?;
        w.attach_virtio("balloon", balloon)
    }
}
