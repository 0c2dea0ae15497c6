//! The jail directory: `<chroot-base>/<exec name>/<id>/root`, holding the VMM binary, the
//! device nodes it needs and nothing else; then the mount namespace whose root it becomes.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sys;
use crate::undo::Undo;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a jail for this id is in use: {dir} belongs to process {pid}, which is still running; pick another --id")]
    InUse { dir: String, pid: u32 },
    #[error("a jail for this id was left behind by an earlier run at {dir} ({why}); remove that directory{cgroups} before using the id again")]
    LeftBehind {
        dir: String,
        why: String,
        cgroups: String,
    },
    #[error("cannot create {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot copy the exec file {from} to {to}: {source}")]
    Copy {
        from: String,
        to: String,
        source: std::io::Error,
    },
    #[error("cannot make the device node {path}: {source}")]
    Node {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot give {path} to the VMM's uid and gid: {source}")]
    Chown {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot enter the jail ({step}): {source}")]
    Enter {
        step: &'static str,
        source: std::io::Error,
    },
    #[error("cannot write the pid file {path}: {source}")]
    PidFile {
        path: String,
        source: std::io::Error,
    },
}

/// Device nodes made in every jail: (path inside it, major, minor).
const NODES: [(&str, u32, u32); 3] = [
    ("dev/kvm", 10, 232),
    ("dev/net/tun", 10, 200),
    ("dev/urandom", 1, 9),
];

#[derive(Debug)]
pub struct Jail {
    /// `<chroot-base>/<exec name>/<id>`: everything the jailer makes for this id.
    pub dir: PathBuf,
    /// `<dir>/root`, the VMM's `/`.
    pub root: PathBuf,
    pub exec_name: String,
    pub id: String,
}

fn create_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Create {
        path: path.display().to_string(),
        source,
    }
}

impl Jail {
    pub fn new(base: &Path, exec_name: &str, id: &str) -> Self {
        let dir = base.join(exec_name).join(id);
        Jail {
            root: dir.join("root"),
            dir,
            exec_name: exec_name.into(),
            id: id.into(),
        }
    }

    /// The pid file inside the jail, `<exec name>.pid` (Firecracker's name).
    pub fn pid_file(&self) -> PathBuf {
        self.root.join(format!("{}.pid", self.exec_name))
    }

