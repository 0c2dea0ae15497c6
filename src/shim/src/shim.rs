//! The shim's lifecycle as containerd drives it: `start` (one shim, and one VM, per
//! sandbox), serving the task service, and `delete` after a shim died.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use containerd_shim::api::DeleteResponse;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::{Config as ShimConfig, ExitSignal, Flags, StartOpts};

use crate::config::Config;
use crate::events::{timestamp, Events};
use crate::sandbox;
use crate::task::Service;

/// The annotation by which CRI (and `ctr run --annotation`) puts containers in one sandbox.
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// The largest `config.json` read.
pub const MAX_SPEC: u64 = 4 << 20;

pub struct EmberShim {
    namespace: String,
    id: String,
    /// The socket this shim serves on (`unix:///run/containerd/s/...`), when serving.
    socket: String,
    exit: Arc<ExitSignal>,
}

impl std::fmt::Debug for EmberShim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmberShim")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The OCI spec in `bundle`.
pub fn read_spec(bundle: &Path) -> Result<serde_json::Value, String> {
    let path = bundle.join("config.json");
    let text = hostfile::read_to_string(&path, MAX_SPEC)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not an OCI spec: {e}", path.display()))
}

/// Which sandbox a container belongs to: its sandbox annotation, else its own ID.
pub fn grouping(spec: &serde_json::Value, id: &str) -> String {
    spec["annotations"][SANDBOX_ID]
        .as_str()
        .filter(|s| !s.is_empty() && !s.contains('/') && !s.starts_with('.'))
        .unwrap_or(id)
        .to_string()
}

/// Where a sandbox's state lives: `state_dir` and 16 hex digits of a hash of its namespace
/// and ID. CRI's IDs are 64 characters, and the sandbox's sockets must still fit in a
/// socket address (Ember takes vsock paths of up to 96 bytes); nor can any namespace or ID
/// name a path outside `state_dir`.
pub fn sandbox_dir(config: &Config, namespace: &str, grouping: &str) -> PathBuf {
    config
        .state_dir
        .join(format!("{:016x}", name_hash(namespace, grouping)))
}

/// FNV-1a (64 bits) of two names with a NUL (which neither holds) between them, such as a
/// namespace and an ID: the same in every build, so a later shim's `delete` finds the
/// directory an earlier one made.
pub fn name_hash(namespace: &str, id: &str) -> u64 {
    let bytes = namespace.bytes().chain([0]).chain(id.bytes());
    bytes.fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl containerd_shim::Shim for EmberShim {
    type T = Service;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut ShimConfig) -> Self {
        EmberShim {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            socket: args.socket.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> Result<String, containerd_shim::Error> {
        let spec = read_spec(Path::new(".")).unwrap_or_default();
        let group = grouping(&spec, &opts.id);
        let (_, address) = containerd_shim::spawn(opts, &group, Vec::new())?;
        Ok(address)
    }

    fn delete_shim(&mut self) -> Result<DeleteResponse, containerd_shim::Error> {
        // The shim that ran this container is gone, and its VM with it (or it is ended
        // now): nothing of the sandbox is left behind.
        if let Ok(config) = Config::load() {
            let spec = read_spec(Path::new(".")).unwrap_or_default();
            let dir = sandbox_dir(&config, &self.namespace, &grouping(&spec, &self.id));
            if sandbox::clean_up(&dir) {
                if let Some(netns) = crate::network::netns_of(&spec) {
                    crate::network::tear_down(&netns);
                }
            }
        }
        Ok(DeleteResponse {
            exit_status: 128 + libc::SIGKILL as u32,
            exited_at: MessageField::some(timestamp(SystemTime::now())),
            ..Default::default()
        })
    }

    fn wait(&mut self) {
        self.exit.wait();
        // The shim library removes the socket it finds named in the first container's
        // bundle; under CRI that bundle (the pod sandbox's) is gone by the time the pod's
        // shim shuts down, and every pod left its socket behind. The shim removes its own.
        remove_socket(&self.socket);
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        Service::new(
            &self.namespace,
            Events::new(&self.namespace, publisher),
            self.exit.clone(),
        )
    }
}

/// Removes the socket file an address names (`unix://PATH`), if it is one.
fn remove_socket(address: &str) {
    use std::os::unix::fs::FileTypeExt;
    let Some(path) = address.strip_prefix("unix://") else {
        return;
    };
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket {
        if let Err(e) = std::fs::remove_file(path) {
            log::warn!("cannot remove the shim's socket {path}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandbox_directories_are_short_and_inside_the_state_directory() {
        let config: Config = serde_json::from_value(json!({
            "kernel": "/k", "rootfs": "/r", "state_dir": "/run/ember-shim"}))
        .unwrap();
        let cri_id = "a".repeat(64);
        let dir = sandbox_dir(&config, "k8s.io", &cri_id);
        assert_eq!(dir.parent(), Some(Path::new("/run/ember-shim")));
        assert_eq!(dir.file_name().unwrap().len(), 16);
        for (ns, id) in [("..", "x"), ("../victim", "sub"), ("k8s.io", "../../etc")] {
            let dir = sandbox_dir(&config, ns, id);
            assert_eq!(
                dir.parent(),
                Some(Path::new("/run/ember-shim")),
                "{ns} {id}"
            );
        }
        // Distinct names, distinct directories; the same names, the same one.
        assert_ne!(
            sandbox_dir(&config, "a", "bc"),
            sandbox_dir(&config, "ab", "c")
        );
        assert_eq!(sandbox_dir(&config, "k8s.io", &cri_id), dir);
        // FNV-1a's published value for the one byte 0 (empty namespace and ID).
        assert_eq!(name_hash("", ""), 0xaf63_bd4c_8601_b7df);
    }

    #[test]
    fn the_shim_removes_its_own_socket_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("shim-socket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, "x").unwrap();
        remove_socket(&format!("unix://{}", file.display()));
        remove_socket(file.to_str().unwrap());
        assert!(file.exists(), "a regular file is not a socket");
        remove_socket(&format!("unix://{}", sock.display()));
        assert!(!sock.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn containers_share_a_vm_only_when_their_sandbox_annotation_says_so() {
        let pod = json!({"annotations": {SANDBOX_ID: "pod1"}});
        assert_eq!(grouping(&pod, "c1"), "pod1");
        assert_eq!(grouping(&json!({}), "c1"), "c1");
        for bad in ["", "../x", ".hidden"] {
            let spec = json!({"annotations": {SANDBOX_ID: bad}});
            assert_eq!(grouping(&spec, "c1"), "c1", "{bad:?}");
        }
    }
}
