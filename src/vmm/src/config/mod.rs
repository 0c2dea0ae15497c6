//! The configuration model: Firecracker's request bodies, with the config file's top-level
//! keys being the API paths. Parsing and validation live here (and in
//! [`crate::resources`]) so that the config file and the REST API reject the same input with
//! the same sentence. Unknown keys are refused at every level.

mod boot;
mod drive;
mod machine;

pub use boot::BootSourceConfig;
pub use drive::{CacheType, DriveConfig};
pub use machine::{MachineConfig, MAX_VCPUS};

use serde::Deserialize;

/// `--config-file`: every resource that can be set before boot.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    #[serde(rename = "boot-source")]
    pub boot_source: BootSourceConfig,
    #[serde(default)]
    pub drives: Vec<DriveConfig>,
    #[serde(rename = "machine-config", default)]
    pub machine_config: Option<MachineConfig>,
}

/// Why a configuration was refused; each variant is one sentence for the user.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Json(String),
    #[error("cannot read {what} {path}: {source}")]
    Unreadable {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("vcpu_count must be between 1 and {MAX_VCPUS}, not {0}")]
    VcpuCount(u8),
    #[error("vcpu_count must be 1 or even when smt is enabled, not {0}")]
    SmtOddVcpus(u8),
    #[error("mem_size_mib must be at least 1")]
    MemoryZero,
    #[error("mem_size_mib {0} is larger than a 64-bit address space")]
    MemoryTooLarge(usize),
    #[error("drive_id {0:?} must be 1 to 64 characters, letters, digits and '_' only")]
    DriveId(String),
    #[error("drives {0} and {1} are both marked as the root device; only one may be")]
    TwoRootDevices(String, String),
    #[error("drive_id {0} is used by two drives")]
    DuplicateDriveId(String),
    #[error("at most {max} drives are supported, not {count}")]
    TooManyDrives { max: usize, count: usize },
    #[error("the kernel command line must not contain a NUL byte")]
    BootArgsNul,
}

/// Parses JSON into `T`, naming the field path, line and column of the first error.
pub fn parse_json<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || inner.is_syntax() || inner.is_eof() {
            ConfigError::Json(inner.to_string())
        } else {
            ConfigError::Json(format!("{path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| ConfigError::Json(e.to_string()))?;
    Ok(value)
}

/// Checks that a file named in the configuration can be opened for reading.
pub(crate) fn check_readable(what: &'static str, path: &str) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .and_then(|f| {
            if f.metadata()?.is_dir() {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "it is a directory",
                ))
            } else {
                Ok(())
            }
        })
        .map_err(|source| ConfigError::Unreadable {
            what,
            path: path.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests;
