//! The shim's configuration: which Ember, guest kernel and guest root filesystem a sandbox
//! boots, its default size, and where state and cached layer images live. A JSON file named
//! by `EMBER_SHIM_CONFIG` (containerd passes its environment to shims), else
//! [`DEFAULT_PATH`].

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub const DEFAULT_PATH: &str = "/etc/ember/containerd-shim.json";
/// A configuration is a few hundred bytes; anything near this is not one.
const MAX_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The `ember` binary; by default the one beside the shim, else `ember` on `PATH`.
    pub ember: Option<PathBuf>,
    /// The guest kernel (the project's `vmlinux`) and root filesystem (its `rootfs.ext4`,
    /// attached read-only, so every sandbox shares it).
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    /// Kernel arguments added to the shim's own.
    #[serde(default)]
    pub boot_args: String,
    #[serde(default = "default_vcpus")]
    pub vcpu_count: u8,
    /// Guest memory when the spec sets no memory limit; with one, the limit plus
    /// `overhead_mib` (what the guest's kernel and agent need besides the containers).
    #[serde(default = "default_mem")]
    pub mem_size_mib: u32,
    #[serde(default = "default_overhead")]
    pub overhead_mib: u32,
    /// Per-sandbox state: the API and vsock sockets, the console log, writable layers.
    #[serde(default = "default_state")]
    pub state_dir: PathBuf,
    /// Read-only ext4 images of layer sets, kept across sandboxes.
    #[serde(default = "default_cache")]
    pub cache_dir: PathBuf,
    /// How many containers one sandbox can hold (each takes two of the VM's disks).
    #[serde(default = "default_slots")]
    pub slots: usize,
    /// Size of each container's writable layer (a sparse file).
    #[serde(default = "default_writable")]
    pub writable_layer_mib: u64,
    /// Start each sandbox's VM from a snapshot of a booted guest (made by the first
    /// sandbox of each VM size, kept in `cache_dir`) instead of booting Linux.
    #[serde(default)]
    pub start_from_template: bool,
    /// How long a sandbox's guest may take to boot until its agent answers.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_secs: u64,
}

fn default_vcpus() -> u8 {
    1
}
fn default_mem() -> u32 {
    256
}
fn default_overhead() -> u32 {
    64
}
fn default_state() -> PathBuf {
    PathBuf::from("/run/ember-shim")
}
fn default_cache() -> PathBuf {
    PathBuf::from("/var/lib/ember-shim")
}
fn default_slots() -> usize {
    4
}
fn default_writable() -> u64 {
    1024
}
fn default_boot_timeout() -> u64 {
    600
}

/// The longest `state_dir`: 96 bytes of vsock path, less `/`, 16 digits and `/vsock.sock`.
const MAX_STATE_DIR: usize = 96 - 1 - 16 - 11;

impl Config {
    /// The configuration this shim runs with.
    pub fn load() -> Result<Config, String> {
        let path = std::env::var_os("EMBER_SHIM_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
        Self::from_file(&path)
    }

    fn from_file(path: &Path) -> Result<Config, String> {
        let shown = path.display();
        // A FIFO, a device or a huge file is refused before anything is read.
        let text = hostfile::read_to_string(path, MAX_BYTES)
            .map_err(|e| format!("cannot read the shim configuration {shown}: {e}"))?;
        let config: Config = serde_json::from_str(&text)
            .map_err(|e| format!("the shim configuration {shown} is not valid: {e}"))?;
        if config.slots == 0 || config.slots > 12 {
            return Err(format!("{shown}: slots must be 1 to 12"));
        }
        // A sandbox's sockets are `state_dir/<16 hex digits>/vsock.sock`, and Ember takes
        // vsock paths of at most 96 bytes.
        let state_len = config.state_dir.as_os_str().len();
        if state_len > MAX_STATE_DIR {
            return Err(format!(
                "{shown}: state_dir is {state_len} bytes long; at most {MAX_STATE_DIR} leave room \
                 for a sandbox's socket paths"
            ));
        }
        Ok(config)
    }

    /// The `ember` binary to run.
    pub fn ember_binary(&self) -> PathBuf {
        if let Some(path) = &self.ember {
            return path.clone();
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("ember")));
        match beside {
            Some(path) if path.is_file() => path,
            _ => PathBuf::from("ember"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, String> {
        let dir = std::env::temp_dir().join(format!("shim-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.json", text.len()));
        std::fs::write(&path, text).unwrap();
        let config = Config::from_file(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        config
    }

    #[test]
    fn a_configuration_names_the_guest_and_gets_defaults_for_the_rest() {
        let c = load(r#"{"kernel": "/k", "rootfs": "/r"}"#).unwrap();
        assert_eq!((c.vcpu_count, c.mem_size_mib, c.slots), (1, 256, 4));
        assert_eq!(c.state_dir, Path::new("/run/ember-shim"));
        assert!(load(r#"{"kernel": "/k"}"#)
            .unwrap_err()
            .contains("missing field `rootfs`"));
        assert!(load(r#"{"kernel": "/k", "rootfs": "/r", "cpus": 2}"#)
            .unwrap_err()
            .contains("unknown field `cpus`"));
        assert!(load(r#"{"kernel": "/k", "rootfs": "/r", "slots": 0}"#)
            .unwrap_err()
            .contains("slots must be 1 to 12"));
        let long = format!(
            r#"{{"kernel": "/k", "rootfs": "/r", "state_dir": "/{}"}}"#,
            "s".repeat(68)
        );
        let err = load(&long).unwrap_err();
        assert!(
            err.contains("state_dir is 69 bytes long; at most 68"),
            "{err}"
        );
        let longest = format!(
            r#"{{"kernel": "/k", "rootfs": "/r", "state_dir": "/{}"}}"#,
            "s".repeat(67)
        );
        assert!(load(&longest).is_ok());
        let huge = format!(r#"{{"kernel": "{}", "rootfs": "/r"}}"#, "k".repeat(70_000));
        assert!(load(&huge)
            .unwrap_err()
            .contains("over the limit of 65536 bytes"));
        assert!(Config::from_file(Path::new("/"))
            .unwrap_err()
            .contains("it is a directory, not a regular file"));
        // A FIFO is refused at once (its open would wait for a writer).
        let fifo = std::env::temp_dir().join(format!("shim-config-fifo-{}", std::process::id()));
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let err = Config::from_file(&fifo).unwrap_err();
        std::fs::remove_file(&fifo).unwrap();
        assert!(err.contains("it is a FIFO, not a regular file"), "{err}");
    }
}
