//! The host files that users name (kernel, initrd, drives, config and metadata files, snapshot
//! files, seccomp filters) are untrusted: a path may name a FIFO, whose open or read waits for
//! a writer forever, a device such as /dev/zero, which never ends, or a huge file. Every such
//! file is opened here: without blocking (O_NONBLOCK, which regular files and block devices
//! ignore), checked by kind before anything is read, and read within a limit that the error
//! names.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Why a file cannot be used; callers name the file ("cannot read the kernel image PATH: ...").
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("it is {kind}, not {expected}")]
    Kind {
        kind: &'static str,
        expected: &'static str,
    },
    #[error("it is over the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("it is not UTF-8 text")]
    NotText,
    #[error("its listener is not accepting connections (its backlog is full)")]
    Busy,
}

/// What a path may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Regular,
    /// A disk: an image file or a host block device.
    RegularOrBlockDevice,
    /// Where output goes: a file, a named pipe, or a character device such as /dev/null.
    Output,
}

impl Kind {
    fn admits(self, t: std::fs::FileType) -> bool {
        t.is_file()
            || (self == Kind::RegularOrBlockDevice && t.is_block_device())
            || (self == Kind::Output && (t.is_fifo() || t.is_char_device()))
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Regular => "a regular file",
            Kind::RegularOrBlockDevice => "a regular file or a block device",
            Kind::Output => "a regular file, a named pipe or a character device",
        }
    }
}

/// How a file type reads in an error sentence.
fn describe(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

fn check(file: &File, kind: Kind) -> Result<(), Error> {
    let t = file.metadata()?.file_type();
    if kind.admits(t) {
        return Ok(());
    }
    Err(Error::Kind {
        kind: describe(t),
        expected: kind.expected(),
    })
}

/// Opens `path` for reading (and writing if `write`), never waiting on a FIFO, and checks
/// that it is of `kind`.
pub fn open(path: &Path, kind: Kind, write: bool) -> Result<File, Error> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    check(&file, kind)?;
    Ok(file)
}

/// The whole of the regular file `path`, at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    let file = open(path, Kind::Regular, false)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(Error::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // One byte past the limit tells a file that grew since its size was read.
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(Error::TooLarge { limit });
    }
    Ok(bytes)
}

/// The regular file `path` as UTF-8 text, at most `limit` bytes.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, Error> {
    let bytes = read(path, limit)?;
    String::from_utf8(bytes).map_err(|_| Error::NotText)
}

/// Creates (or truncates) the regular file `path` for writing, never waiting on a FIFO and
/// never truncating a device: what exists there must be a regular file.
pub fn create(path: &Path) -> Result<File, Error> {
    // What is there already is checked first: opening a FIFO for writing fails (no reader,
    // ENXIO) or writes into it, and says less than its kind does.
    if let Ok(m) = std::fs::metadata(path) {
        if !m.file_type().is_file() {
            return Err(Error::Kind {
                kind: describe(m.file_type()),
                expected: Kind::Regular.expected(),
            });
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    check(&file, Kind::Regular)?;
    file.set_len(0)?;
    Ok(file)
}

/// Opens `path` to append output to (a regular file is created if missing): never waiting,
/// on a FIFO either (opened read-write, so that it needs no reader and a full pipe answers
/// EAGAIN), and never a directory, socket or block device.
pub fn open_output(path: &Path) -> Result<File, Error> {
    let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    let mut options = OpenOptions::new();
    options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC);
    match fifo {
        true => options.read(true).write(true),
        false => options.append(true).create(true),
    };
    let file = options.open(path)?;
    check(&file, Kind::Output)?;
    Ok(file)
}

/// Connects to the Unix stream socket `path` without waiting on a listener that does not
/// accept (a full backlog is an error, not a hang); sends on the stream give up after
/// `send_timeout`.
pub fn connect(path: &Path, send_timeout: Duration) -> Result<UnixStream, Error> {
    let t = std::fs::metadata(path)?.file_type();
    if !t.is_socket() {
        return Err(Error::Kind {
            kind: describe(t),
            expected: "a socket",
        });
    }
    let stream = connect_nonblocking(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => Error::Busy,
        _ => e.into(),
    })?;
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(send_timeout))?;
    Ok(stream)
}

mod socket;

pub use socket::connect_nonblocking;

#[cfg(test)]
mod tests;
