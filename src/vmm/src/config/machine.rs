//! `machine-config`: vCPUs and memory.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Firecracker's limit, and the most the MP table describes.
pub const MAX_VCPUS: u8 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    pub vcpu_count: u8,
    pub mem_size_mib: usize,
    #[serde(default)]
    pub smt: bool,
    #[serde(default)]
    pub track_dirty_pages: bool,
}

impl Default for MachineConfig {
    /// Firecracker's defaults: one vCPU, 128 MiB.
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            smt: false,
            track_dirty_pages: false,
        }
    }
}

impl MachineConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.vcpu_count == 0 || self.vcpu_count > MAX_VCPUS {
            return Err(ConfigError::VcpuCount(self.vcpu_count));
        }
        if self.smt && self.vcpu_count > 1 && self.vcpu_count % 2 == 1 {
            return Err(ConfigError::SmtOddVcpus(self.vcpu_count));
        }
        if self.mem_size_mib == 0 {
            return Err(ConfigError::MemoryZero);
        }
        self.mem_bytes()?;
        Ok(())
    }

    /// Guest memory in bytes.
    pub fn mem_bytes(&self) -> Result<u64, ConfigError> {
        (self.mem_size_mib as u64)
            .checked_mul(1 << 20)
            .ok_or(ConfigError::MemoryTooLarge(self.mem_size_mib))
    }
}