    /// Refuses an id whose jail exists, saying whether its VMM still runs. Firecracker
    /// reuses such a directory; Ember does not, since a VMM that ran there may have been
    /// compromised and left anything in it. `cgroups` lists this id's cgroups still present.
    pub fn check_unused(&self, cgroups: &[PathBuf]) -> Result<(), Error> {
        if !self.dir.exists() && cgroups.is_empty() {
            return Ok(());
        }
        let dir = self.dir.display().to_string();
        // The file is the VMM's to overwrite: read it as untrusted text.
        let pid = fs::read_to_string(self.pid_file())
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|&p| p > 0);
        // Still running: that pid runs this jail's VMM, as the jailer started it.
        let id_arg = format!("--id={}", self.id);
        let argv0 = format!("/{}", self.exec_name);
        let running = pid.filter(|p| {
            let cmdline = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let mut args = cmdline.split(|b| *b == 0);
            args.next() == Some(argv0.as_bytes()) && args.any(|a| a == id_arg.as_bytes())
        });
        if let Some(pid) = running {
            return Err(Error::InUse { dir, pid });
        }
        let why = match (self.dir.exists(), pid) {
            (false, _) => "the directory is gone but its cgroups are not".to_string(),
            (true, Some(p)) => format!("its process {p} is no longer running"),
            (true, None) => "no process started in it".to_string(),
        };
        let cgroups = match cgroups {
            [] => String::new(),
            list => {
                let names: Vec<String> = list.iter().map(|p| p.display().to_string()).collect();
                format!(" and the cgroups {} (rmdir)", names.join(", "))
            }
        };
        Err(Error::LeftBehind { dir, why, cgroups })
    }

    /// Creates the directories (recording in `undo` those it made), the VMM binary (a hard link where the filesystem allows, else a copy) and the device
    /// nodes, and gives the root, `/run` and the nodes to `uid`:`gid`.
    pub fn build(
        &self,
        exec_file: &Path,
        uid: u32,
        gid: u32,
        undo: &mut Undo,
    ) -> Result<(), Error> {
        let mkdir = |dir: &Path| {
            DirBuilder::new()
                .mode(0o755)
                .create(dir)
                .map_err(create_err(dir))
        };
        // The parents (which other ids share) one at a time, each removed on failure only if
        // it is empty by then. The id's own directory is made without `recursive`, so of two
        // jailers racing for one id the second fails here and removes nothing of the first's.
        let parents: Vec<&Path> = self.dir.ancestors().skip(1).collect();
        for parent in parents.into_iter().rev() {
            if !parent.exists() {
                mkdir(parent)?;
                undo.empty_dir(parent.to_path_buf());
            }
        }
        mkdir(&self.dir)?;
        undo.tree(self.dir.clone());
        mkdir(&self.root)?;

        let target = self.root.join(&self.exec_name);
        if fs::hard_link(exec_file, &target).is_err() {
            fs::copy(exec_file, &target).map_err(|source| Error::Copy {
                from: exec_file.display().to_string(),
                to: target.display().to_string(),
                source,
            })?;
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
                .map_err(create_err(&target))?;
        }

        for dir in ["dev/net", "run"] {
            let path = self.root.join(dir);
            DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&path)
                .map_err(create_err(&path))?;
        }
        for (node, major, minor) in NODES {
            let path = self.root.join(node);
            sys::mknod_char(&path, 0o600, major, minor).map_err(|source| Error::Node {
                path: path.display().to_string(),
                source,
            })?;
        }
        let owned = [".", "run"].into_iter().chain(NODES.iter().map(|n| n.0));
        for rel in owned {
            let path = self.root.join(rel);
            sys::lchown(&path, uid, gid).map_err(|source| Error::Chown {
                path: path.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// Moves this process into a mount namespace of its own whose root is the jail; the host's
    /// filesystem is unmounted from it.
    pub fn enter(&self) -> Result<(), Error> {
        let step = |step: &'static str| move |source| Error::Enter { step, source };
        sys::unshare(libc::CLONE_NEWNS).map_err(step("unshare the mount namespace"))?;
        // Mounts here and on the host stop propagating either way.
        sys::mount(None, Path::new("/"), libc::MS_PRIVATE | libc::MS_REC)
            .map_err(step("make the mounts private"))?;
        sys::mount(Some(&self.root), &self.root, libc::MS_BIND | libc::MS_REC)
            .map_err(step("bind the jail onto itself"))?;
        std::env::set_current_dir(&self.root).map_err(step("enter the jail directory"))?;
        let old = Path::new("old_root");
        fs::create_dir(old).map_err(step("make old_root"))?;
        sys::pivot_root(Path::new("."), old).map_err(step("pivot_root"))?;
        sys::umount_detach(old).map_err(step("unmount the host's root"))?;
        fs::remove_dir(old).map_err(step("remove old_root"))?;
        sys::chroot(Path::new(".")).map_err(step("chroot"))?;
        std::env::set_current_dir("/").map_err(step("chdir /"))?;
        Ok(())
    }

    /// Writes `pid` to the pid file; called inside the jail, where it is `/<exec name>.pid`.
    pub fn write_pid_inside(&self, pid: u32) -> Result<(), Error> {
        let path = PathBuf::from(format!("/{}.pid", self.exec_name));
        fs::write(&path, format!("{pid}\n")).map_err(|source| Error::PidFile {
            path: path.display().to_string(),
            source,
        })
    }
}
