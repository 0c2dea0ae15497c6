//! A host TAP device, opened by name in ember's network namespace, with the virtio-net header
//! on every frame (IFF_VNET_HDR) so that checksum and segmentation offloads pass through.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::sys;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;

/// The virtio 1.x net header (`virtio_net_hdr_v1`): 12 bytes, `num_buffers` included.
pub const VNET_HDR_LEN: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("the TAP device name {0:?} must be 1 to 15 bytes, without '/' or NUL")]
    Name(String),
    #[error("there is no network device named {0} in ember's network namespace; create the TAP device first (ip tuntap add {0} mode tap)")]
    NoSuchDevice(String),
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(#[source] std::io::Error),
    #[error("cannot attach to the TAP device {name}: {source} (is it a TAP device, and not in use by another process?)")]
    Attach {
        name: String,
        source: std::io::Error,
    },
    #[error("cannot set the virtio-net header size on the TAP device {name}: {source}")]
    VnetHeader {
        name: String,
        source: std::io::Error,
    },
}

#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attaches to the existing TAP device `name`, non-blocking.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        if name.is_empty()
            || name.len() >= libc::IFNAMSIZ
            || name.contains(['/', '\0'])
            || name.chars().any(char::is_whitespace)
        {
            return Err(TapError::Name(name.to_string()));
        }
        // TUNSETIFF would create a missing device for a privileged caller; Firecracker's
        // contract is that the host made the TAP, so a missing one is an error.
        if !sys::interface_exists(name) {
            return Err(TapError::NoSuchDevice(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        sys::tun_attach(&file, name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR).map_err(|source| {
            TapError::Attach {
                name: name.to_string(),
                source,
            }
        })?;
        sys::tun_set_vnet_hdr_len(&file, VNET_HDR_LEN).map_err(|source| TapError::VnetHeader {
            name: name.to_string(),
            source,
        })?;
        Ok(Tap {
            file,
            name: name.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which offloaded packets the host may hand us (TUN_F_*): only those the guest took.
    pub fn set_offload(&self, flags: u32) -> std::io::Result<()> {
        sys::tun_set_offload(&self.file, flags)
    }

    /// Reads one frame (virtio-net header first); WouldBlock when there is none.
    pub fn read_frame(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame (virtio-net header first).
    pub fn write_frame(&self, frame: &[u8]) -> std::io::Result<usize> {
        (&self.file).write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
