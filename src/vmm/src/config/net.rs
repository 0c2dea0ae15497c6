//! `network-interfaces`: virtio-net devices on host TAP devices. PUT adds or replaces one
//! before boot ([`NetworkInterfaceConfig`]); PATCH changes its rate limiters after boot
//! ([`PartialNetworkInterface`]).

use devices::virtio::net::{MmdsLink, Net, NetConfig};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{valid_id, ConfigError, RateLimiterConfig};
use crate::builder::{BuildError, VirtioSpec, Wiring};

/// A MAC address, written `aa:bb:cc:dd:ee:ff` in the API as in Firecracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddr(pub [u8; 6]);

impl std::str::FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a MAC address (six hex bytes separated by ':')");
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        Ok(MacAddr(mac))
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterfaceConfig {
    pub iface_id: String,
    pub host_dev_name: String,
    pub guest_mac: Option<MacAddr>,
    /// Advertised with VIRTIO_NET_F_MTU when set.
    pub mtu: Option<u32>,
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

fn validate_limiters(
    rx: Option<&RateLimiterConfig>,
    tx: Option<&RateLimiterConfig>,
) -> Result<(), ConfigError> {
    Ok(rx
        .into_iter()
        .chain(tx)
        .try_for_each(RateLimiterConfig::validate)?)
}

impl NetworkInterfaceConfig {
    /// Checks the fields, and that the TAP device exists and can be attached to.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !valid_id(&self.iface_id) {
            return Err(ConfigError::IfaceId(self.iface_id.clone()));
        }
        if let Some(mtu) = self.mtu {
            if !(68..=65535).contains(&mtu) {
                return Err(ConfigError::Mtu(mtu));
            }
        }
        validate_limiters(self.rx_rate_limiter.as_ref(), self.tx_rate_limiter.as_ref())?;
        devices::virtio::net::Tap::open(&self.host_dev_name)
            .map(drop)
            .map_err(|e| ConfigError::Tap {
                iface: self.iface_id.clone(),
                reason: e.to_string(),
            })
    }
}

/// `PATCH /network-interfaces/{iface_id}`: new rate limiters for a booted guest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialNetworkInterface {
    pub iface_id: String,
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    pub tx_rate_limiter: Option<RateLimiterConfig>,
}

impl PartialNetworkInterface {
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_limiters(self.rx_rate_limiter.as_ref(), self.tx_rate_limiter.as_ref())
    }
}

impl VirtioSpec for NetworkInterfaceConfig {
    /// A net device on the interface's TAP, with the MMDS if the MMDS config names it.
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError> {
        let mmds = w
            .resources()
            .mmds_config
            .as_ref()
            .filter(|m| m.network_interfaces.contains(&self.iface_id))
            .map(|m| MmdsLink {
                ip: m.ipv4_address,
                store: w.mmds().clone(),
            });
        let config = NetConfig {
            id: self.iface_id.clone(),
            tap: self.host_dev_name.clone(),
            guest_mac: self.guest_mac.map(|m| m.0),
            mtu: self.mtu.map(|m| m as u16),
            mmds,
            rx_limiter: self.rx_rate_limiter.unwrap_or_default(),
            tx_limiter: self.tx_rate_limiter.unwrap_or_default(),
            metrics: w.metrics().net(&self.iface_id),
        };
        let net = Net::new(&config).map_err(|source| BuildError::Net {
            id: self.iface_id.clone(),
            source,
        })?;
        w.attach_virtio(&self.iface_id, net)
    }
}
