//! ember: parse Firecracker's flags, load the configuration, build the microVM and run it
//! until it stops; then exit with a status that says why.

mod cli;
mod logger;
mod signals;
mod terminal;

use std::fs::File;
use std::os::fd::AsFd;

use vmm::config::ConfigError;
use vmm::resources::VmResources;
use vmm::{BuildError, Console, VmExit};

#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{0}")]
    Cli(#[from] cli::Error),
    #[error("cannot open the log file: {0}")]
    Log(#[source] std::io::Error),
    #[error("the REST API is not available yet; start ember with --no-api --config-file PATH")]
    ApiUnavailable,
    #[error("--no-api needs --config-file PATH")]
    NoConfigFile,
    #[error("cannot read the configuration file {path}: {source}")]
    ReadConfig {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot start the microVM: {0}")]
    Build(#[from] BuildError),
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

fn run() -> Result<i32, StartError> {
    let started = std::time::Instant::now();
    let args = match cli::parse(std::env::args().skip(1))? {
        cli::Command::Help => {
            print!("{}", cli::USAGE);
            return Ok(0);
        }
        cli::Command::Version => {
            println!("Ember v{}", env!("CARGO_PKG_VERSION"));
            return Ok(0);
        }
        cli::Command::Run(args) => args,
    };
    logger::init(&args.id, args.level, args.log_path.as_deref()).map_err(StartError::Log)?;
    if !args.no_api {
        return Err(StartError::ApiUnavailable);
    }
    let path = args.config_file.ok_or(StartError::NoConfigFile)?;
    let text = std::fs::read_to_string(&path).map_err(|source| StartError::ReadConfig {
        path: path.clone(),
        source,
    })?;
    let mut resources = VmResources::from_json(&text)?;
    resources.boot_timer = args.boot_timer.then_some(started);

    // A closed stdin simply gives the guest no input.
    let input = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .ok()
        .map(File::from);
    let console = Console {
        output: Box::new(std::io::stdout()),
        input,
    };
    let vmm = vmm::build(&resources, console)?;
    signals::install(vmm.exit_signal()).map_err(StartError::Signals)?;

    let raw = terminal::RawMode::enter();
    let reason = vmm.run();
    drop(raw);
    match &reason {
        VmExit::VcpuError(msg) | VmExit::VmmError(msg) => {
            eprintln!("ember: the microVM failed: {msg}");
        }
        VmExit::Signal(n) => log::info!("stopped by signal {n}"),
        VmExit::Reset | VmExit::PowerOff => log::info!("the guest ended the microVM ({reason:?})"),
    }
    Ok(reason.exit_status())
}

fn main() {
    let status = match run() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("ember: {e}");
            1
        }
    };
    // Ends the vCPU threads too, which may still be inside KVM_RUN.
    std::process::exit(status);
}
