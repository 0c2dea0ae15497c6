//! `drives`: virtio-blk disks backed by raw image files. PUT adds or replaces one before boot
//! ([`DriveConfig`]); PATCH names one to change after boot ([`PartialDrive`]).

use serde::{Deserialize, Serialize};

use devices::virtio::block::{Block, BlockConfig};
pub use devices::virtio::block::{CacheType, IoEngine};

use super::{check_readable, ConfigError, RateLimiterConfig};
use crate::builder::{BuildError, VirtioSpec, Wiring};

/// A drive's backing file: an image file or a host block device.
const DISK: hostfile::Kind = hostfile::Kind::RegularOrBlockDevice;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DriveConfig {
    pub drive_id: String,
    pub path_on_host: String,
    pub is_root_device: bool,
    #[serde(default)]
    pub is_read_only: bool,
    pub partuuid: Option<String>,
    #[serde(default)]
    pub cache_type: CacheType,
    #[serde(default)]
    pub io_engine: IoEngine,
    pub rate_limiter: Option<RateLimiterConfig>,
    /// vhost-user-block: not part of Ember.
    pub socket: Option<String>,
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
        if let Some(limiter) = &self.rate_limiter {
            limiter.validate()?;
        }
        if self.socket.is_some() {
            return Err(ConfigError::Unsupported(
                "vhost-user block devices (socket)",
            ));
        }
        check_readable("the disk image", &self.path_on_host, DISK)
    }
}

/// `PATCH /drives/{drive_id}`: a new backing file or rate limiter for a booted guest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialDrive {
    pub drive_id: String,
    pub path_on_host: Option<String>,
    pub rate_limiter: Option<RateLimiterConfig>,
}

impl PartialDrive {
    /// Checks the new limiter, and that the new file can be read.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(limiter) = &self.rate_limiter {
            limiter.validate()?;
        }
        match &self.path_on_host {
            Some(path) => check_readable("the disk image", path, DISK),
            None => Ok(()),
        }
    }
}

impl VirtioSpec for DriveConfig {
    /// A block device on the drive's file; the root drive also names itself on the kernel
    /// command line, as Firecracker does.
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError> {
        let config = BlockConfig {
            id: self.drive_id.clone(),
            path: self.path_on_host.clone().into(),
            read_only: self.is_read_only,
            cache: self.cache_type,
            engine: self.io_engine,
            limiter: self.rate_limiter.unwrap_or_default(),
            metrics: w.metrics().block(&self.drive_id),
        };
        let block = Block::new(&config).map_err(|source| BuildError::Drive {
            id: self.drive_id.clone(),
            source,
        })?;
        if self.is_root_device {
            let mode = if self.is_read_only { "ro" } else { "rw" };
            match &self.partuuid {
                Some(uuid) => w.kernel_args(&format!(" root=PARTUUID={uuid} {mode}")),
                None => w.kernel_args(&format!(" root=/dev/vda {mode}")),
            }
        }
        w.attach_virtio(&self.drive_id, block)
    }
}
