//! Images as disks. containerd's snapshotter (overlayfs, or native) gives a container its
//! root filesystem as mounts of directories on the host; the guest needs block devices. For
//! each set of read-only layers the shim makes one ext4 image, once, and keeps it in the
//! cache for every later container of that image; each container gets its own writable
//! layer, a sparse ext4 file, which the guest's overlayfs puts above the image. Starting a
//! container copies nothing. (docs/containers.md says why not the devmapper snapshotter.)

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use containerd_shim::protos::types::mount::Mount;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the root filesystem's mount type {0:?} is not one the Ember shim can use (it needs the overlayfs or native snapshotter)")]
    MountType(String),
    #[error("the overlay mount of the root filesystem has no lowerdir")]
    NoLower,
    #[error(
        "the container has no root filesystem (no mounts and no rootfs directory in its bundle)"
    )]
    NoRootfs,
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0} failed: {1}")]
    Tool(String, String),
}

/// A container's two disks.
#[derive(Debug)]
pub struct Disks {
    pub image: PathBuf,
    pub image_bytes: u64,
    pub writable: PathBuf,
    pub writable_bytes: u64,
}

/// The layer directories of a root filesystem, top first.
fn lower_dirs(mounts: &[Mount], bundle: &Path) -> Result<(Vec<PathBuf>, bool), Error> {
    let Some(mount) = mounts.first() else {
        let dir = bundle.join("rootfs");
        return match dir.join("bin").exists()
            || std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some())
        {
            true => Ok((vec![dir], false)),
            false => Err(Error::NoRootfs),
        };
    };
    match mount.type_.as_str() {
        "overlay" => {
            let lower = mount
                .options
                .iter()
                .find_map(|o| o.strip_prefix("lowerdir="))
                .ok_or(Error::NoLower)?;
            Ok((lower.split(':').map(PathBuf::from).collect(), true))
        }
        // The native snapshotter's active snapshot: a directory of its own per container.
        "bind" | "rbind" => Ok((vec![PathBuf::from(&mount.source)], false)),
        other => Err(Error::MountType(other.to_string())),
    }
}

/// The disks of a container: the cached image of its layers (made now if it is the image's
/// first container; `cache` holds it) and a fresh writable layer in `dir`.
pub fn prepare(
    mounts: &[Mount],
    bundle: &Path,
    cache: &Path,
    dir: &Path,
    writable_mib: u64,
) -> Result<Disks, Error> {
    let (lower, shared) = lower_dirs(mounts, bundle)?;
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| Error::Io(p, e)
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let image = if shared {
        // Layers committed by the snapshotter never change: one image per layer set.
        std::fs::create_dir_all(cache).map_err(io(cache))?;
        let key = fnv64(
            lower
                .iter()
                .map(|p| p.to_string_lossy())
                .collect::<Vec<_>>()
                .join(":")
                .as_bytes(),
        );
        let image = cache.join(format!("{key:016x}.ext4"));
        let lock = File::create(cache.join(format!("{key:016x}.lock"))).map_err(io(cache))?;
        crate::sys::flock(&lock);
        if !image.exists() {
            build_image(&lower, &image, &cache.join(format!("{key:016x}.mnt")))?;
        }
        image
    } else {
        // A directory that may change: its own image, made for this container.
        let image = dir.join("image.ext4");
        build_image(&lower, &image, &dir.join("image.mnt"))?;
        image
    };
    let image_bytes = std::fs::metadata(&image).map_err(io(&image))?.len();
    let writable = dir.join("writable.ext4");
    let writable_bytes = writable_mib << 20;
    File::create(&writable)
        .and_then(|f| f.set_len(writable_bytes))
        .map_err(io(&writable))?;
    // No journal: the layer lives and dies with its container.
    mkfs(
        &writable,
        &["-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard"],
        None,
    )?;
    Ok(Disks {
        image,
        image_bytes,
        writable,
        writable_bytes,
    })
}

