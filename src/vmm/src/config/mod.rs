//! The configuration model: Firecracker's request bodies, with the config file's top-level
//! keys being the API paths. Parsing and validation live here (and in
//! [`crate::resources`]) so that the config file and the REST API reject the same input with
//! the same sentence. Unknown keys are refused at every level.

mod balloon;
mod boot;
mod cpu;
mod drive;
mod entropy;
mod machine;
mod mmds;
mod net;
mod rate_limiter;
mod serial;
mod telemetry;
mod vsock;

pub use balloon::{check_amount, BalloonDeviceConfig, BalloonStatsUpdate, BalloonUpdate};
pub use boot::BootSourceConfig;
#[cfg(test)]
pub use cpu::EXAMPLE_TEMPLATE;
pub use cpu::{
    Bitmap, CpuConfig, CpuTemplate, CpuidLeafModifier, CpuidRegister, CpuidRegisterModifier,
    KvmCapability, MsrModifier, StaticCpuTemplate,
};
pub use drive::{valid_id, CacheType, DriveConfig, IoEngine, PartialDrive};
pub use entropy::EntropyDeviceConfig;
pub use machine::{HugePages, MachineConfig, MachineConfigUpdate, MAX_VCPUS};
pub use mmds::{MmdsConfig, MmdsVersion};
pub use net::{MacAddr, NetworkInterfaceConfig, PartialNetworkInterface};
pub use rate_limiter::{RateLimiterConfig, TokenBucketConfig};
pub use serial::SerialConfig;
pub use telemetry::{LogLevel, LoggerConfig, MetricsConfig};
pub use vsock::VsockDeviceConfig;

use serde::{Deserialize, Serialize};

/// `--config-file`, and `GET /vm/config`: every resource that can be set before boot, under
/// the keys of Firecracker's `FullVmConfiguration`. `GET` shows every key, as Firecracker
/// does: `null` or `[]` where nothing is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct VmConfig {
    pub balloon: Option<BalloonDeviceConfig>,
    #[serde(default)]
    pub drives: Vec<DriveConfig>,
    /// Required in a config file; `GET /vm/config` shows an empty kernel path until it is
    /// set, as Firecracker does.
    pub boot_source: Option<BootSourceConfig>,
    pub cpu_config: Option<CpuConfig>,
    /// Applied when ember starts; `GET /vm/config` shows `null`, as Firecracker does.
    pub logger: Option<LoggerConfig>,
    pub machine_config: Option<MachineConfig>,
    /// Applied when ember starts; `GET /vm/config` shows `null`, as Firecracker does.
    pub metrics: Option<MetricsConfig>,
    pub mmds_config: Option<MmdsConfig>,
    #[serde(default)]
    pub network_interfaces: Vec<NetworkInterfaceConfig>,
    pub vsock: Option<VsockDeviceConfig>,
    /// `null` asks for no device.
    pub entropy: Option<EntropyDeviceConfig>,
    /// Firecracker's sections for devices Ember lacks, accepted when empty (`null`, `[]`) so
    /// that its files and its `GET /vm/config` output load; anything in them is refused by
    /// [`VmConfig::check_later`].
    #[serde(default = "empty_list")]
    pub pmem: serde_json::Value,
    pub memory_hotplug: Option<serde_json::Value>,
}

fn empty_list() -> serde_json::Value {
    serde_json::Value::Array(Vec::new())
}

impl VmConfig {
    /// The start of what `GET /vm/config` shows: the machine, with no devices; the caller
    /// fills in the sections Ember has.
    pub fn new(machine_config: MachineConfig) -> Self {
        VmConfig {
            balloon: None,
            drives: Vec::new(),
            boot_source: Some(BootSourceConfig::default()),
            cpu_config: None,
            logger: None,
            machine_config: Some(machine_config),
            metrics: None,
            mmds_config: None,
            network_interfaces: Vec::new(),
            vsock: None,
            entropy: None,
            pmem: empty_list(),
            memory_hotplug: None,
        }
    }

