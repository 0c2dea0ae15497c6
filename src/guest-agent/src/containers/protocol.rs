//! The container protocol, version 1 (docs/containers.md): each vsock connection carries one
//! request, a JSON object on one line of at most [`MAX_REQUEST`] bytes, and gets one answer
//! line, `{"ok": {...}}` or `{"error": "<sentence>"}`. A `stdio` request's connection then
//! carries that stream's bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The version this agent speaks; a request names the one it was written for.
pub const VERSION: u32 = 1;
/// Longest request line: an OCI spec is a few KiB, a large one tens.
pub const MAX_REQUEST: usize = 1 << 20;

/// Reads a request line: the version first (`v`), then the operation it names (`op`) with
/// its fields, unknown ones refused.
pub fn parse(line: &str) -> Result<Op, String> {
    let mut value: Value =
        serde_json::from_str(line).map_err(|e| format!("the request is not JSON: {e}"))?;
    let object = value
        .as_object_mut()
        .ok_or("the request is not a JSON object")?;
    match object.remove("v").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => {
            return Err(format!(
                "protocol version {v} is not spoken here (this agent speaks {VERSION})"
            ))
        }
        None => return Err("the request has no protocol version (\"v\": 1)".into()),
    }
    serde_json::from_value(value).map_err(|e| format!("bad request: {e}"))
}

/// A block device the VM has: a path (`/dev/vdb`) or, without a leading `/`, the ID of a
/// virtio disk (its serial, which Ember sets to the drive's `drive_id`). With `size`, the
/// agent first waits until the device has that many bytes: a drive the host has just
/// pointed at another file (`PATCH /drives`) reaches its new size a moment later.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub device: String,
    pub fstype: String,
    #[serde(default)]
    pub options: Vec<String>,
    pub size: Option<u64>,
}

/// Where a container's root filesystem comes from: one disk, or (with `writable`) a
/// read-only image of its layers under an overlay whose upper layer is a writable disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rootfs {
    pub device: String,
    pub fstype: String,
    #[serde(default)]
    pub options: Vec<String>,
    pub size: Option<u64>,
    pub writable: Option<Disk>,
}

/// A host path a container mounts (containerd's `/etc/hosts`, `/etc/resolv.conf`,
/// `/etc/hostname`, the pod's `/dev/shm`, a volume's directory), as the guest gets it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPath {
    /// 16 hex digits: the same host path has the same key, so a pod's containers that mount
    /// it share one copy.
    pub key: String,
    /// A file's text, written again at every create (containerd may have rewritten it).
    pub file: Option<String>,
    /// A directory's files (paths relative to it) and their text, written when the first
    /// container that mounts it is created; later ones share what is there.
    pub dir: Option<Vec<(String, String)>>,
}

/// Where host paths live in the guest: a tmpfs (the agent mounts one on /run).
pub const HOST_PATHS: &str = "/run/ember/host";

impl HostPath {
    pub fn guest_path(key: &str) -> String {
        format!("{HOST_PATHS}/{key}")
    }
}

