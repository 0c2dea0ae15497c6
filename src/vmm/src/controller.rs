//! The VMM thread. It owns the configuration ([`VmResources`]) and, after `InstanceStart`, the
//! running [`MicroVm`]; it runs the event loop and, each time the loop wakes, answers the
//! API's requests with Firecracker's pre-boot and post-boot rules.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use devices::virtio::balloon::{Balloon, HintingError};
use devices::virtio::block::Block;
use devices::virtio::net::Net;
use event_manager::{EventManager, SubscriberOps};
use telemetry::Span;

use crate::builder::{self, Console};
use crate::config::{
    BalloonStatsUpdate, BalloonUpdate, ConfigError, LoggerConfig, PartialDrive,
    PartialNetworkInterface, RateLimiterConfig,
};
use crate::event_loop::{Subscriber, Wakeup};
use crate::metrics_writer::MetricsWriter;
use crate::microvm::MicroVm;
use crate::resources::VmResources;
use crate::rpc::{
    ActionError, ActionResult, InstanceInfo, InstanceState, Phase, VmmAction, VmmData, VmmSide,
    FIRECRACKER_API_VERSION,
};
use crate::snapshot::load::{LoadError, Prepared, SnapshotLoadParams};
use crate::snapshot::{self, Setup};
use crate::{ExitSignal, VmExit, VmmFailure};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the event loop: {0}")]
    EventLoop(String),
    #[error("cannot copy an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error(transparent)]
    Metrics(#[from] crate::metrics_writer::Error),
}

pub struct Controller {
    id: String,
    resources: VmResources,
    /// The MMDS data store: the API fills it before and after boot, the guest reads it.
    mmds: mmds::SharedStore,
    metrics: Arc<telemetry::Metrics>,
    metrics_writer: Arc<Mutex<MetricsWriter>>,
    console: Console,
    exit: Arc<ExitSignal>,
    event_manager: EventManager<Subscriber>,
    api: Option<VmmSide>,
    vm: Option<MicroVm>,
    /// A boot-specific resource was set, so a snapshot can no longer be loaded.
    configured: bool,
    /// Installed on the vCPU threads as they start, and on this thread once they have.
    filters: seccomp::Filters,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("id", &self.id)
            .field("vm", &self.vm)
            .finish()
    }
}

impl Controller {
    /// A controller for microVM `id`, configured with `resources` so far, serving `api` if
    /// there is one. Nothing runs until [`Controller::run`].
    pub fn new(
        id: String,
        resources: VmResources,
        console: Console,
        exit: Arc<ExitSignal>,
        api: Option<VmmSide>,
        mmds: mmds::SharedStore,
        metrics: Arc<telemetry::Metrics>,
    ) -> Result<Self, Error> {
        let mut event_manager =
            EventManager::<Subscriber>::new().map_err(|e| Error::EventLoop(e.to_string()))?;
        let exit_evt = exit.event().try_clone().map_err(Error::EventFd)?;
        event_manager.add_subscriber(Arc::new(std::sync::Mutex::new(Wakeup {
            evt: exit_evt,
            what: "exit",
        })));
        if let Some(api) = &api {
            let evt = api.wake.try_clone().map_err(Error::EventFd)?;
            event_manager
                .add_subscriber(Arc::new(std::sync::Mutex::new(Wakeup { evt, what: "API" })));
        }
        let metrics_writer = Arc::new(Mutex::new(MetricsWriter::new(metrics.clone())?));
        event_manager.add_subscriber(metrics_writer.clone());
        Ok(Controller {
            id,
            resources,
            mmds,
            metrics,
            metrics_writer,
            console,
            exit,
            event_manager,
            api,
            vm: None,
            configured: false,
            filters: seccomp::Filters::builtin(),
        })
    }

    /// The seccomp filters to install at `InstanceStart` (by default, Ember's own).
    pub fn set_seccomp_filters(&mut self, filters: seccomp::Filters) {
        self.filters = filters;
    }