    /// Refuses any section that asks for something; `null` and `[]` ask for nothing.
    pub fn check_later(&self) -> Result<(), ConfigError> {
        let asks = |v: &serde_json::Value| match v {
            serde_json::Value::Null => false,
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        if asks(&self.pmem) {
            return Err(ConfigError::Unsupported("virtio-pmem devices (pmem)"));
        }
        if self.memory_hotplug.as_ref().is_some_and(asks) {
            return Err(ConfigError::Unsupported("memory hotplug (memory-hotplug)"));
        }
        Ok(())
    }
}

/// Why a configuration was refused; each variant is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Json(String),
    #[error("invalid configuration: missing field `boot-source`")]
    NoBootSource,
    #[error("cannot read {what} {path}: {source}")]
    Unreadable {
        what: &'static str,
        path: String,
        source: hostfile::Error,
    },
    #[error("vcpu_count must be between 1 and {MAX_VCPUS}, not {0}")]
    VcpuCount(u8),
    #[error("vcpu_count must be 1 or even when smt is enabled, not {0}")]
    SmtOddVcpus(u8),
    #[error("mem_size_mib must be at least 1")]
    MemoryZero,
    #[error("mem_size_mib {0} is not a whole number of 2 MiB huge pages (huge_pages \"2M\" needs an even mem_size_mib)")]
    MemoryNotPageMultiple(usize),
    #[error("mem_size_mib {0} is larger than a 64-bit address space")]
    MemoryTooLarge(usize),
    #[error("drive_id {0:?} must be 1 to 64 characters, letters, digits and '_' only")]
    DriveId(String),
    #[error("drives {0} and {1} are both marked as the root device; only one may be")]
    TwoRootDevices(String, String),
    #[error("there is no drive with drive_id {0}")]
    NoSuchDrive(String),
    #[error("drive_id {0} is used by two drives")]
    DuplicateDriveId(String),
    #[error("drive {drive}: io_engine Async needs io_uring, which this host's kernel does not offer ({source}); use Sync")]
    NoIoUring {
        drive: String,
        source: std::io::Error,
    },
    #[error("at most {max} virtio devices (drives and network interfaces together) are supported, not {count}")]
    TooManyDevices { max: usize, count: usize },
    #[error("iface_id {0} is used by two network interfaces")]
    DuplicateIfaceId(String),
    #[error("iface_id {0:?} must be 1 to 64 characters, letters, digits and '_' only")]
    IfaceId(String),
    #[error("there is no network interface with iface_id {0}")]
    NoSuchIface(String),
    #[error("network interface {iface}: {reason}")]
    Tap { iface: String, reason: String },
    #[error("the MAC address {mac} is already used by network interface {other}")]
    DuplicateMac { mac: MacAddr, other: String },
    #[error("the host device {tap} is already used by network interface {other}")]
    DuplicateTap { tap: String, other: String },
    #[error("mtu must be between 68 and 65535, not {0}")]
    Mtu(u32),
    #[error("The list of network interface IDs that allow forwarding MMDS requests is empty.")]
    MmdsNoInterfaces,
    #[error("The list of network interface IDs provided contains at least one ID that does not correspond to any existing network interface: {0}.")]
    MmdsUnknownIface(String),
    #[error("The MMDS IPv4 address {0} is not a link-local address from 169.254.1.0 to 169.254.254.255.")]
    MmdsAddress(std::net::Ipv4Addr),
    #[error("the MMDS data could not be stored: {0}")]
    Mmds(#[from] ::mmds::StoreError),
    #[error(transparent)]
    RefillTime(#[from] devices::rate_limiter::RefillTimeError),
    #[error("the kernel command line must not contain a NUL byte")]
    BootArgsNul,
    #[error("the vsock guest_cid must be at least 3 (0 to 2 are reserved), not {0}")]
    VsockCid(u32),
    #[error("the vsock uds_path {0:?} must be 1 to 96 bytes long, with no NUL byte")]
    VsockPath(String),
    #[error("cannot listen on the vsock socket {path}: {source}")]
    VsockListen {
        path: String,
        source: std::io::Error,
    },
    #[error("Ember does not support {0}")]
    Unsupported(&'static str),
    #[error("the balloon's amount_mib {amount_mib} is more than the guest's memory ({mem_size_mib} MiB)")]
    BalloonTooLarge {
        amount_mib: u32,
        mem_size_mib: usize,
    },
    #[error("the balloon device is not configured")]
    NoBalloon,
    #[error("the balloon's statistics are not enabled (stats_polling_interval_s was 0 when the microVM started)")]
    BalloonStatsDisabled,
    #[error("the balloon's statistics cannot be turned on or off after the microVM started")]
    BalloonStatsOnOff,
}

/// Parses JSON into `T`, naming the field path, line and column of the first error.
pub fn parse_json<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, ConfigError> {
    parse_json_in(text, None)
}

/// [`parse_json`] for one section of the configuration (an API request body): the field
/// path in an error starts with the section's name, as it would in a config file.
pub fn parse_json_in<'a, T: Deserialize<'a>>(
    text: &'a str,
    section: Option<&str>,
) -> Result<T, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let path = match (section, path.as_str()) {
            (Some(s), ".") => s.to_string(),
            (Some(s), p) => format!("{s}.{p}"),
            (None, p) => p.to_string(),
        };
        // The path says where parsing stopped, which helps even for a syntax error (an enum
        // given a number is one), except at the very end of the text.
        if path == "." || path.is_empty() || inner.is_eof() {
            ConfigError::Json(inner.to_string())
        } else {
            ConfigError::Json(format!("{path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| ConfigError::Json(e.to_string()))?;
    Ok(value)
}

/// Checks that a file named in the configuration can be opened for reading, and is a
/// regular file (or, for a disk, a block device); never waits on a FIFO.
pub(crate) fn check_readable(
    what: &'static str,
    path: &str,
    kind: hostfile::Kind,
) -> Result<(), ConfigError> {
    hostfile::open(std::path::Path::new(path), kind, false)
        .map(drop)
        .map_err(|source| ConfigError::Unreadable {
            what,
            path: path.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests;
