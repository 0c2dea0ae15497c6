//! Fast start: a snapshot of a booted guest whose agent waits, made once per guest (kernel,
//! root filesystem, Ember) and VM size, from which each sandbox's VM is restored with its
//! own vsock socket and disks instead of booting Linux again.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::layers::fnv64;
use crate::sandbox::{Error, Sandbox};
use crate::sys::flock;

/// What a template's guest depends on: the files it was booted from (by path, size and
/// modification time) and the VM's shape.
fn key(config: &Config, mem_size_mib: u32) -> u64 {
    let stamp = |path: &Path| match std::fs::metadata(path) {
        Ok(m) => format!(
            "{}:{}:{}",
            path.display(),
            m.len(),
            m.mtime_nsec() + m.mtime() * 1_000_000_000
        ),
        Err(_) => path.display().to_string(),
    };
    let which = format!(
        "{}|{}|{}|{}|{}|{}|{}",
        stamp(&config.kernel),
        stamp(&config.rootfs),
        stamp(&config.ember_binary()),
        config.vcpu_count,
        mem_size_mib,
        config.slots,
        config.boot_args
    );
    fnv64(which.as_bytes())
}

/// The template for this guest and size, made now (a cold boot) if there is none yet. With
/// `netns` (a CNI sandbox's namespace, holding its TAP), the template has a NIC on that TAP
/// (made there, by name; each sandbox restored from it runs in its own namespace, whose TAP
/// has the same name).
pub fn ensure(config: &Config, mem_size_mib: u32, netns: Option<&Path>) -> Result<PathBuf, Error> {
    let root = config.cache_dir.join("templates");
    std::fs::create_dir_all(&root).map_err(|e| Error::Dir(root.clone(), e))?;
    let nic = if netns.is_some() { "-nic" } else { "" };
    let name = format!("{:016x}-{mem_size_mib}m{nic}", key(config, mem_size_mib));
    let dir = root.join(&name);
    // One shim makes it; the others wait for it.
    let lock =
        File::create(root.join(format!("{name}.lock"))).map_err(|e| Error::Dir(root.clone(), e))?;
    flock(&lock);
    if dir.join("done").exists() {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let start = std::time::Instant::now();
    let vm = Sandbox::boot(config, dir.clone(), mem_size_mib, netns)?;
    let booted = start.elapsed();
    let made = vm.snapshot();
    vm.kill();
    log::info!(
        "template {name}: booted in {booted:?}, snapshot written at {:?}",
        start.elapsed()
    );
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    for gone in ["api.sock", "vsock.sock", "ember.pid"] {
        let _ = std::fs::remove_file(dir.join(gone));
    }
    std::fs::write(dir.join("done"), b"").map_err(|e| Error::Dir(dir.clone(), e))?;
    log::info!("made the sandbox template {}", dir.display());
    Ok(dir)
}