/// Makes the ext4 image of `lower` (merged by a read-only overlay mount when there are
/// several) at `image`, through a temporary file so that a half-made image is never used.
fn build_image(lower: &[PathBuf], image: &Path, mnt: &Path) -> Result<(), Error> {
    let merged;
    let source = if lower.len() == 1 {
        lower[0].clone()
    } else {
        std::fs::create_dir_all(mnt).map_err(|e| Error::Io(mnt.to_path_buf(), e))?;
        let data = format!(
            "lowerdir={}",
            lower
                .iter()
                .map(|p| p.to_string_lossy())
                .collect::<Vec<_>>()
                .join(":")
        );
        run(
            "mount",
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &data])
                .arg(mnt),
        )?;
        merged = Unmount(mnt.to_path_buf());
        merged.0.clone()
    };
    let (bytes, inodes) = tree_size(&source);
    // Room for ext4's own metadata, and never tiny.
    let size = ((bytes + bytes / 5 + (16 << 20)) >> 20) << 20;
    let partial = image.with_extension("partial");
    File::create(&partial)
        .and_then(|f| f.set_len(size))
        .map_err(|e| Error::Io(partial.clone(), e))?;
    let inodes = (inodes + inodes / 5 + 1024).to_string();
    let made = mkfs(
        &partial,
        &["-O", "^has_journal", "-N", &inodes, "-d"],
        Some(&source),
    )
    .and_then(|()| std::fs::rename(&partial, image).map_err(|e| Error::Io(image.to_path_buf(), e)));
    if made.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    made
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn mkfs(file: &Path, options: &[&str], source: Option<&Path>) -> Result<(), Error> {
    let mut command = Command::new("mkfs.ext4");
    command.args(["-q", "-F"]).args(options);
    if let Some(source) = source {
        command.arg(source);
    }
    command.arg(file);
    run("mkfs.ext4", &mut command)
}

fn run(what: &str, command: &mut Command) -> Result<(), Error> {
    let out = command
        .output()
        .map_err(|e| Error::Tool(what.to_string(), e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Tool(
            what.to_string(),
            format!("{} ({})", err.trim(), out.status),
        ));
    }
    Ok(())
}

/// Bytes (in 4 KiB blocks) and entries of a tree, not following symbolic links.
fn tree_size(root: &Path) -> (u64, u64) {
    let (mut bytes, mut entries) = (0u64, 1u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(list) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in list.flatten() {
            entries += 1;
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            bytes += meta.size().div_ceil(4096) * 4096;
            if meta.is_dir() {
                bytes += 4096;
                stack.push(entry.path());
            }
        }
    }
    (bytes, entries)
}

/// FNV-1a: a stable name for a layer set (its directories' paths).
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(type_: &str, source: &str, options: &[&str]) -> Mount {
        Mount {
            type_: type_.into(),
            source: source.into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_layers_of_a_root_filesystem_come_from_its_mounts() {
        let bundle = Path::new("/nonexistent-bundle");
        let overlay = mount(
            "overlay",
            "overlay",
            &["index=off", "workdir=/w", "upperdir=/u", "lowerdir=/l2:/l1"],
        );
        assert_eq!(
            lower_dirs(&[overlay], bundle).unwrap(),
            (vec![PathBuf::from("/l2"), PathBuf::from("/l1")], true)
        );
        let bind = mount("bind", "/snap/7/fs", &["rbind", "rw"]);
        assert_eq!(
            lower_dirs(&[bind], bundle).unwrap(),
            (vec![PathBuf::from("/snap/7/fs")], false)
        );
        let err = lower_dirs(&[mount("ext4", "/dev/dm-3", &[])], bundle).unwrap_err();
        assert!(err.to_string().contains("mount type \"ext4\""), "{err}");
        assert!(matches!(
            lower_dirs(&[mount("overlay", "overlay", &["upperdir=/u"])], bundle),
            Err(Error::NoLower)
        ));
        assert!(matches!(lower_dirs(&[], bundle), Err(Error::NoRootfs)));
        assert_ne!(fnv64(b"/l2:/l1"), fnv64(b"/l1:/l2"));
    }
}
