//! `machine-config`: vCPUs and memory. PUT replaces it ([`MachineConfig`]), PATCH changes the
//! fields it names ([`MachineConfigUpdate`]).

use serde::{Deserialize, Serialize};

use super::{ConfigError, StaticCpuTemplate};

/// Firecracker's limit, and the most the MP table describes.
pub const MAX_VCPUS: u8 = 32;

/// Firecracker's `huge_pages`: what backs guest memory, ordinary pages or 2 MiB hugetlbfs
/// pages from the host's pool (`vm.nr_hugepages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum HugePages {
    #[default]
    None,
    #[serde(rename = "2M")]
    Hugetlbfs2M,
}

impl HugePages {
    /// The size of one backing page.
    pub fn page_size(self) -> u64 {
        match self {
            HugePages::None => 4096,
            HugePages::Hugetlbfs2M => 2 << 20,
        }
    }

    /// Guest memory must be a whole number of backing pages: at least this many MiB.
    fn page_mib(self) -> usize {
        match self {
            HugePages::None => 1,
            HugePages::Hugetlbfs2M => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    pub vcpu_count: u8,
    pub mem_size_mib: usize,
    #[serde(default)]
    pub smt: bool,
    #[serde(default)]
    pub track_dirty_pages: bool,
    #[serde(default)]
    pub huge_pages: HugePages,
    /// A static CPU template. Absent keeps the current template, "None" clears any (a custom
    /// one too), as in Firecracker; shown only when a static template is set.
    #[serde(default, skip_serializing_if = "no_static_template")]
    pub cpu_template: Option<StaticCpuTemplate>,
}

impl Default for MachineConfig {
    /// Firecracker's defaults: one vCPU, 128 MiB.
    fn default() -> Self {
        MachineConfig {
            vcpu_count: 1,
            mem_size_mib: 128,
            smt: false,
            track_dirty_pages: false,
            huge_pages: HugePages::None,
            cpu_template: None,
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
        if !self.mem_size_mib.is_multiple_of(self.huge_pages.page_mib()) {
            return Err(ConfigError::MemoryNotPageMultiple(self.mem_size_mib));
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

/// `PATCH /machine-config`: every field optional; those given replace the current values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigUpdate {
    pub vcpu_count: Option<u8>,
    pub mem_size_mib: Option<usize>,
    pub smt: Option<bool>,
    pub track_dirty_pages: Option<bool>,
    pub huge_pages: Option<HugePages>,
    pub cpu_template: Option<StaticCpuTemplate>,
}

fn no_static_template(t: &Option<StaticCpuTemplate>) -> bool {
    matches!(t, None | Some(StaticCpuTemplate::None))
}

impl MachineConfigUpdate {
    pub fn is_empty(&self) -> bool {
        *self == MachineConfigUpdate::default()
    }

    /// `current` with this update applied (not yet validated).
    pub fn apply(self, current: &MachineConfig) -> MachineConfig {
        MachineConfig {
            vcpu_count: self.vcpu_count.unwrap_or(current.vcpu_count),
            mem_size_mib: self.mem_size_mib.unwrap_or(current.mem_size_mib),
            smt: self.smt.unwrap_or(current.smt),
            track_dirty_pages: self.track_dirty_pages.unwrap_or(current.track_dirty_pages),
            huge_pages: self.huge_pages.unwrap_or(current.huge_pages),
            cpu_template: self.cpu_template.or(current.cpu_template),
        }
    }
}
