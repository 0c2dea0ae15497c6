//! `vsock`: the virtio-vsock device and the host Unix socket behind it (Firecracker's `Vsock`
//! body).

use std::os::unix::net::UnixListener;
use std::sync::Arc;

use devices::virtio::vsock::{Vsock, VsockConfig};
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::builder::{BuildError, VirtioSpec, Wiring};

/// Unix socket paths (`sockaddr_un.sun_path`) hold 107 bytes and a NUL; guest-initiated
/// connections go to `<uds_path>_<port>`, up to 11 bytes longer.
const MAX_UDS_PATH: usize = 107 - 11;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VsockDeviceConfig {
    /// Deprecated in Firecracker; accepted and shown back, otherwise unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_id: Option<String>,
    pub guest_cid: u32,
    pub uds_path: String,
}

impl VsockDeviceConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.guest_cid < 3 {
            return Err(ConfigError::VsockCid(self.guest_cid));
        }
        if self.uds_path.is_empty()
            || self.uds_path.len() > MAX_UDS_PATH
            || self.uds_path.contains('\0')
        {
            return Err(ConfigError::VsockPath(self.uds_path.clone()));
        }
        Ok(())
    }
}

/// The vsock device's configuration with the socket `PUT /vsock` bound for it.
impl VirtioSpec for (VsockDeviceConfig, Arc<UnixListener>) {
    fn attach(&self, w: &mut Wiring) -> Result<(), BuildError> {
        let (device, listener) = self;
        let config = VsockConfig {
            guest_cid: u64::from(device.guest_cid),
            uds_path: device.uds_path.clone().into(),
            listener: listener.try_clone().map_err(BuildError::Vsock)?,
            metrics: w.metrics().vsock.clone(),
        };
        let vsock = Vsock::new(config).map_err(BuildError::Vsock)?;
        w.attach_virtio("vsock", vsock)
    }
}
