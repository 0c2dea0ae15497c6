//! Host files and directories that a container's bind mounts name, copied into the guest's
//! `/run` (a tmpfs) before crun runs: the VM shares no filesystem with the host. A file is
//! written again at each create; a directory is filled once, by the first container of the
//! pod that mounts it, and shared by the rest (a pod's `/dev/shm`, an emptyDir volume).

use std::path::{Component, Path, PathBuf};

use super::protocol::{HostPath, HOST_PATHS};

/// Files one directory may bring in.
const MAX_FILES: usize = 256;

/// Writes every host path in place, or says which one it could not.
pub fn write_all(paths: &[HostPath]) -> Result<(), String> {
    for path in paths {
        write(path).map_err(|e| format!("host path {}: {e}", path.key))?;
    }
    Ok(())
}

fn write(path: &HostPath) -> Result<(), String> {
    if path.key.len() != 16 || !path.key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the key is not 16 hex digits".into());
    }
    let target = PathBuf::from(HostPath::guest_path(&path.key));
    let made = || std::fs::create_dir_all(HOST_PATHS).map_err(|e| e.to_string());
    match (&path.file, &path.dir) {
        (Some(text), None) => made().and_then(|()| replace(&target, text)),
        (None, Some(files)) => made().and_then(|()| fill(&target, files)),
        _ => Err("give either a file or a directory".into()),
    }
}

/// Writes a file beside `target` and renames it into place, so that a container reading it
/// sees the old text or the new, never half of one.
fn replace(target: &Path, text: &str) -> Result<(), String> {
    let staged = target.with_extension("new");
    std::fs::write(&staged, text).map_err(|e| e.to_string())?;
    std::fs::rename(&staged, target).map_err(|e| e.to_string())
}

fn fill(target: &Path, files: &[(String, String)]) -> Result<(), String> {
    if files.len() > MAX_FILES {
        return Err(format!("{} files; at most {MAX_FILES}", files.len()));
    }
    for (name, _) in files {
        relative(name)?;
    }
    match std::fs::create_dir(target) {
        Ok(()) => {}
        // Another container of the pod made it: share what is there.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    for (name, text) in files {
        let file = target.join(name);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&file, text).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// A path that stays inside the directory: relative, only plain names.
fn relative(name: &str) -> Result<(), String> {
    let path = Path::new(name);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    match plain && !name.is_empty() {
        true => Ok(()),
        false => Err(format!("{name:?} is not a plain relative path")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_name_a_directorys_files() {
        for good in ["a", "a/b", "..data/token"] {
            assert!(relative(good).is_ok(), "{good}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a"] {
            assert!(relative(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_key_or_shape_is_refused_before_anything_is_written() {
        let path = |key: &str, file: Option<&str>, dir: Option<Vec<(String, String)>>| HostPath {
            key: key.into(),
            file: file.map(str::to_string),
            dir,
        };
        let err = write(&path("../../etc/passwd", Some("x"), None)).unwrap_err();
        assert!(err.contains("16 hex digits"), "{err}");
        let err = write(&path("0123456789abcdeg", Some("x"), None)).unwrap_err();
        assert!(err.contains("16 hex digits"), "{err}");
        let err = write(&path("0123456789abcdef", None, None)).unwrap_err();
        assert!(err.contains("either a file or a directory"), "{err}");
    }
}
