//! Firecracker's command line, with its spelling and defaults.

pub const USAGE: &str = "\
ember: a microVM monitor with Firecracker's interface

Usage: ember [OPTIONS]

Options:
  --api-sock <PATH>     Path of the API Unix socket [default: /run/firecracker.socket]
  --id <ID>             MicroVM identifier [default: anonymous-instance]
  --config-file <PATH>  Start the microVM from this JSON configuration
  --no-api              Do not start the API server (needs --config-file)
  --http-api-max-payload-size <BYTES>
                        Largest API request body accepted [default: 51200]
  --mmds-size-limit <BYTES>
                        Largest MMDS data store, as JSON [default: the payload size]
  --metadata <PATH>     Fill the MMDS data store from this JSON file at start
  --boot-timer          Log the guest boot time when the guest writes 123 to the boot timer
  --level <LEVEL>       Log level: Off, Error, Warning, Info, Debug, Trace [default: Warning]
  --log-path <PATH>     Write the log to this file or named pipe instead of stderr
  --show-level          Put each line's level in the log
  --show-log-origin     Put each line's source file and line in the log
  --module <PATH>       Log only lines from modules under this path (e.g. vmm::controller)
  --metrics-path <PATH> Write metrics (JSON lines) to this file or named pipe
  --no-seccomp          Run without seccomp filters (not for production)
  --seccomp-filter <PATH>
                        Use this seccomp filter file (seccompiler JSON with the keys vmm, api,
                        vcpu) instead of Ember's own
  --start-time-us <US>, --start-time-cpu-us <US>, --parent-cpu-time-us <US>
                        Set by the jailer: when it started (CLOCK_MONOTONIC) and its CPU time
  --version             Print the version and exit
  --help                Print this help and exit

Exit status (Firecracker's): 0 when the guest resets or powers off; 153 when the command
line cannot be parsed, 152 for an invalid --level; 148 when a seccomp filter traps a system
call, 149 SIGBUS, 150 SIGSEGV, 151 SIGXFSZ, 154 SIGXCPU, 156 SIGHUP, 157 SIGILL; 128+N after
SIGINT or SIGTERM (130, 143), which end the microVM cleanly; 1 on any other error.
";

pub const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";
pub const DEFAULT_ID: &str = "anonymous-instance";
pub use api::http::DEFAULT_MAX_PAYLOAD;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub api_sock: String,
    pub id: String,
    pub config_file: Option<String>,
    pub no_api: bool,
    pub max_payload: usize,
    /// None: the same as `max_payload`, as in Firecracker.
    pub mmds_size_limit: Option<usize>,
    pub metadata: Option<String>,
    pub boot_timer: bool,
    /// `--enable-pci`: the virtio devices on a PCI bus (virtio-pci, MSI-X) instead of
    /// virtio-mmio.
    pub enable_pci: bool,
    pub level: log::LevelFilter,
    pub log_path: Option<String>,
    pub show_level: bool,
    pub show_log_origin: bool,
    pub module: Option<String>,
    pub metrics_path: Option<String>,
    pub seccomp: Seccomp,
    /// The jailer's start (CLOCK_MONOTONIC, µs), to log how long the start took.
    pub start_time_us: Option<u64>,
}

/// Which seccomp filters the threads install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    Builtin,
    Disabled,
    File(String),
}

pub type Command = flags::Command<Args>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(transparent)]
    Flags(#[from] flags::Error),
    #[error("invalid log level {0:?}; use Off, Error, Warning, Info, Debug or Trace")]
    Level(String),
    #[error("the microVM id {0:?} must be 1 to 64 characters, letters, digits, '-' and '_' only")]
    Id(String),
    #[error(
        "--http-api-max-payload-size must be a number of bytes from 1 to {max}, not {value:?}"
    )]
    MaxPayload { value: String, max: usize },
    #[error("--mmds-size-limit must be a number of bytes from 1 to {max}, not {value:?}")]
    MmdsSizeLimit { value: String, max: usize },
    #[error("--no-seccomp and --seccomp-filter cannot be used together")]
    SeccompBoth,
    #[error("{flag} must be a number of microseconds, not {value:?}")]
    Micros { flag: String, value: String },
}

impl Args {
    /// The MMDS data store's limit in bytes.
    pub fn mmds_limit(&self) -> usize {
        self.mmds_size_limit.unwrap_or(self.max_payload)
    }
}

/// A request body larger than this would not be a configuration.
pub const MAX_PAYLOAD_LIMIT: usize = 64 << 20;

/// A size in bytes from 1 to [`MAX_PAYLOAD_LIMIT`].
fn parse_size(value: &str) -> Option<usize> {
    value
        .parse()
        .ok()
        .filter(|n| (1..=MAX_PAYLOAD_LIMIT).contains(n))
}

fn parse_level(value: &str) -> Result<log::LevelFilter, Error> {
    value
        .parse::<vmm::config::LogLevel>()
        .map(|l| l.0)
        .map_err(|_| Error::Level(value.to_string()))
}

/// Ember's flags (Firecracker's).
const SPEC: flags::Spec = flags::Spec {
    program: "ember",
    with_value: &[
        "--api-sock",
        "--id",
        "--config-file",
        "--level",
        "--log-path",
        "--module",
        "--metrics-path",
        "--http-api-max-payload-size",
        "--mmds-size-limit",
        "--metadata",
        "--seccomp-filter",
        "--start-time-us",
        "--start-time-cpu-us",
        "--parent-cpu-time-us",
    ],
    switches: &[
        "--help",
        "-h",
        "--version",
        "-V",
        "--no-api",
        "--boot-timer",
        "--enable-pci",
        "--show-level",
        "--show-log-origin",
        "--no-seccomp",
    ],
    repeatable: &[],
    dashes_end_flags: false,
};

