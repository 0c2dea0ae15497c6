//! `logger` and `metrics`: where ember's log and metrics go (`PUT /logger`, `PUT /metrics`,
//! or the config file's sections of those names).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Firecracker's `level`, matched without regard to case; `Warn` is taken for `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLevel(pub log::LevelFilter);

impl std::str::FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let level = match s.to_ascii_lowercase().as_str() {
            "off" => log::LevelFilter::Off,
            "error" => log::LevelFilter::Error,
            "warning" | "warn" => log::LevelFilter::Warn,
            "info" => log::LevelFilter::Info,
            "debug" => log::LevelFilter::Debug,
            "trace" => log::LevelFilter::Trace,
            _ => {
                return Err(format!(
                    "unknown log level {s:?}; use Error, Warning, Info, Debug, Trace or Off"
                ))
            }
        };
        Ok(LogLevel(level))
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let name = match self.0 {
            log::LevelFilter::Off => "Off",
            log::LevelFilter::Error => "Error",
            log::LevelFilter::Warn => "Warning",
            log::LevelFilter::Info => "Info",
            log::LevelFilter::Debug => "Debug",
            log::LevelFilter::Trace => "Trace",
        };
        s.serialize_str(name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerConfig {
    pub log_path: Option<String>,
    pub level: Option<LogLevel>,
    pub show_level: Option<bool>,
    pub show_log_origin: Option<bool>,
    pub module: Option<String>,
}

impl LoggerConfig {
    pub fn settings(&self) -> telemetry::logger::LoggerSettings {
        telemetry::logger::LoggerSettings {
            log_path: self.log_path.clone(),
            level: self.level.map(|l| l.0),
            show_level: self.show_level,
            show_log_origin: self.show_log_origin,
            module: self.module.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub metrics_path: String,
}
