//! `mmds-config`: which interfaces reach the metadata service, at which address, and whether
//! the guest needs V2 session tokens.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

pub use mmds::Version as MmdsVersion;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MmdsConfig {
    #[serde(default)]
    pub version: MmdsVersion,
    pub network_interfaces: Vec<String>,
    #[serde(default = "default_ip")]
    pub ipv4_address: Ipv4Addr,
    #[serde(default)]
    pub imds_compat: bool,
}

fn default_ip() -> Ipv4Addr {
    mmds::DEFAULT_IPV4
}

impl MmdsConfig {
    /// Checks what can be checked without the interfaces: the list is not empty and the
    /// address is one Firecracker allows (169.254.1.0 to 169.254.254.255).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.network_interfaces.is_empty() {
            return Err(ConfigError::MmdsNoInterfaces);
        }
        let [a, b, c, _] = self.ipv4_address.octets();
        if (a, b) != (169, 254) || !(1..=254).contains(&c) {
            return Err(ConfigError::MmdsAddress(self.ipv4_address));
        }
        Ok(())
    }
}
