//! A host TAP device, opened by name in ember's network namespace, with the virtio-net header
//! on every frame (IFF_VNET_HDR) so that checksum and segmentation offloads pass through.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// `_IOW('T', 202, int)` and friends, from <linux/if_tun.h>.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
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

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
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
        if !device_exists(name) {
            return Err(TapError::NoSuchDevice(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads an ifreq, which `req` is laid out as; the kernel only reads
        // and writes within it.
        let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(&file, TUNSETIFF, &mut req) };
        if rc < 0 {
            return Err(TapError::Attach {
                name: name.to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
        let size: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from `size`.
        let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(&file, TUNSETVNETHDRSZ, &size) };
        if rc < 0 {
            return Err(TapError::VnetHeader {
                name: name.to_string(),
                source: std::io::Error::last_os_error(),
            });
        }
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
        // SAFETY: TUNSETOFFLOAD takes its argument by value and touches no memory of ours.
        let rc = unsafe {
            vmm_sys_util::ioctl::ioctl_with_val(
                &self.file,
                TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        match rc < 0 {
            true => Err(std::io::Error::last_os_error()),
            false => Ok(()),
        }
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

fn device_exists(name: &str) -> bool {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: `c_name` is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::if_nametoindex(c_name.as_ptr()) != 0 }
}