impl Rootfs {
    /// The disk named at the top level.
    pub fn disk(&self) -> Disk {
        Disk {
            device: self.device.clone(),
            fstype: self.fstype.clone(),
            options: self.options.clone(),
            size: self.size,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdin,
    Stdout,
    Stderr,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// The agent's version and the OCI runtime it drives. (A struct variant: serde lets a
    /// unit variant of a tagged enum carry any fields.)
    Ping {},
    /// Mounts the root filesystem and creates the container from an OCI runtime spec
    /// (`config.json`'s content); its init waits for `start`.
    Create {
        id: String,
        spec: Value,
        rootfs: Rootfs,
        /// Host files and directories the spec's bind mounts name, copied in: the shim has
        /// pointed those mounts at [`HostPath::guest_path`].
        #[serde(default)]
        host_paths: Vec<HostPath>,
    },
    /// Registers a process (an OCI `process` object) to run in a created container.
    Exec {
        id: String,
        exec_id: String,
        process: Value,
    },
    /// Starts the init, or an exec registered before.
    Start {
        id: String,
        exec_id: Option<String>,
    },
    /// Answers once the process has exited, with its status.
    Wait {
        id: String,
        exec_id: Option<String>,
    },
    State {
        id: String,
        exec_id: Option<String>,
    },
    /// Signals the process (`all`: every process of the container).
    Kill {
        id: String,
        exec_id: Option<String>,
        signal: i32,
        #[serde(default)]
        all: bool,
    },
    /// The rest of the connection is the process's `stream`.
    Stdio {
        id: String,
        exec_id: Option<String>,
        stream: Stream,
    },
    /// The process's terminal size.
    Resize {
        id: String,
        exec_id: Option<String>,
        width: u16,
        height: u16,
    },
    /// Ends the process's standard input.
    CloseStdin {
        id: String,
        exec_id: Option<String>,
    },
    /// Gives the VM's `interface` the sandbox's address (`10.88.0.5/16`), default route,
    /// MTU and MAC: what CNI gave the sandbox's network namespace on the host.
    Network {
        interface: String,
        address: String,
        gateway: Option<String>,
        mtu: Option<u32>,
        /// The MAC address `interface` takes (the CNI interface's).
        mac: Option<String>,
    },
    /// The container's resource use, from its cgroup (`stats.rs`).
    Stats {
        id: String,
    },
    /// Forgets an exited exec, or removes the container (killing what runs in it).
    Delete {
        id: String,
        exec_id: Option<String>,
    },
}

/// Which process of a container: its init (no `exec_id`) or one of its execs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub id: String,
    pub exec_id: Option<String>,
}

impl Op {
    /// The process the request is about, if it names one.
    pub fn target(&self) -> Option<Target> {
        let (id, exec_id) = match self {
            Op::Ping {} | Op::Network { .. } => return None,
            Op::Create { id, .. } | Op::Stats { id } => (id, None),
            Op::Exec { id, exec_id, .. } => (id, Some(exec_id)),
            Op::Start { id, exec_id }
            | Op::Wait { id, exec_id }
            | Op::State { id, exec_id }
            | Op::Kill { id, exec_id, .. }
            | Op::Stdio { id, exec_id, .. }
            | Op::Resize { id, exec_id, .. }
            | Op::CloseStdin { id, exec_id }
            | Op::Delete { id, exec_id } => (id, exec_id.as_ref()),
        };
        Some(Target {
            id: id.clone(),
            exec_id: exec_id.cloned(),
        })
    }
}

/// A process's state, as containerd names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Created,
    Running,
    Stopped,
}

#[derive(Debug, Clone, Serialize)]
pub struct StateReply {
    pub status: Status,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
}

/// IDs name directories and runtime state: letters, digits, `_`, `-` and `.`, 1 to 64, not
/// starting with a dot.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_by_version_and_unknown_fields_refused() {
        assert!(matches!(parse(r#"{"v":1,"op":"ping"}"#), Ok(Op::Ping {})));
        let refused = |line: &str| parse(line).unwrap_err();
        assert!(refused(r#"{"v":1,"op":"ping","extra":1}"#).contains("unknown field"));
        assert!(refused(r#"{"op":"ping"}"#).contains("no protocol version"));
        assert!(refused(r#"{"v":2,"op":"ping"}"#).contains("version 2 is not spoken"));
        assert!(refused(r#"{"v":1,"op":"fly"}"#).contains("unknown variant"));
        assert!(refused(r#"{"v":1,"op":"start","id":"a","exec":"b"}"#).contains("unknown field"));
        assert!(refused("[1]").contains("not a JSON object"));
        let start = parse(r#"{"v":1,"op":"start","id":"a","exec_id":"b"}"#).unwrap();
        let target = start.target().unwrap();
        assert_eq!(
            (target.id.as_str(), target.exec_id.as_deref()),
            ("a", Some("b"))
        );
    }

    #[test]
    fn ids_are_names_not_paths() {
        for good in ["a", "ctr-1.2_x", &"x".repeat(64)] {
            assert!(valid_id(good), "{good}");
        }
        for bad in ["", ".hidden", "../x", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
