//! Bind mounts of host paths, made to work in the guest. containerd's CRI gives every
//! container the sandbox's `/dev/shm` (a directory) and its `/etc/hosts`, `/etc/hostname`
//! and `/etc/resolv.conf` (files) as bind mounts of host paths, which the VM cannot see: each
//! such mount's source becomes a copy in the guest (`/run/ember/host/KEY`, the agent writes
//! it), and the content goes with the create request. One host path, one key, so a pod's
//! containers that mount the same directory share one copy (its `/dev/shm`, an emptyDir).
//! Writes in the guest stay there. Text only, and bounded: the whole request is one line
//! of at most 1 MiB.

use std::path::Path;

use serde_json::{json, Value};

/// The guest's directory of copies (the agent's `protocol::HOST_PATHS`).
const GUEST_DIR: &str = "/run/ember/host";
/// The most one file may hold.
const MAX_FILE: u64 = 64 << 10;
/// The most all copies of one create may hold together, and how many files.
const MAX_TOTAL: u64 = 512 << 10;
const MAX_FILES: usize = 256;
/// How deep a directory is copied.
const MAX_DEPTH: usize = 8;

/// Points the spec's bind mounts of host paths at their guest copies; returns the copies
/// for the agent's `host_paths`.
pub fn to_guest(spec: &mut Value) -> Result<Vec<Value>, String> {
    let mut copies = Vec::new();
    let mut budget = Budget {
        bytes: MAX_TOTAL,
        files: MAX_FILES,
    };
    let Some(mounts) = spec["mounts"].as_array_mut() else {
        return Ok(copies);
    };
    for mount in mounts {
        let Some(source) = host_source(mount) else {
            continue;
        };
        let key = format!("{:016x}", crate::shim::name_hash("host", &source));
        let path = Path::new(&source);
        let shown = |e: String| format!("cannot copy the mount source {source} into the VM: {e}");
        let meta = std::fs::metadata(path).map_err(|e| shown(e.to_string()))?;
        let copy = if meta.is_dir() {
            let mut files = Vec::new();
            walk(path, "", 0, &mut budget, &mut files).map_err(shown)?;
            json!({"key": key, "dir": files})
        } else {
            json!({"key": key, "file": read(path, &mut budget).map_err(shown)?})
        };
        mount["source"] = json!(format!("{GUEST_DIR}/{key}"));
        copies.push(copy);
    }
    Ok(copies)
}

/// The host path a mount binds, if it is a bind mount of an absolute path.
fn host_source(mount: &Value) -> Option<String> {
    let options = mount["options"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let bind = mount["type"] == "bind"
        || options
            .iter()
            .any(|o| o.as_str().is_some_and(|o| o == "bind" || o == "rbind"));
    let source = mount["source"].as_str()?;
    (bind && source.starts_with('/')).then(|| source.to_string())
}

struct Budget {
    bytes: u64,
    files: usize,
}

/// A regular file's text, charged to the budget.
fn read(path: &Path, budget: &mut Budget) -> Result<String, String> {
    if budget.files == 0 {
        return Err(format!("more than {MAX_FILES} files"));
    }
    let limit = MAX_FILE.min(budget.bytes);
    let text = hostfile::read_to_string(path, limit).map_err(|e| e.to_string())?;
    budget.bytes -= text.len() as u64;
    budget.files -= 1;
    Ok(text)
}

/// Every regular file under `dir` (following links, as a bind mount would), as a path
/// relative to the top and its text.
fn walk(
    dir: &Path,
    prefix: &str,
    depth: usize,
    budget: &mut Budget,
    files: &mut Vec<(String, String)>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{} is more than {MAX_DEPTH} levels deep",
            dir.display()
        ));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| format!("{:?} is not a UTF-8 name", entry.path()))?;
        let relative = format!("{prefix}{name}");
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.is_dir() {
            walk(&path, &format!("{relative}/"), depth + 1, budget, files)?;
        } else {
            let text = read(&path, budget).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push((relative, text));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("host-mounts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn cri_host_files_and_the_pods_shm_become_guest_copies() {
        let dir = scratch("cri");
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
        let shm = dir.join("shm");
        std::fs::create_dir(&shm).unwrap();
        let volume = dir.join("volume");
        std::fs::create_dir_all(volume.join("..data")).unwrap();
        std::fs::write(volume.join("..data/token"), "secret").unwrap();
        std::os::unix::fs::symlink("..data/token", volume.join("token")).unwrap();
        let mut spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/etc/hosts", "type": "bind", "source": hosts, "options": ["rbind", "rw"]},
            {"destination": "/dev/shm", "type": "bind", "source": shm, "options": ["rbind", "ro"]},
            {"destination": "/var/run/secrets", "source": volume, "options": ["bind"]},
        ]});
        let copies = to_guest(&mut spec).unwrap();
        assert_eq!(copies.len(), 3);
        assert_eq!(spec["mounts"][0]["source"], "proc");
        for (i, copy) in copies.iter().enumerate() {
            let key = copy["key"].as_str().unwrap();
            assert_eq!(key.len(), 16);
            assert_eq!(
                spec["mounts"][i + 1]["source"],
                format!("/run/ember/host/{key}")
            );
        }
        assert_eq!(copies[0]["file"], "127.0.0.1 localhost\n");
        assert_eq!(copies[1]["dir"], json!([]));
        let mut volume_files: Vec<_> = copies[2]["dir"].as_array().unwrap().clone();
        volume_files.sort_by_key(|f| f[0].as_str().unwrap().to_string());
        assert_eq!(
            volume_files,
            vec![
                json!(["..data/token", "secret"]),
                json!(["token", "secret"])
            ]
        );
        // The same host path, the same key (a pod's containers share its copy).
        let mut again =
            json!({"mounts": [{"destination": "/dev/shm", "type": "bind", "source": shm}]});
        let copy = to_guest(&mut again).unwrap();
        assert_eq!(copy[0]["key"], copies[1]["key"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_cannot_be_copied_is_refused_by_name() {
        let dir = scratch("refused");
        let big = dir.join("big");
        std::fs::write(&big, vec![b'x'; (MAX_FILE + 1) as usize]).unwrap();
        let mut spec = json!({"mounts": [{"destination": "/big", "type": "bind", "source": big}]});
        let err = to_guest(&mut spec).unwrap_err();
        assert!(
            err.contains("cannot copy the mount source") && err.contains("big"),
            "{err}"
        );
        let mut spec = json!({"mounts": [{"destination": "/x", "type": "bind", "source": dir.join("missing")}]});
        assert!(to_guest(&mut spec).unwrap_err().contains("missing"));
        let deep = (0..=MAX_DEPTH + 1).fold(dir.join("deep"), |p, i| p.join(i.to_string()));
        std::fs::create_dir_all(&deep).unwrap();
        let mut spec =
            json!({"mounts": [{"destination": "/d", "type": "bind", "source": dir.join("deep")}]});
        assert!(to_guest(&mut spec).unwrap_err().contains("levels deep"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
