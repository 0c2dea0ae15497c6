//! The `log` backend: Firecracker's line format, to stderr until `--log-path` or
//! `PUT /logger` names a file or a named pipe, with the level, the origin and a module filter
//! settable at any time. A line is
//! `<UTC time> [<instance id>:<thread>(:<LEVEL>)(:<file>:<line>)] <message>`.

use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, RwLock};

use crate::sink::LineSink;

/// What `PUT /logger` (or the command line) sets; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggerSettings {
    pub log_path: Option<String>,
    pub level: Option<log::LevelFilter>,
    pub show_level: Option<bool>,
    pub show_log_origin: Option<bool>,
    pub module: Option<String>,
}

#[derive(Debug)]
struct State {
    id: String,
    show_level: bool,
    show_origin: bool,
    module: Option<String>,
    /// None: stderr.
    sink: Option<Mutex<LineSink>>,
}

#[derive(Debug)]
struct Logger {
    state: RwLock<State>,
}

static LOGGER: Logger = Logger {
    state: RwLock::new(State {
        id: String::new(),
        show_level: false,
        show_origin: false,
        module: None,
        sink: None,
    }),
};

/// Installs the logger for instance `id`, writing to stderr at `Warning` until configured.
pub fn init(id: &str) {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    LOGGER.write().id = id.to_string();
}

/// Applies `settings`; a log path that cannot be opened changes nothing.
pub fn configure(settings: &LoggerSettings) -> std::io::Result<()> {
    let sink = match &settings.log_path {
        Some(path) => Some(LineSink::open(Path::new(path))?),
        None => None,
    };
    let mut state = LOGGER.write();
    if let Some(sink) = sink {
        state.sink = Some(Mutex::new(sink));
    }
    if let Some(level) = settings.level {
        log::set_max_level(level);
    }
    if let Some(show) = settings.show_level {
        state.show_level = show;
    }
    if let Some(show) = settings.show_log_origin {
        state.show_origin = show;
    }
    if let Some(module) = &settings.module {
        state.module = Some(module.clone());
    }
    Ok(())
}

impl Logger {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

fn level_name(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "ERROR",
        log::Level::Warn => "WARN",
        log::Level::Info => "INFO",
        log::Level::Debug => "DEBUG",
        log::Level::Trace => "TRACE",
    }
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let state = self.read();
        if let Some(module) = &state.module {
            if !record
                .module_path()
                .unwrap_or("")
                .starts_with(module.as_str())
            {
                return;
            }
        }
        let thread = std::thread::current();
        let mut tag = format!("{}:{}", state.id, thread.name().unwrap_or("-"));
        if state.show_level {
            tag.push(':');
            tag.push_str(level_name(record.level()));
        }
        if state.show_origin {
            let file = record.file().unwrap_or("?");
            tag.push_str(&format!(":{file}:{}", record.line().unwrap_or(0)));
        }
        let line = format!(
            "{} [{tag}] {}\n",
            crate::time::utc_timestamp(),
            record.args()
        );
        match &state.sink {
            Some(sink) => {
                let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
                sink.write_line(line.as_bytes());
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}
