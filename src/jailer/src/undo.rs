//! What the jailer made, undone in reverse if it fails before the VMM starts, so that a
//! failed run leaves no half-made jail and no cgroup behind.

use std::path::PathBuf;

#[derive(Debug)]
enum Made {
    /// A directory tree the jailer created (removed whole).
    Tree(PathBuf),
    /// A directory the jailer created that others may share (removed only if empty).
    EmptyDir(PathBuf),
    /// A cgroup directory (removed with rmdir, after the jailer left it).
    Cgroup { dir: PathBuf, leave_to: PathBuf },
}

#[derive(Debug, Default)]
pub struct Undo {
    made: Vec<Made>,
}

impl Undo {
    pub fn tree(&mut self, dir: PathBuf) {
        self.made.push(Made::Tree(dir));
    }

    pub fn empty_dir(&mut self, dir: PathBuf) {
        self.made.push(Made::EmptyDir(dir));
    }

    /// A cgroup directory; `leave_to` is the `cgroup.procs` the jailer moves itself back to
    /// before removing it (a cgroup with a process in it cannot be removed).
    pub fn cgroup(&mut self, dir: PathBuf, leave_to: PathBuf) {
        self.made.push(Made::Cgroup { dir, leave_to });
    }

    /// Keeps everything: the VMM is about to start in it.
    pub fn keep(&mut self) {
        self.made.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for made in self.made.drain(..).rev() {
            match made {
                Made::Tree(dir) => {
                    let _ = std::fs::remove_dir_all(dir);
                }
                Made::EmptyDir(dir) => {
                    let _ = std::fs::remove_dir(dir);
                }
                Made::Cgroup { dir, leave_to } => {
                    let _ = std::fs::write(leave_to, std::process::id().to_string());
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }
}
