//! ember: parse Firecracker's flags, open the API socket before anything slow, load the
//! configuration, and run the VMM thread (this one) until the microVM stops; then exit with a
//! status that says why.

mod cli;
mod signals;
mod terminal;

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vmm::config::ConfigError;
use vmm::resources::VmResources;
use vmm::rpc::ActionError;
use vmm::{Console, Controller, ExitSignal, VmExit};

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error(transparent)]
    Cli(#[from] cli::Error),
    #[error("cannot open the log file: {0}")]
    Log(#[source] std::io::Error),
    #[error(transparent)]
    Action(#[from] ActionError),
    #[error("--no-api needs --config-file PATH")]
    NoConfigFile,
    #[error(transparent)]
    Api(#[from] api::server::Error),
    #[error("cannot start the API thread: {0}")]
    ApiThread(#[source] std::io::Error),
    /// `what`: "configuration" or "metadata".
    #[error("cannot read the {what} file {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: String,
        source: hostfile::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the microVM: {0}")]
    Start(#[source] vmm::rpc::StartError),
    #[error("cannot set up the VMM thread: {0}")]
    Controller(#[from] vmm::controller::Error),
    #[error("the metadata file {path}: {reason}")]
    Metadata { path: String, reason: String },
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("cannot copy the standard streams: {0}")]
    Stdio(#[source] std::io::Error),
    #[error(transparent)]
    Seccomp(#[from] seccomp::Error),
}

/// The API socket's file, removed when ember exits normally.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the socket and starts the API thread, which installs its seccomp filter before it
/// reads a request; returns the VMM thread's end of the channel.
fn start_api(
    args: &cli::Args,
    metrics: &Arc<telemetry::Metrics>,
    filters: &seccomp::Filters,
) -> Result<(SocketFile, vmm::rpc::VmmSide), StartError> {
    let path = PathBuf::from(&args.api_sock);
    let listener = api::bind(&path)?;
    let socket = SocketFile(path);
    let (api_side, vmm_side) = vmm::rpc::channel(&args.id).map_err(StartError::ApiThread)?;
    let server = api::ApiServer::new(listener, api_side, args.max_payload, metrics.clone())?;
    let (installed_tx, installed) = std::sync::mpsc::sync_channel(1);
    let filters = filters.clone();
    std::thread::Builder::new()
        .name("ember_api".into())
        .spawn(move || {
            let result = filters.install(seccomp::Thread::Api);
            let ok = result.is_ok();
            let _ = installed_tx.send(result);
            if ok {
                server.run();
            }
        })
        .map_err(StartError::ApiThread)?;
    installed
        .recv()
        .map_err(|_| StartError::ApiThread(std::io::Error::other("the API thread ended")))??;
    Ok((socket, vmm_side))
}

/// `--no-seccomp`, `--seccomp-filter FILE`, or Ember's own filters.
fn seccomp_filters(args: &cli::Args) -> Result<seccomp::Filters, StartError> {
    Ok(match &args.seccomp {
        cli::Seccomp::Builtin => seccomp::Filters::builtin(),
        cli::Seccomp::Disabled => seccomp::Filters::disabled(),
        cli::Seccomp::File(path) => seccomp::Filters::from_json_file(path)?,
    })
}

fn console() -> Result<Console, StartError> {
    let output = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map_err(StartError::Stdio)?;
    // A closed stdin simply gives the guest no input.
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .map(File::from);
    Ok(Console {
        output: File::from(output),
        input,
    })
}

/// A configuration file larger than this is not one (Firecracker's are a few KiB).
const MAX_CONFIG_FILE: u64 = 1 << 20;

/// The text of the `what` file at `path`, refused past `limit` bytes or if it is not a
/// regular file.
fn read_file(path: &str, limit: u64, what: &'static str) -> Result<String, StartError> {
    hostfile::read_to_string(Path::new(path), limit).map_err(|source| StartError::ReadFile {
        what,
        path: path.to_string(),
        source,
    })
}

/// The MMDS data store, filled from `--metadata` if given (read up to the largest
/// `--mmds-size-limit`; the store's own limit applies to what it holds).
fn mmds_store(args: &cli::Args) -> Result<mmds::SharedStore, StartError> {
    let mut store = mmds::DataStore::new(args.mmds_limit());
    if let Some(path) = &args.metadata {
        let limit = cli::MAX_PAYLOAD_LIMIT as u64;
        let text = read_file(path, limit, "metadata")?;
        let bad = |reason: String| StartError::Metadata {
            path: path.clone(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        store.put(value).map_err(|e| bad(e.to_string()))?;
    }
    Ok(std::sync::Arc::new(std::sync::Mutex::new(store)))
}

fn run() -> Result<i32, StartError> {
    let started = std::time::Instant::now();
    signals::install_fatal().map_err(StartError::Signals)?;
    let args = match cli::parse(std::env::args().skip(1))? {
        cli::Command::Help => {
            print!("{}", cli::USAGE);
            return Ok(0);
        }
        cli::Command::Version => {
            println!("Ember v{}", env!("CARGO_PKG_VERSION"));
            return Ok(0);
        }
        cli::Command::Run(args) => *args,
    };
    telemetry::logger::init(&args.id);
    telemetry::logger::configure(&telemetry::logger::LoggerSettings {
        log_path: args.log_path.clone(),
        level: Some(args.level),
        show_level: Some(args.show_level),
        show_log_origin: Some(args.show_log_origin),
        module: args.module.clone(),
    })
    .map_err(StartError::Log)?;
    let metrics = Arc::new(telemetry::Metrics::default());
    if args.no_api && args.config_file.is_none() {
        return Err(StartError::NoConfigFile);
    }
    let filters = seccomp_filters(&args)?;
    // Before the socket answers: a client that sees it answer and sends SIGTERM gets the
    // clean exit (the API thread answers GET / before the VMM thread is up).
    let exit = Arc::new(ExitSignal::new().map_err(StartError::Signals)?);
    signals::install(exit.clone()).map_err(StartError::Signals)?;
    // The socket answers from here on; everything slow comes after.
    let (_socket, api) = match args.no_api {
        true => (None, None),
        false => {
            let (socket, api) = start_api(&args, &metrics, &filters)?;
            (Some(socket), Some(api))
        }
    };
    if let Some(start) = args.start_time_us {
        log::info!(
            "the API is up {} us after the jailer started",
            telemetry::time::monotonic_us().saturating_sub(start)
        );
    }

    let mut resources = match &args.config_file {
        Some(path) => {
            let text = read_file(path, MAX_CONFIG_FILE, "configuration")?;
            VmResources::from_json(&text)?
        }
        None => VmResources::default(),
    };
    resources.boot_timer = args.boot_timer.then_some(started);
    resources.pci_enabled = args.enable_pci;

    let store = mmds_store(&args)?;
    let logger = resources.logger.take();
    let metrics_file = resources.metrics.take();
    let mut controller = Controller::new(
        args.id.clone(),
        resources,
        console()?,
        exit,
        api,
        store,
        metrics,
    )?;
    controller.set_seccomp_filters(filters);
    if let Some(config) = logger {
        controller.configure_logger(&config)?;
    }
    // Both given: the second is refused, as a second PUT /metrics is.
    let metrics_paths = args
        .metrics_path
        .iter()
        .chain(metrics_file.iter().map(|m| &m.metrics_path));
    for path in metrics_paths {
        controller.configure_metrics(path)?;
    }
    // Before the VMM thread's seccomp filter: entering raw mode asks isatty() first.
    let raw = terminal::RawMode::enter();
    if args.config_file.is_some() {
        controller.start().map_err(|e| match e {
            ActionError::Start(e) => StartError::Start(e),
            other => StartError::Action(other),
        })?;
    }

    let reason = controller.run();
    drop(raw);
    match &reason {
        VmExit::VcpuError { .. } | VmExit::VmmError(_) => {
            eprintln!("ember: the microVM failed: {reason}");
        }
        VmExit::Signal(n) => log::info!("stopped by signal {n}"),
        VmExit::Reset | VmExit::PowerOff => log::info!("the guest ended the microVM ({reason:?})"),
    }
    Ok(reason.exit_status())
}

impl StartError {
    /// Firecracker's status for the error: 153 for a command line it cannot parse, 152 for
    /// an invalid log level, 1 for everything else (a bad configuration file included, as
    /// in Firecracker).
    fn exit_status(&self) -> i32 {
        match self {
            StartError::Cli(cli::Error::Level(_)) => signals::status::BAD_CONFIGURATION,
            StartError::Cli(_) | StartError::NoConfigFile => signals::status::ARG_PARSING,
            _ => signals::status::ERROR,
        }
    }
}

fn main() {
    let status = match run() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("ember: {e}");
            e.exit_status()
        }
    };
    // Ends the vCPU and API threads too; the vCPUs may still be inside KVM_RUN.
    std::process::exit(status);
}
