//! The jailer's command line, with Firecracker's flags; everything after `--` goes to the VMM.
//! Each value is checked here, before anything is created, so that bad input leaves nothing.

use std::path::{Path, PathBuf};

pub const USAGE: &str = "\
jailer: run one ember process in a jail (chroot, namespaces, cgroups, resource limits, an
unprivileged uid/gid), with Firecracker's jailer flags

Usage: jailer --id <ID> --exec-file <PATH> --uid <UID> --gid <GID> [OPTIONS] [-- VMM ARGS]

Options:
  --id <ID>                 MicroVM id: letters, digits and '-', at most 64
  --exec-file <PATH>        Absolute path of the (statically linked) VMM binary
  --uid <UID>, --gid <GID>  The user and group the VMM runs as (numbers, or names known to the host)
  --chroot-base-dir <DIR>   Where jails are made [default: /srv/jailer]
  --netns <PATH>            Join this network namespace (e.g. /var/run/netns/NAME)
  --daemonize               Start a new session; standard streams to /dev/null
  --new-pid-ns              Run the VMM as pid 1 of a new pid namespace
  --cgroup <FILE=VALUE>     Write VALUE to the microVM's cgroup FILE (repeatable)
  --cgroup-version <1|2>    The cgroup hierarchy to use [default: 1]
  --parent-cgroup <PATH>    The cgroup under which the microVM's is made [default: the exec file's name]
  --resource-limit <R=N>    fsize=BYTES or no-file=N (repeatable) [default: no-file=2048]
  --version, --help

The jail is <chroot-base-dir>/<exec file name>/<id>/root; paths given to the VMM are inside it.
";

/// Limits applied with setrlimit before exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// RLIMIT_FSIZE: the largest file the VMM may write.
    Fsize,
    /// RLIMIT_NOFILE: one more than the highest descriptor number.
    NoFile,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub id: String,
    pub exec_file: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub chroot_base: PathBuf,
    pub netns: Option<PathBuf>,
    pub daemonize: bool,
    pub new_pid_ns: bool,
    pub cgroups: Vec<(String, String)>,
    pub cgroup_version: u8,
    pub parent_cgroup: Option<String>,
    pub limits: Vec<(Resource, u64)>,
    pub vmm_args: Vec<String>,
}

