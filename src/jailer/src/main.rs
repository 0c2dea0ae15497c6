//! jailer: isolates one ember process the way Firecracker's jailer isolates Firecracker.
//! In order: check the arguments; make `<chroot-base>/<exec name>/<id>/root` with the binary
//! and its device nodes; set resource limits; make the cgroups and move in; join the network
//! namespace; pivot_root into the jail in a new mount namespace; (optionally) a new session
//! and a new pid namespace; drop to the uid and gid; exec the VMM with `--id`. If a step
//! fails before the VMM starts, what was made is removed and the error is one sentence.

mod args;
mod cgroup;
mod jail;
mod sys;
mod undo;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use args::{Args, Command, Resource};
use jail::Jail;
use undo::Undo;

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Args(#[from] args::Error),
    #[error(transparent)]
    Jail(#[from] jail::Error),
    #[error(transparent)]
    Cgroup(#[from] cgroup::Error),
    #[error("cannot close the inherited file descriptors: {0}")]
    CloseFds(#[source] std::io::Error),
    #[error("cannot open the network namespace {path}: {source}")]
    OpenNetns {
        path: String,
        source: hostfile::Error,
    },
    #[error("cannot join the network namespace {path}: {source}")]
    JoinNetns {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open /dev/null for --daemonize: {0}")]
    DevNull(#[source] std::io::Error),
    #[error("--daemonize: cannot start a new session ({0}); the jailer must not be a process group leader")]
    Setsid(#[source] std::io::Error),
    #[error("cannot redirect the standard streams to /dev/null: {0}")]
    Redirect(#[source] std::io::Error),
    #[error("cannot set the resource limit {name} to {value}: {source}")]
    Limit {
        name: &'static str,
        value: u64,
        source: std::io::Error,
    },
    #[error("cannot make a new pid namespace: {0}")]
    PidNs(#[source] std::io::Error),
    #[error("cannot drop to uid {uid} and gid {gid}: {source}")]
    Privileges {
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
    #[error("cannot exec {path}: {source}")]
    Exec {
        path: String,
        source: std::io::Error,
    },
    #[error("an argument holds a NUL byte")]
    Nul,
}

/// Firecracker's default bound on descriptors when no `no-file` limit is given.
const DEFAULT_NO_FILE: u64 = 2048;

fn set_limits(args: &Args) -> Result<(), Error> {
    let mut limits = args.limits.clone();
    if !limits.iter().any(|(r, _)| *r == Resource::NoFile) {
        limits.push((Resource::NoFile, DEFAULT_NO_FILE));
    }
    for (resource, value) in limits {
        let (name, which) = match resource {
            Resource::Fsize => ("fsize", libc::RLIMIT_FSIZE),
            Resource::NoFile => ("no-file", libc::RLIMIT_NOFILE),
        };
        sys::setrlimit(which, value).map_err(|source| Error::Limit {
            name,
            value,
            source,
        })?;
    }
    Ok(())
}

/// The VMM's argv: its name, `--id`, the jailer's start times, then the user's arguments.
fn vmm_argv(
    args: &Args,
    exec_name: &str,
    start_us: u64,
    start_cpu_us: u64,
) -> Result<Vec<CString>, Error> {
    let mut argv = vec![
        format!("/{exec_name}"),
        format!("--id={}", args.id),
        format!("--start-time-us={start_us}"),
        format!("--start-time-cpu-us={start_cpu_us}"),
    ];
    argv.extend(args.vmm_args.iter().cloned());
    argv.into_iter()
        .map(|a| CString::new(a).map_err(|_| Error::Nul))
        .collect()
}

fn run(args: &Args, start_us: u64) -> Result<(), Error> {
    // Nothing the jailer's parent left open reaches the VMM.
    sys::close_from(3).map_err(Error::CloseFds)?;
    let exec_name = args.exec_name();
    let parent = args
        .parent_cgroup
        .clone()
        .unwrap_or_else(|| exec_name.clone());
    let cgroups = cgroup::Plan::new(&args.cgroups, args.cgroup_version, &parent, &args.id)?;
    let jail = Jail::new(&args.chroot_base, &exec_name, &args.id);
    jail.check_unused(&cgroups.existing())?;

    // Everything that can be opened or checked is, before anything is made.
    let netns = match &args.netns {
        Some(path) => Some(
            // A namespace file is a regular file (nsfs); a FIFO here would block the open.
            hostfile::open(path, hostfile::Kind::Regular, false).map_err(|source| {
                Error::OpenNetns {
                    path: path.display().to_string(),
                    source,
                }
            })?,
        ),
        None => None,
    };
    let dev_null = match args.daemonize {
        true => Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(Error::DevNull)?,
        ),
        false => None,
    };
    if args.daemonize {
        sys::setsid().map_err(Error::Setsid)?;
    }

    let mut undo = Undo::default();
    jail.build(&args.exec_file, args.uid, args.gid, &mut undo)?;
    set_limits(args)?;
    cgroups.apply(&mut undo)?;
    if let (Some(ns), Some(path)) = (&netns, &args.netns) {
        sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET).map_err(|source| Error::JoinNetns {
            path: path.display().to_string(),
            source,
        })?;
    }
    drop(netns);
    jail.enter()?;
    // From here the host's paths are out of reach: the jail stays whatever happens.
    undo.keep();

    if let Some(null) = dev_null {
        for fd in 0..3 {
            sys::dup2(null.as_raw_fd(), fd).map_err(Error::Redirect)?;
        }
    }
    if args.new_pid_ns {
        sys::unshare(libc::CLONE_NEWPID).map_err(Error::PidNs)?;
        // The child is pid 1 of the new namespace; the parent records its pid and exits.
        if let sys::Forked::Parent { child } = sys::fork().map_err(Error::PidNs)? {
            jail.write_pid_inside(child as u32)?;
            std::process::exit(0);
        }
    } else {
        jail.write_pid_inside(std::process::id())?;
    }
    sys::drop_privileges(args.uid, args.gid).map_err(|source| Error::Privileges {
        uid: args.uid,
        gid: args.gid,
        source,
    })?;
    let argv = vmm_argv(
        args,
        &exec_name,
        start_us,
        sys::clock_us(libc::CLOCK_PROCESS_CPUTIME_ID),
    )?;
    let path = argv[0].clone();
    let source = sys::exec(&path, &argv);
    Err(Error::Exec {
        path: path.to_string_lossy().into_owned(),
        source,
    })
}

fn main() {
    let start_us = sys::clock_us(libc::CLOCK_MONOTONIC);
    let status = match args::parse(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            print!("{}", args::USAGE);
            0
        }
        Ok(Command::Version) => {
            println!("Ember jailer v{}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Command::Run(args)) => match run(&args, start_us) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("jailer: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("jailer: {}", Error::from(e));
            1
        }
    };
    std::process::exit(status);
}
