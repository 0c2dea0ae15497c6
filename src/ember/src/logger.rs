//! A small `log` backend: one line per record, to stderr or to `--log-path`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Mutex;

struct Logger {
    id: String,
    file: Option<Mutex<File>>,
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!("[{}:{}] {}\n", self.id, record.level(), record.args());
        match &self.file {
            Some(file) => {
                let _ = file.lock().map(|mut f| f.write_all(line.as_bytes()));
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}

/// Installs the logger; the log file (a path or a FIFO, as with Firecracker) is opened for
/// appending.
pub fn init(id: &str, level: log::LevelFilter, path: Option<&str>) -> std::io::Result<()> {
    let file = match path {
        Some(p) => Some(Mutex::new(
            OpenOptions::new().create(true).append(true).open(p)?,
        )),
        None => None,
    };
    let logger = Box::new(Logger {
        id: id.to_string(),
        file,
    });
    if log::set_logger(Box::leak(logger)).is_ok() {
        log::set_max_level(level);
    }
    Ok(())
}
