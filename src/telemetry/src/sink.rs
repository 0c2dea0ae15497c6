//! A line writer for a log or metrics destination that must never hold up the thread that
//! writes to it: a file, or a named pipe whose reader may be slow or absent.
//!
//! A FIFO is opened read-write and non-blocking, so that opening it needs no reader and a
//! full pipe answers EAGAIN instead of waiting. A line the pipe takes only in part keeps its
//! rest here and goes out before anything newer; while such a rest waits, new lines are
//! dropped and counted. Lines are never interleaved or torn.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

#[derive(Debug)]
pub struct LineSink {
    file: File,
    /// The unwritten end of a line the destination took only in part.
    pending: Vec<u8>,
    dropped: u64,
}

impl LineSink {
    /// Opens `path` for appending; a regular file is created if it does not exist.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
        let mut options = OpenOptions::new();
        options.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        match fifo {
            true => options.read(true).write(true),
            false => options.append(true).create(true),
        };
        Ok(LineSink {
            file: options.open(path)?,
            pending: Vec::new(),
            dropped: 0,
        })
    }

    /// Lines dropped because the destination was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes what it can of `line` now; false if the line was dropped.
    pub fn write_line(&mut self, line: &[u8]) -> bool {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            let rest = self.write_some(&pending);
            self.pending = pending[pending.len() - rest..].to_vec();
            if !self.pending.is_empty() {
                self.dropped += 1;
                return false;
            }
        }
        let rest = self.write_some(line);
        if rest == line.len() {
            self.dropped += 1;
            return false;
        }
        self.pending = line[line.len() - rest..].to_vec();
        true
    }

    /// Writes until the destination is full; returns how many bytes are left.
    fn write_some(&mut self, mut bytes: &[u8]) -> usize {
        while !bytes.is_empty() {
            match self.file.write(bytes) {
                Ok(0) => break,
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // Full (EAGAIN) or failing: the rest waits, or is dropped with the line.
                Err(_) => break,
            }
        }
        bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A fresh directory, removed when the test ends (passed or not).
    fn scratch(name: &str) -> vmm_sys_util::tempdir::TempDir {
        let prefix = std::env::temp_dir().join(format!("ember-sink-{name}-"));
        vmm_sys_util::tempdir::TempDir::new_with_prefix(prefix).unwrap()
    }

    #[test]
    fn a_file_gets_whole_lines_appended() {
        let dir = scratch("file");
        let path = dir.as_path().join("log");
        std::fs::write(&path, b"old\n").unwrap();
        let mut sink = LineSink::open(&path).unwrap();
        assert!(sink.write_line(b"one\n"));
        assert!(sink.write_line(b"two\n"));
        assert_eq!(std::fs::read(&path).unwrap(), b"old\none\ntwo\n");
    }

    #[test]
    fn a_fifo_without_a_reader_or_full_never_blocks_and_keeps_lines_whole() {
        let dir = scratch("fifo");
        let path = dir.as_path().join("fifo");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut sink = LineSink::open(&path).unwrap();
        // Nobody reads: the pipe fills (64 KiB) and later lines are dropped, at once.
        let line = [b'x'; 1000];
        let mut line = line.to_vec();
        line.push(b'\n');
        let started = std::time::Instant::now();
        let mut written = 0;
        for _ in 0..200 {
            if sink.write_line(&line) {
                written += 1;
            }
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(written > 0 && written < 200, "{written}");
        assert_eq!(sink.dropped(), 200 - written as u64);

        // A reader drains the pipe; the line cut in two goes out first, then new ones.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        // Each read_to_end stops at WouldBlock once the pipe is empty, keeping what came.
        let mut got = Vec::new();
        let _ = reader.read_to_end(&mut got);
        assert!(sink.write_line(b"last\n"));
        let _ = reader.read_to_end(&mut got);
        let text = String::from_utf8(got).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.last(), Some(&"last"));
        assert!(lines[..lines.len() - 1]
            .iter()
            .all(|l| l.len() == 1000 && l.bytes().all(|b| b == b'x')));
        assert_eq!(lines.len(), written + 1);
    }
}
