//! Seccomp filters for ember's threads. A compromised VMM thread, API thread or vCPU thread
//! can make only the system calls (and, for `ioctl`, the requests) that kind of thread needs;
//! anything else raises SIGSYS, on which ember exits with status 148 (Firecracker's way:
//! the filters trap rather than kill, so the cause is named). The filters come from `filters/x86_64.json`, compiled
//! when ember is built; `--seccomp-filter FILE` replaces them with a user's (same format) and
//! `--no-seccomp` turns them off. Each thread installs its own filter before it runs code that
//! the guest can reach.

use std::path::Path;
use std::sync::Arc;

use seccompiler::{sock_filter, BpfProgram};

mod dispatch;

/// The kinds of thread, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thread {
    /// The main thread: the event loop and every device.
    Vmm,
    /// The API server.
    Api,
    /// One per vCPU.
    Vcpu,
}

impl Thread {
    pub const ALL: [Thread; 3] = [Thread::Vmm, Thread::Api, Thread::Vcpu];

    /// The thread's key in a filter file, as in Firecracker's.
    pub fn key(self) -> &'static str {
        match self {
            Thread::Vmm => "vmm",
            Thread::Api => "api",
            Thread::Vcpu => "vcpu",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the seccomp filter file {path}: {source}")]
    Read {
        path: String,
        source: hostfile::Error,
    },
    #[error("the seccomp filter file {path} is not a valid filter: {reason}")]
    Invalid { path: String, reason: String },
    #[error(
        "the seccomp filter file {path} has no filter for the {thread:?} thread (key {key:?})"
    )]
    Missing {
        path: String,
        thread: Thread,
        key: &'static str,
    },
    #[error("cannot install the seccomp filter of the {thread:?} thread: {reason}")]
    Install { thread: Thread, reason: String },
}

/// The filters ember installs, one per kind of thread; none with `--no-seccomp`.
#[derive(Debug, Clone)]
pub struct Filters {
    programs: Option<Arc<[BpfProgram; 3]>>,
}

/// A filter file larger than this is not one (Ember's own is a few KiB).
const MAX_FILTER_FILE: u64 = 4 << 20;

/// Ember's own filters, compiled by build.rs.
const BUILTIN: [&[u8]; 3] = [
    include_bytes!(concat!(env!("OUT_DIR"), "/vmm.bpf")),
    include_bytes!(concat!(env!("OUT_DIR"), "/api.bpf")),
    include_bytes!(concat!(env!("OUT_DIR"), "/vcpu.bpf")),
];

/// A program from build.rs's bytes: 8 per instruction (code, jt, jf, k; little-endian).
fn decode(bytes: &[u8]) -> BpfProgram {
    bytes
        .chunks_exact(8)
        .map(|b| sock_filter {
            code: u16::from_le_bytes([b[0], b[1]]),
            jt: b[2],
            jf: b[3],
            k: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
        .collect()
}

impl Filters {
    /// Ember's own filters.
    pub fn builtin() -> Self {
        Filters {
            programs: Some(Arc::new(BUILTIN.map(decode))),
        }
    }

    /// No filters (`--no-seccomp`).
    pub fn disabled() -> Self {
        Filters { programs: None }
    }

    /// A user's filters, in seccompiler's JSON format with the keys `vmm`, `api` and `vcpu`
    /// (Firecracker's thread names). `path` only names the file in errors.
    pub fn from_json(text: &[u8], path: &str) -> Result<Self, Error> {
        let mut map = dispatch::compile(text).map_err(|reason| Error::Invalid {
            path: path.into(),
            reason,
        })?;
        let mut take = |thread: Thread| {
            map.remove(thread.key()).ok_or(Error::Missing {
                path: path.into(),
                thread,
                key: thread.key(),
            })
        };
        let programs = [take(Thread::Vmm)?, take(Thread::Api)?, take(Thread::Vcpu)?];
        Ok(Filters {
            programs: Some(Arc::new(programs)),
        })
    }

    /// Reads [`Filters::from_json`]'s format from a file.
    pub fn from_json_file(path: &str) -> Result<Self, Error> {
        let text =
            hostfile::read(Path::new(path), MAX_FILTER_FILE).map_err(|source| Error::Read {
                path: path.into(),
                source,
            })?;
        Self::from_json(&text, path)
    }

    pub fn enabled(&self) -> bool {
        self.programs.is_some()
    }

    /// Installs `thread`'s filter on the calling thread (and on threads it starts later).
    pub fn install(&self, thread: Thread) -> Result<(), Error> {
        let Some(programs) = &self.programs else {
            return Ok(());
        };
        let index = Thread::ALL.iter().position(|t| *t == thread).unwrap_or(0);
        seccompiler::apply_filter(&programs[index]).map_err(|e| Error::Install {
            thread,
            reason: e.to_string(),
        })?;
        test_hook::after_install(thread);
        Ok(())
    }
}

/// The tests' hooks into a running ember, all here, run by each thread right after it
/// installs its filter. Debug builds only: release builds have none.
///
/// - `EMBER_TEST_VCPU_SYSCALL=socket`: a vCPU thread makes a system call its filter forbids
///   (`socket`), so that the tests can see seccomp stop ember.
/// - `EMBER_TEST_ALLOC_STRESS=1`: every thread allocates and frees as a busy VMM would at its
///   worst (many blocks of every size, a heap grown and given back, a buffer grown by
///   reallocation, one block far above the mmap threshold), so that a test can see that the
///   allocator's system calls are in every filter. glibc's malloc failed this: trimming a
///   thread's heap opens /proc/sys/vm/overcommit_memory.
mod test_hook {
    use super::Thread;

    #[cfg(debug_assertions)]
    pub fn after_install(thread: Thread) {
        let var = |name: &str, value: &str| std::env::var_os(name).is_some_and(|v| v == value);
        if thread == Thread::Vcpu && var("EMBER_TEST_VCPU_SYSCALL", "socket") {
            let _ = std::net::UdpSocket::bind("127.0.0.1:0");
        }
        if var("EMBER_TEST_ALLOC_STRESS", "1") {
            exercise_allocator();
        }
    }

    #[cfg(not(debug_assertions))]
    pub fn after_install(_: Thread) {}

    #[cfg(debug_assertions)]
    fn exercise_allocator() {
        let touch = |size: usize| {
            let v = vec![1u8; size];
            std::hint::black_box(&v);
            v
        };
        // Light enough for an emulated host (a debug build under TCG), heavy enough for every
        // path of the allocator: small blocks, a heap grown and trimmed, reallocation, mmap.
        for _ in 0..2 {
            // First, before a freed mmap raises the trim threshold: a thread heap grown by
            // blocks under the mmap threshold and given back at once (trimmed) when freed.
            let grown: Vec<Vec<u8>> = (0..200).map(|_| touch(64 << 10)).collect();
            drop(grown);
            let blocks: Vec<Vec<u8>> = (0..1000).map(|i| touch(64 + (i % 64) * 512)).collect();
            let large: Vec<Vec<u8>> = (10..24).map(|shift| touch(1 << shift)).collect();
            drop(blocks);
            drop(large);
            let mut grown = Vec::new();
            for i in 0..(1usize << 20) {
                grown.push(i as u8);
            }
            std::hint::black_box(&grown);
            drop(grown);
            // Above glibc's largest mmap threshold (32 MiB): always a fresh mapping.
            drop(touch(40 << 20));
        }
    }
}

#[cfg(test)]
mod tests;
