//! A container's root filesystem in its bundle: one disk mounted on `rootfs`, or a read-only
//! image of the container image's layers (`lower`) under an overlay whose upper layer lives
//! on a writable disk (`upper`), so that many containers share one image and each writes
//! only its own disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::{Disk, Rootfs};
use super::sys;

/// How long a disk may take to reach the size the host announced.
const RESIZE_WAIT: Duration = Duration::from_secs(10);

/// Mounts `rootfs` on `bundle/rootfs`.
pub fn mount(rootfs: &Rootfs, bundle: &Path) -> Result<(), String> {
    let root = bundle.join("rootfs");
    let Some(writable) = &rootfs.writable else {
        mkdir(&root)?;
        return mount_disk(&rootfs.disk(), &root);
    };
    let (lower, upper) = (bundle.join("lower"), bundle.join("upper"));
    for dir in [&root, &lower, &upper] {
        mkdir(dir)?;
    }
    let mut image = rootfs.disk();
    image.options.push("ro".into());
    mount_disk(&image, &lower)?;
    let layered = || -> Result<(), String> {
        mount_disk(writable, &upper)?;
        let (dirs, work) = (upper.join("upper"), upper.join("work"));
        mkdir(&dirs)?;
        mkdir(&work)?;
        let data = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            dirs.display(),
            work.display()
        );
        sys::mount("overlay", &root, "overlay", 0, &data)
    };
    layered().inspect_err(|_| unmount(bundle))
}

/// Unmounts whatever [`mount`] mounted in `bundle` (detached: a process still holding a
/// file there does not keep the bundle from going).
pub fn unmount(bundle: &Path) {
    for dir in ["rootfs", "upper", "lower"] {
        sys::unmount_detached(&bundle.join(dir));
    }
}

fn mkdir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}

fn mount_disk(disk: &Disk, at: &Path) -> Result<(), String> {
    let device = device(disk)?;
    let mut flags = 0;
    let mut data = Vec::new();
    for o in &disk.options {
        match o.as_str() {
            "ro" => flags |= libc::MS_RDONLY,
            "rw" => {}
            other => data.push(other),
        }
    }
    sys::mount(
        &device.to_string_lossy(),
        at,
        &disk.fstype,
        flags,
        &data.join(","),
    )
    .map_err(|e| format!("cannot mount {} ({}): {e}", disk.device, disk.fstype))
}

/// The device node of `disk`, once it has its announced size, with no page of the file it
/// had before left in the guest's cache.
fn device(disk: &Disk) -> Result<PathBuf, String> {
    let name = if disk.device.starts_with('/') {
        let path = PathBuf::from(&disk.device);
        if disk.size.is_none() {
            return Ok(path);
        }
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{} names no device", disk.device))?
    } else {
        by_serial(&disk.device)?
    };
    let dev = PathBuf::from("/dev").join(&name);
    if let Some(size) = disk.size {
        let sectors = Path::new("/sys/block").join(&name).join("size");
        let start = Instant::now();
        loop {
            let now = std::fs::read_to_string(&sectors)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|s| s * 512);
            if now == Some(size) {
                break;
            }
            if start.elapsed() > RESIZE_WAIT {
                return Err(format!(
                    "{} has {} bytes, not the {size} announced",
                    disk.device,
                    now.map_or("an unknown number of".into(), |n| n.to_string())
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let file = std::fs::File::open(&dev).map_err(|e| format!("{}: {e}", dev.display()))?;
    sys::flush_block_cache(&file)
        .map_err(|e| format!("cannot drop the cached blocks of {}: {e}", dev.display()))?;
    Ok(dev)
}

/// The block device (`vdb`, …) whose virtio serial is `id`.
fn by_serial(id: &str) -> Result<String, String> {
    let entries = std::fs::read_dir("/sys/block").map_err(|e| format!("/sys/block: {e}"))?;
    for entry in entries.flatten() {
        let serial = std::fs::read_to_string(entry.path().join("serial")).unwrap_or_default();
        if serial.trim_end_matches(['\n', '\0']) == id {
            return Ok(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Err(format!("no disk has the ID {id:?}"))
}