impl Args {
    /// The exec file's name: the jail's middle directory and the binary's name inside it.
    pub fn exec_name(&self) -> String {
        self.exec_file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

pub type Command = flags::Command<Args>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(transparent)]
    Flags(#[from] flags::Error),
    #[error("missing argument {0}")]
    Required(&'static str),
    #[error("invalid --id {0:?}: use 1 to 64 letters, digits and '-'")]
    Id(String),
    #[error("--exec-file must be an absolute path, not {0:?}")]
    RelativeExec(String),
    #[error("the exec file {0} does not exist")]
    NoExec(String),
    #[error("the exec file {0} is not a regular file")]
    ExecNotFile(String),
    #[error("the exec file {path} is not an x86_64 ELF executable: {reason}")]
    NotElf { path: String, reason: String },
    #[error("the exec file {path} is dynamically linked (it needs {interp}), which does not exist inside the jail; build it statically (scripts/build-static)")]
    Dynamic { path: String, interp: String },
    #[error("the exec file {0} cannot be read: {1}")]
    ReadExec(String, String),
    #[error("{flag} {value:?} is neither a number nor a {kind} known to this host")]
    NoSuchId {
        flag: &'static str,
        value: String,
        kind: &'static str,
    },
    #[error("--chroot-base-dir must be an absolute path, not {0:?}")]
    RelativeBase(String),
    #[error("the chroot base {0} exists and is not a directory")]
    BaseNotDir(String),
    #[error("the network namespace {0} does not exist")]
    NoNetns(String),
    #[error("--cgroup {0:?} must be FILE=VALUE with FILE named <controller>.<setting> (e.g. pids.max=100)")]
    Cgroup(String),
    #[error("--cgroup-version must be 1 or 2, not {0:?}")]
    CgroupVersion(String),
    #[error("--parent-cgroup {0:?} must be a relative path without '..'")]
    ParentCgroup(String),
    #[error("--resource-limit {0:?} must be fsize=BYTES or no-file=N")]
    Limit(String),
}

/// The jailer's flags (Firecracker's); what follows `--` goes to the VMM.
const SPEC: flags::Spec = flags::Spec {
    program: "jailer",
    with_value: &[
        "--id",
        "--exec-file",
        "--uid",
        "--gid",
        "--chroot-base-dir",
        "--netns",
        "--cgroup-version",
        "--parent-cgroup",
    ],
    switches: &[
        "--daemonize",
        "--new-pid-ns",
        "--help",
        "-h",
        "--version",
        "-V",
    ],
    repeatable: &["--cgroup", "--resource-limit"],
    dashes_end_flags: true,
};

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// A numeric id, or a name looked up in `db` (/etc/passwd or /etc/group: name:x:id:...).
fn lookup(value: &str, db: &str) -> Option<u32> {
    if let Ok(n) = value.parse::<u32>() {
        return Some(n);
    }
    let text = std::fs::read_to_string(db).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == value).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

/// `--uid` or `--gid` (`flag`), required: a number, or the name of a `kind` in `db`.
fn host_id(
    value: Option<String>,
    flag: &'static str,
    db: &str,
    kind: &'static str,
) -> Result<u32, Error> {
    let value = value.ok_or(Error::Required(flag))?;
    lookup(&value, db).ok_or(Error::NoSuchId { flag, value, kind })
}

/// An executable larger than this is not a VMM (a debug build of ember is about 35 MB).
const MAX_EXEC_FILE: u64 = 512 << 20;

/// The ELF's PT_INTERP, if any; an error if it is not an x86_64 ELF executable.
fn elf_interpreter(path: &Path) -> Result<Option<String>, Error> {
    let shown = path.display().to_string();
    let bytes = hostfile::read(path, MAX_EXEC_FILE)
        .map_err(|e| Error::ReadExec(shown.clone(), e.to_string()))?;
    let bad = |reason: &str| Error::NotElf {
        path: shown.clone(),
        reason: reason.into(),
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(bad("no ELF header"));
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u64_at = |o: usize| -> Option<usize> {
        let b: [u8; 8] = bytes.get(o..o + 8)?.try_into().ok()?;
        usize::try_from(u64::from_le_bytes(b)).ok()
    };
    if u16_at(18) != 62 {
        return Err(bad("not built for x86_64"));
    }
    let (phoff, phentsize, phnum) = (u64_at(32).unwrap_or(usize::MAX), u16_at(54), u16_at(56));
    for i in 0..phnum {
        let ph = phoff
            .checked_add(i * phentsize)
            .filter(|&o| o + 56 <= bytes.len())
            .ok_or_else(|| bad("its program headers lie outside the file"))?;
        if u32::from_le_bytes([bytes[ph], bytes[ph + 1], bytes[ph + 2], bytes[ph + 3]]) == 3 {
            let (off, size) = (u64_at(ph + 8), u64_at(ph + 32));
            let interp = off
                .zip(size)
                .and_then(|(o, s)| bytes.get(o..o.checked_add(s)?))
                .ok_or_else(|| bad("its interpreter lies outside the file"))?;
            let name = String::from_utf8_lossy(interp);
            return Ok(Some(name.trim_end_matches('\0').to_string()));
        }
    }
    Ok(None)
}

fn check_exec(path: &str) -> Result<PathBuf, Error> {
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(Error::RelativeExec(path.into()));
    }
    let meta = std::fs::metadata(&p).map_err(|_| Error::NoExec(path.into()))?;
    if !meta.is_file() {
        return Err(Error::ExecNotFile(path.into()));
    }
    if let Some(interp) = elf_interpreter(&p)? {
        return Err(Error::Dynamic {
            path: path.into(),
            interp,
        });
    }
    Ok(p)
}

fn check_cgroup(value: &str) -> Result<(String, String), Error> {
    let bad = || Error::Cgroup(value.into());
    let (file, setting) = value.split_once('=').ok_or_else(bad)?;
    let (controller, name) = file.split_once('.').ok_or_else(bad)?;
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    if !word(controller) || !word(name) || setting.contains('\n') {
        return Err(bad());
    }
    Ok((file.into(), setting.into()))
}

fn check_limit(value: &str) -> Result<(Resource, u64), Error> {
    let bad = || Error::Limit(value.into());
    let (name, n) = value.split_once('=').ok_or_else(bad)?;
    let n: u64 = n.parse().map_err(|_| bad())?;
    match name {
        "fsize" => Ok((Resource::Fsize, n)),
        "no-file" => Ok((Resource::NoFile, n)),
        _ => Err(bad()),
    }
}

/// Parses and checks the arguments (without the program name).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, Error> {
    let (mut id, mut exec, mut uid, mut gid) = (None, None, None, None);
    let mut out = Args {
        id: String::new(),
        exec_file: PathBuf::new(),
        uid: 0,
        gid: 0,
        chroot_base: PathBuf::from("/srv/jailer"),
        netns: None,
        daemonize: false,
        new_pid_ns: false,
        cgroups: Vec::new(),
        cgroup_version: 1,
        parent_cgroup: None,
        limits: Vec::new(),
        vmm_args: Vec::new(),
    };
    let mut reader = flags::Reader::new(args, SPEC);
    for flag in reader.by_ref() {
        let flags::Flag { name, value } = flag?;
        match name.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "--id" => id = Some(value),
            "--exec-file" => exec = Some(value),
            "--uid" => uid = Some(value),
            "--gid" => gid = Some(value),
            "--chroot-base-dir" => out.chroot_base = PathBuf::from(value),
            "--netns" => out.netns = Some(PathBuf::from(value)),
            "--daemonize" => out.daemonize = true,
            "--new-pid-ns" => out.new_pid_ns = true,
            "--cgroup" => out.cgroups.push(check_cgroup(&value)?),
            "--cgroup-version" => {
                out.cgroup_version = match value.as_str() {
                    "1" => 1,
                    "2" => 2,
                    _ => return Err(Error::CgroupVersion(value)),
                }
            }
            "--parent-cgroup" => {
                let p = Path::new(&value);
                let ok = !value.is_empty()
                    && p.is_relative()
                    && p.components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)));
                if !ok {
                    return Err(Error::ParentCgroup(value));
                }
                out.parent_cgroup = Some(value);
            }
            "--resource-limit" => out.limits.push(check_limit(&value)?),
            _ => unreachable!("{name} is in SPEC"),
        }
    }
    out.vmm_args = reader.rest();
    out.id = id.ok_or(Error::Required("--id"))?;
    if !valid_id(&out.id) {
        return Err(Error::Id(out.id));
    }
    out.exec_file = check_exec(&exec.ok_or(Error::Required("--exec-file"))?)?;
    out.uid = host_id(uid, "--uid", "/etc/passwd", "user")?;
    out.gid = host_id(gid, "--gid", "/etc/group", "group")?;
    let base = out.chroot_base.display().to_string();
    if !out.chroot_base.is_absolute() {
        return Err(Error::RelativeBase(base));
    }
    if out.chroot_base.exists() && !out.chroot_base.is_dir() {
        return Err(Error::BaseNotDir(base));
    }
    if let Some(ns) = &out.netns {
        if !ns.exists() {
            return Err(Error::NoNetns(ns.display().to_string()));
        }
    }
    Ok(Command::Run(Box::new(out)))
}

#[cfg(test)]
mod tests;
