//! `drives`: virtio-blk disks backed by raw image files.

use serde::{Deserialize, Serialize};

use super::{check_readable, ConfigError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum CacheType {
    #[default]
    Unsafe,
    Writeback,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DriveConfig {
    pub drive_id: String,
    pub path_on_host: String,
    pub is_root_device: bool,
    #[serde(default)]
    pub is_read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    #[serde(default)]
    pub cache_type: CacheType,
}

/// Firecracker's rule for resource IDs.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl DriveConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !valid_id(&self.drive_id) {
            return Err(ConfigError::DriveId(self.drive_id.clone()));
        }
        check_readable("the disk image", &self.path_on_host)
    }
}