/// Parses arguments (without the program name). Both `--flag value` and `--flag=value`.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, Error> {
    let mut out = Args {
        api_sock: DEFAULT_API_SOCK.into(),
        id: DEFAULT_ID.into(),
        config_file: None,
        no_api: false,
        max_payload: DEFAULT_MAX_PAYLOAD,
        mmds_size_limit: None,
        metadata: None,
        boot_timer: false,
        enable_pci: false,
        level: log::LevelFilter::Warn,
        log_path: None,
        show_level: false,
        show_log_origin: false,
        module: None,
        metrics_path: None,
        seccomp: Seccomp::Builtin,
        start_time_us: None,
    };
    for flag in flags::Reader::new(args, SPEC) {
        let flags::Flag { name, value } = flag?;
        match name.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "--api-sock" => out.api_sock = value,
            "--id" => {
                let ok = (1..=64).contains(&value.len())
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !ok {
                    return Err(Error::Id(value));
                }
                out.id = value;
            }
            "--config-file" => out.config_file = Some(value),
            "--no-api" => out.no_api = true,
            "--http-api-max-payload-size" => {
                out.max_payload = parse_size(&value).ok_or(Error::MaxPayload {
                    value,
                    max: MAX_PAYLOAD_LIMIT,
                })?;
            }
            "--mmds-size-limit" => {
                let limit = parse_size(&value).ok_or(Error::MmdsSizeLimit {
                    value,
                    max: MAX_PAYLOAD_LIMIT,
                })?;
                out.mmds_size_limit = Some(limit);
            }
            "--metadata" => out.metadata = Some(value),
            "--boot-timer" => out.boot_timer = true,
            "--enable-pci" => out.enable_pci = true,
            "--level" => out.level = parse_level(&value)?,
            "--log-path" => out.log_path = Some(value),
            "--show-level" => out.show_level = true,
            "--show-log-origin" => out.show_log_origin = true,
            "--module" => out.module = Some(value),
            "--metrics-path" => out.metrics_path = Some(value),
            "--no-seccomp" | "--seccomp-filter" => {
                if out.seccomp != Seccomp::Builtin {
                    return Err(Error::SeccompBoth);
                }
                out.seccomp = match name.as_str() {
                    "--no-seccomp" => Seccomp::Disabled,
                    _ => Seccomp::File(value),
                };
            }
            "--start-time-us" | "--start-time-cpu-us" | "--parent-cpu-time-us" => {
                let us = value.parse::<u64>().map_err(|_| Error::Micros {
                    flag: name.clone(),
                    value,
                })?;
                if name == "--start-time-us" {
                    out.start_time_us = Some(us);
                }
            }
            _ => unreachable!("{name} is in SPEC"),
        }
    }
    Ok(Command::Run(Box::new(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Command, Error> {
        parse(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_match_firecracker() {
        let Command::Run(a) = args(&[]).unwrap() else {
            panic!()
        };
        assert_eq!(a.api_sock, "/run/firecracker.socket");
        assert_eq!(a.id, "anonymous-instance");
        assert!(!a.no_api && !a.boot_timer);
        assert_eq!(a.level, log::LevelFilter::Warn);
        assert_eq!(a.max_payload, 51_200);
    }

    #[test]
    fn both_value_spellings() {
        let Command::Run(a) = args(&[
            "--no-api",
            "--config-file",
            "vm.json",
            "--level=Debug",
            "--id",
            "vm-1",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(a.config_file.as_deref(), Some("vm.json"));
        assert_eq!(a.level, log::LevelFilter::Debug);
        assert_eq!(a.id, "vm-1");
        assert!(a.no_api);
        assert_eq!(a.seccomp, Seccomp::Builtin);
        let Command::Run(a) = args(&[
            "--id=t1",
            "--start-time-us=12",
            "--start-time-cpu-us=3",
            "--seccomp-filter",
            "f.json",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(a.start_time_us, Some(12));
        assert_eq!(a.seccomp, Seccomp::File("f.json".into()));
    }

    #[test]
    fn bad_arguments() {
        let unknown = flags::Error::Unknown {
            arg: "--bogus".into(),
            program: "ember",
        };
        assert_eq!(args(&["--bogus"]), Err(unknown.into()));
        assert_eq!(
            args(&["--config-file"]),
            Err(flags::Error::MissingValue("--config-file".into()).into())
        );
        assert_eq!(
            args(&["--no-api=1"]),
            Err(flags::Error::UnexpectedValue("--no-api".into()).into())
        );
        assert_eq!(args(&["--level", "loud"]), Err(Error::Level("loud".into())));
        assert_eq!(args(&["--id", "a/b"]), Err(Error::Id("a/b".into())));
        assert_eq!(
            args(&["--no-api", "--no-api"]),
            Err(flags::Error::Duplicate("--no-api".into()).into())
        );
        assert_eq!(args(&["--help", "--bogus"]), Ok(Command::Help));
        assert_eq!(
            args(&["--no-seccomp", "--seccomp-filter", "f.json"]),
            Err(Error::SeccompBoth)
        );
        assert!(matches!(
            args(&["--start-time-us", "soon"]),
            Err(Error::Micros { .. })
        ));
        for bad in ["0", "-1", "lots", "99999999999999999999"] {
            assert!(matches!(
                args(&["--http-api-max-payload-size", bad]),
                Err(Error::MaxPayload { .. })
            ));
        }
    }
}