    /// `InstanceStart`: builds the microVM from the configuration and starts its vCPUs.
    pub fn start(&mut self) -> Result<(), ActionError> {
        if self.vm.is_some() {
            return Err(ActionError::NotSupportedPostBoot);
        }
        let vm = builder::build(&self.resources, &self.host())
            .map_err(|e| ActionError::Start(e.into()))?;
        self.launch(vm)
    }

    fn host(&self) -> builder::Host<'_> {
        builder::Host {
            console: &self.console,
            exit: &self.exit,
            mmds: &self.mmds,
            metrics: &self.metrics,
        }
    }

    /// Starts a built (or restored) microVM's vCPU threads and devices, once the MMDS has
    /// its configured version (pre-boot only; the guest is the only one it concerns).
    fn launch(&mut self, mut vm: MicroVm) -> Result<(), ActionError> {
        if let Some(config) = &self.resources.mmds_config {
            mmds::lock(&self.mmds).configure(config.version, config.imds_compat);
        }
        vm.start(&mut self.event_manager, &self.filters)
            .map_err(|e| ActionError::Start(e.into()))?;
        self.vm = Some(vm);
        // From here this thread serves the guest's devices. (The vCPU threads were started
        // first: a thread inherits its parent's filter, and theirs differs.)
        if let Err(e) = self.filters.install(seccomp::Thread::Vmm) {
            self.exit
                .report(VmExit::VmmError(VmmFailure::Filter(e.to_string())));
            return Err(ActionError::Start(e.into()));
        }
        Ok(())
    }

    /// Runs the event loop until the VM stops (or, before boot, until a signal); returns why.
    pub fn run(mut self) -> VmExit {
        // A microVM started from --config-file is running before any request comes.
        self.publish_state();
        loop {
            if let Some(reason) = self.exit.reason() {
                if let Some(vm) = &self.vm {
                    vm.log_exit_counts();
                }
                // What happened since the last line, so that the file adds up to the run.
                self.flush_metrics();
                return reason;
            }
            // Sleeps until a device, the API or the exit signal has something.
            if let Err(e) = self.event_manager.run() {
                return VmExit::VmmError(VmmFailure::EventLoop(e.to_string()));
            }
            self.serve_api();
        }
    }

    /// Answers every request waiting on the channel.
    fn serve_api(&mut self) {
        loop {
            let Some(api) = &self.api else { return };
            let Ok(action) = api.from_api.try_recv() else {
                return;
            };
            let result = self.handle(action);
            self.publish_state();
            if let Some(api) = &self.api {
                if api.to_api.send(result).is_err() {
                    // The API thread is gone; keep the VM running without it.
                    self.api = None;
                }
            }
        }
    }

    /// Tells the API thread, which answers `GET /` itself, the microVM's state.
    fn publish_state(&self) {
        if let Some(api) = &self.api {
            api.publish(self.state());
        }
    }

    fn flush_metrics(&self) {
        devices::bus::lock(&self.metrics_writer).flush();
    }

    /// `--metrics-path` or `PUT /metrics`.
    pub fn configure_metrics(&mut self, path: &str) -> Result<(), ActionError> {
        Ok(devices::bus::lock(&self.metrics_writer).configure(path)?)
    }

    /// `PUT /logger` (or the config file's `logger`).
    pub fn configure_logger(&mut self, config: &LoggerConfig) -> Result<(), ActionError> {
        telemetry::logger::configure(&config.settings()).map_err(|source| ActionError::Logger {
            path: config.log_path.clone().unwrap_or_default(),
            source,
        })
    }

    /// `PATCH /drives/{id}` after boot: a new backing file, a new rate limiter, or both.
    fn patch_drive(&mut self, patch: PartialDrive) -> ActionResult {
        if !self.resources.has_drive(&patch.drive_id) {
            return Err(ConfigError::NoSuchDrive(patch.drive_id).into());
        }
        patch.validate()?;
        let id = &patch.drive_id;
        let mut block = self.running_device::<Block>(id, ConfigError::NoSuchDrive(id.clone()))?;
        if let Some(path) = &patch.path_on_host {
            block
                .replace_disk(std::path::Path::new(path))
                .map_err(|e| ActionError::DriveUpdate {
                    id: patch.drive_id.clone(),
                    reason: e.to_string(),
                })?;
        }
        if let Some(limiter) = &patch.rate_limiter {
            let (bandwidth, ops) = limiter.updates();
            block.update_limiter(bandwidth, ops);
        }
        drop(block);
        self.resources.patch_drive(&patch);
        Ok(VmmData::Empty)
    }

    /// `BlockDeviceRescan`: the guest is told the drive's current size.
    fn rescan_drive(&mut self, id: String) -> ActionResult {
        self.running_device::<Block>(&id, ConfigError::NoSuchDrive(id.clone()))?
            .rescan()
            .map_err(|e| ActionError::DriveUpdate {
                id,
                reason: e.to_string(),
            })?;
        Ok(VmmData::Empty)
    }

    /// `PATCH /network-interfaces/{id}` after boot: new rate limiters.
    fn patch_network_interface(&mut self, patch: PartialNetworkInterface) -> ActionResult {
        if !self.resources.has_iface(&patch.iface_id) {
            return Err(ConfigError::NoSuchIface(patch.iface_id).into());
        }
        patch.validate()?;
        let id = &patch.iface_id;
        let updates = |l: &Option<RateLimiterConfig>| l.as_ref().map(RateLimiterConfig::updates);
        self.running_device::<Net>(id, ConfigError::NoSuchIface(id.clone()))?
            .update_limiters(
                updates(&patch.rx_rate_limiter),
                updates(&patch.tx_rate_limiter),
            );
        self.resources.patch_network_interface(&patch);
        Ok(VmmData::Empty)
    }

    fn state(&self) -> InstanceState {
        match &self.vm {
            None => InstanceState::NotStarted,
            Some(vm) if vm.is_paused() => InstanceState::Paused,
            Some(_) => InstanceState::Running,
        }
    }

    /// One request; a snapshot, pause or resume that succeeds also records its duration
    /// (`latencies_us`, VMM level).
    pub fn handle(&mut self, action: VmmAction) -> ActionResult {
        log::debug!("API request: {action:?}");
        let timed = action.timed();
        let started = Instant::now();
        let result = self.dispatch(action);
        if let (Some(op), Ok(_)) = (timed, &result) {
            let micros = started.elapsed().as_micros() as u64;
            self.metrics.latencies.record(op, Span::Vmm, micros);
            log::info!("{op:?} took {micros} us in the VMM");
        }
        result
    }

    /// One request, with Firecracker's rules for what is allowed before and after boot.
    fn dispatch(&mut self, action: VmmAction) -> ActionResult {
        match (action.phase(), self.vm.is_some()) {
            (Phase::PreBoot, true) => return Err(ActionError::NotSupportedPostBoot),
            (Phase::PostBoot, false) => return Err(ActionError::NotSupportedPreBoot),
            _ => {}
        }
        match action {
            VmmAction::GetInstanceInfo => Ok(VmmData::InstanceInfo(InstanceInfo::new(
                &self.id,
                self.state(),
            ))),
            VmmAction::GetVersion => Ok(VmmData::Version(FIRECRACKER_API_VERSION.into())),
            VmmAction::GetMachineConfig => Ok(VmmData::MachineConfig(
                self.resources.machine_config.clone(),
            )),
            VmmAction::GetFullConfig => {
                Ok(VmmData::FullConfig(Box::new(self.resources.to_config())))
            }
            VmmAction::PutMachineConfig(machine) => {
                self.configured(|r| r.set_machine_config(machine))
            }
            VmmAction::PatchMachineConfig(update) => {
                let machine = update.apply(&self.resources.machine_config);
                self.configured(|r| r.set_machine_config(machine))
            }
            VmmAction::PutBootSource(boot) => self.configured(|r| r.set_boot_source(boot)),
            VmmAction::PutDrive(drive) => self.configured(|r| r.replace_drive(drive)),
            VmmAction::PutNetworkInterface(iface) => {
                self.configured(|r| r.replace_network_interface(iface))
            }
            VmmAction::PutMmdsConfig(config) => self.configured(|r| r.set_mmds_config(config)),
            VmmAction::PutEntropy(config) => self.configured(|r| r.set_entropy(config)),
            VmmAction::PutVsock(config) => self.configured(|r| r.set_vsock(config)),
            VmmAction::PutSerial(config) => self.configured(|r| r.set_serial(config)),
            VmmAction::PutCpuConfig(template) => self.configured(|r| {
                r.set_cpu_template(template);
                Ok(())
            }),
            VmmAction::PutBalloon(config) => self.configured(|r| r.set_balloon(config)),
            VmmAction::PatchBalloon(update) => self.patch_balloon(update),
            VmmAction::PatchBalloonStats(update) => self.patch_balloon_stats(update),
            VmmAction::GetBalloon => match self.resources.balloon() {
                Some(b) => Ok(VmmData::Balloon(b.clone())),
                None => Err(ConfigError::NoBalloon.into()),
            },
            VmmAction::GetBalloonStats => self.balloon_stats(),
            VmmAction::StartBalloonHinting(cmd) => {
                self.with_balloon(|b| b.start_hinting(cmd).map(|()| VmmData::Empty))
            }
            VmmAction::StopBalloonHinting => {
                self.with_balloon(|b| b.stop_hinting().map(|()| VmmData::Empty))
            }
            VmmAction::GetBalloonHinting => {
                self.with_balloon(|b| b.hinting_status().map(VmmData::HintingStatus))
            }
            VmmAction::PutMmds(value) => {
                mmds::lock(&self.mmds).put(value)?;
                Ok(VmmData::Empty)
            }
            VmmAction::PatchMmds(patch) => {
                mmds::lock(&self.mmds).patch(&patch)?;
                Ok(VmmData::Empty)
            }
            VmmAction::GetMmds => Ok(VmmData::Mmds(mmds::lock(&self.mmds).document())),
            VmmAction::PatchNetworkInterface(patch) => self.patch_network_interface(patch),
            VmmAction::PutLogger(config) => self.configure_logger(&config).map(|()| VmmData::Empty),
            VmmAction::PutMetrics(config) => self
                .configure_metrics(&config.metrics_path)
                .map(|()| VmmData::Empty),
            VmmAction::InstanceStart => self.start().map(|()| VmmData::Empty),
            VmmAction::PatchDrive(patch) => self.patch_drive(patch),
            VmmAction::RescanDrive(id) => self.rescan_drive(id),
            VmmAction::FlushMetrics => {
                self.flush_metrics();
                Ok(VmmData::Empty)
            }
            VmmAction::SendCtrlAltDel => {
                self.running()?.send_ctrl_alt_del();
                Ok(VmmData::Empty)
            }
            VmmAction::Pause => {
                let vm = self.running()?;
                if !vm.is_paused() {
                    vm.pause().map_err(ActionError::Pause)?;
                }
                Ok(VmmData::Empty)
            }
            VmmAction::Resume => {
                self.running()?.resume();
                Ok(VmmData::Empty)
            }
            VmmAction::CreateSnapshot(params) => {
                let setup = Setup {
                    config: self.resources.to_config(),
                    boot_timer: self.resources.boot_timer.is_some(),
                    pci: self.resources.pci_enabled,
                    mmds: mmds::lock(&self.mmds).document(),
                };
                self.running()?.create_snapshot(&params, setup)?;
                Ok(VmmData::Empty)
            }
            VmmAction::LoadSnapshot(params) => self.load_snapshot(&params),
        }
    }

    /// A boot-specific setting; once one is taken, a snapshot can no longer be loaded.
    fn configured(
        &mut self,
        set: impl FnOnce(&mut VmResources) -> Result<(), ConfigError>,
    ) -> ActionResult {
        set(&mut self.resources)?;
        self.configured = true;
        Ok(VmmData::Empty)
    }

    /// `PUT /snapshot/load`: rebuilds the snapshot's microVM, paused unless `resume_vm`.
    fn load_snapshot(&mut self, params: &SnapshotLoadParams) -> ActionResult {
        let fail = ActionError::LoadSnapshot;
        if self.configured {
            return Err(fail(LoadError::Configured.into()));
        }
        let prepared = params.prepare().map_err(|e| fail(e.into()))?;
        let vsock_path = prepared.resources.vsock().map(|(c, _)| c.uds_path.clone());
        let result = self.restore(params, prepared);
        if result.is_err() {
            // The vsock socket was bound for the microVM that is not there.
            if let Some(path) = vsock_path {
                let _ = std::fs::remove_file(path);
            }
        }
        result.map(|()| VmmData::Empty)
    }

    /// Builds and starts the microVM of a checked load request.
    fn restore(
        &mut self,
        params: &SnapshotLoadParams,
        mut prepared: Prepared,
    ) -> Result<(), ActionError> {
        // `PUT /serial` is not part of a snapshot: what this process was given holds.
        prepared.resources.serial = self.resources.serial.clone();
        let (vm, resources) = snapshot::restore(params, prepared, &self.host())
            .map_err(|e| ActionError::LoadSnapshot(e.into()))?;
        self.resources = resources;
        self.configured = true;
        self.launch(vm)
    }

    /// `PATCH /balloon`: the new target is recorded, and given to the running balloon.
    fn patch_balloon(&mut self, update: BalloonUpdate) -> ActionResult {
        self.resources.patch_balloon(update)?;
        if let Some(balloon) = self.vm.as_ref().and_then(|vm| vm.only::<Balloon>()) {
            devices::bus::lock(balloon).set_target_mib(update.amount_mib);
        }
        Ok(VmmData::Empty)
    }

    /// `PATCH /balloon/statistics`.
    fn patch_balloon_stats(&mut self, update: BalloonStatsUpdate) -> ActionResult {
        let booted = self.vm.is_some();
        self.resources.patch_balloon_stats(update, booted)?;
        if let Some(balloon) = self.vm.as_ref().and_then(|vm| vm.only::<Balloon>()) {
            devices::bus::lock(balloon).set_stats_interval(update.stats_polling_interval_s);
        }
        Ok(VmmData::Empty)
    }

    /// `GET /balloon/statistics`: the guest's latest report, once the balloon runs.
    fn balloon_stats(&mut self) -> ActionResult {
        let config = self.resources.balloon().ok_or(ConfigError::NoBalloon)?;
        if config.stats_polling_interval_s == 0 {
            return Err(ConfigError::BalloonStatsDisabled.into());
        }
        let vm = self.running()?;
        let balloon = vm.only::<Balloon>().ok_or(ConfigError::NoBalloon)?;
        let stats = devices::bus::lock(balloon).stats();
        Ok(VmmData::BalloonStats(stats))
    }

    /// `/balloon/hinting/*`: after boot, on the running balloon.
    fn with_balloon(
        &mut self,
        op: impl FnOnce(&mut Balloon) -> Result<VmmData, HintingError>,
    ) -> ActionResult {
        let vm = self.running()?;
        let balloon = vm.only::<Balloon>().ok_or(ConfigError::NoBalloon)?;
        let answer = op(&mut devices::bus::lock(balloon))?;
        Ok(answer)
    }

    fn running(&mut self) -> Result<&mut MicroVm, ActionError> {
        self.vm.as_mut().ok_or(ActionError::NotSupportedPreBoot)
    }

    /// The running microVM's device `id` of type `D`, locked; `missing` if it has none.
    fn running_device<D: 'static>(
        &mut self,
        id: &str,
        missing: ConfigError,
    ) -> Result<std::sync::MutexGuard<'_, D>, ActionError> {
        let vm = self.running()?;
        let device = vm.device::<D>(id).ok_or(missing)?;
        Ok(devices::bus::lock(device))
    }
}
