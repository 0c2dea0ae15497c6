//! The microVM's cgroups: `<controller mount>/<parent>/<id>` for each controller named by a
//! `--cgroup FILE=VALUE` (v1), or one `<cgroup2 mount>/<parent>/<id>` (v2); each value
//! written, then the jailer moved in, so that the VMM and all its threads start inside.

use std::fs;
use std::path::{Path, PathBuf};

use crate::undo::Undo;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read /proc/mounts: {0}")]
    Mounts(#[source] std::io::Error),
    #[error("no cgroup v1 hierarchy with the {0} controller is mounted (see /proc/mounts)")]
    NoV1Controller(String),
    #[error("no cgroup v2 hierarchy is mounted (see /proc/mounts)")]
    NoV2,
    #[error("the cgroup v2 hierarchy at {mount} does not offer the {controller} controller (it offers: {offered})")]
    NoV2Controller {
        mount: String,
        controller: String,
        offered: String,
    },
    #[error("cannot create the cgroup {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error("the cgroup file {file} does not exist in {dir}")]
    NoFile { file: String, dir: String },
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        path: String,
        value: String,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct Plan {
    /// Each cgroup directory to make, with the settings for it.
    groups: Vec<Group>,
    version: u8,
}

#[derive(Debug, Clone)]
struct Group {
    mount: PathBuf,
    /// The path below the mount: `<parent>/<id>`.
    relative: PathBuf,
    settings: Vec<(String, String)>,
    controllers: Vec<String>,
}

impl Group {
    fn dir(&self) -> PathBuf {
        self.mount.join(&self.relative)
    }
}

/// (mount point, filesystem type, options) of every cgroup mount.
fn cgroup_mounts() -> Result<Vec<(PathBuf, String, Vec<String>)>, Error> {
    let text = fs::read_to_string("/proc/mounts").map_err(Error::Mounts)?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let fstype = *f.get(2)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| {
                let opts = f
                    .get(3)
                    .map_or(Vec::new(), |o| o.split(',').map(String::from).collect());
                (PathBuf::from(f[1]), fstype.to_string(), opts)
            })
        })
        .collect())
}

fn controller(file: &str) -> String {
    file.split('.').next().unwrap_or(file).to_string()
}

impl Plan {
    /// Where each setting goes. Fails, before anything is made, on a controller that is not
    /// mounted (v1) or not offered (v2).
    pub fn new(
        settings: &[(String, String)],
        version: u8,
        parent: &str,
        id: &str,
    ) -> Result<Self, Error> {
        let relative = Path::new(parent).join(id);
        let mounts = cgroup_mounts()?;
        let mut groups: Vec<Group> = Vec::new();
        for (file, value) in settings {
            let ctl = controller(file);
            let mount = match version {
                1 => mounts
                    .iter()
                    .find(|(_, t, o)| t == "cgroup" && o.contains(&ctl))
                    .map(|m| m.0.clone())
                    .ok_or_else(|| Error::NoV1Controller(ctl.clone()))?,
                _ => {
                    let mount = mounts
                        .iter()
                        .find(|(_, t, _)| t == "cgroup2")
                        .map(|m| m.0.clone())
                        .ok_or(Error::NoV2)?;
                    let offered =
                        fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
                    if !offered.split_whitespace().any(|c| c == ctl) {
                        return Err(Error::NoV2Controller {
                            mount: mount.display().to_string(),
                            controller: ctl,
                            offered: match offered.trim() {
                                "" => "none".into(),
                                o => o.into(),
                            },
                        });
                    }
                    mount
                }
            };
            let group = match groups.iter_mut().find(|g| g.mount == mount) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        mount,
                        relative: relative.clone(),
                        settings: Vec::new(),
                        controllers: Vec::new(),
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            group.settings.push((file.clone(), value.clone()));
            if !group.controllers.contains(&ctl) {
                group.controllers.push(ctl);
            }
        }
        Ok(Plan { groups, version })
    }

    /// The directories this plan would make that already exist (a run that left them).
    pub fn existing(&self) -> Vec<PathBuf> {
        self.groups
            .iter()
            .map(Group::dir)
            .filter(|d| d.exists())
            .collect()
    }

    /// Makes each cgroup, writes its settings and moves this process into it.
    pub fn apply(&self, undo: &mut Undo) -> Result<(), Error> {
        for group in &self.groups {
            self.make(group, undo)?;
            let dir = group.dir();
            for (file, value) in &group.settings {
                let path = dir.join(file);
                if !path.exists() {
                    return Err(Error::NoFile {
                        file: file.clone(),
                        dir: dir.display().to_string(),
                    });
                }
                write(&path, value)?;
            }
            write(&dir.join("cgroup.procs"), &std::process::id().to_string())?;
        }
        Ok(())
    }

    /// Creates the directories from the mount down, each new one recorded in `undo`.
    fn make(&self, group: &Group, undo: &mut Undo) -> Result<(), Error> {
        let mut dir = group.mount.clone();
        for part in group.relative.components() {
            if self.version == 2 {
                // Each level hands the controllers down to the one below.
                for ctl in &group.controllers {
                    write(&dir.join("cgroup.subtree_control"), &format!("+{ctl}"))?;
                }
            }
            let parent = dir.clone();
            dir.push(part);
            if dir.exists() {
                continue;
            }
            fs::create_dir(&dir).map_err(|source| Error::Create {
                path: dir.display().to_string(),
                source,
            })?;
            undo.cgroup(dir.clone(), group.mount.join("cgroup.procs"));
            if self.version == 1 && group.controllers.iter().any(|c| c == "cpuset") {
                // A v1 cpuset starts empty, and a task cannot join an empty one.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let inherited = fs::read_to_string(parent.join(file)).unwrap_or_default();
                    write(&dir.join(file), inherited.trim())?;
                }
            }
        }
        Ok(())
    }
}

fn write(path: &Path, value: &str) -> Result<(), Error> {
    fs::write(path, value).map_err(|source| Error::Write {
        path: path.display().to_string(),
        value: value.into(),
        source,
    })
}
