//! The VMM thread. It owns the configuration ([`VmResources`]) and, after `InstanceStart`, the
//! running [`MicroVm`]; it runs the event loop and, each time the loop wakes, answers the
//! API's requests with Firecracker's pre-boot and post-boot rules.

use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberOps};

use crate::builder::{self, Console};
use crate::event_loop::{Subscriber, Wakeup};
use crate::microvm::MicroVm;
use crate::resources::VmResources;
use crate::rpc::{self, ActionError, ActionResult, InstanceInfo, VmmAction, VmmData, VmmSide};
use crate::{ExitSignal, VmExit};

/// How long the VMM thread polls for the next request after answering one.
const API_POLL: Duration = Duration::from_micros(200);

/// The Firecracker API version whose paths and bodies Ember serves (`GET /version`).
pub const FIRECRACKER_API_VERSION: &str = "1.16.1";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the event loop: {0}")]
    EventLoop(String),
    #[error("cannot copy an eventfd: {0}")]
    EventFd(#[source] std::io::Error),
}

pub struct Controller {
    id: String,
    resources: VmResources,
    /// The MMDS data store: the API fills it before and after boot, the guest reads it.
    mmds: mmds::SharedStore,
    console: Console,
    exit: Arc<ExitSignal>,
    event_manager: EventManager<Subscriber>,
    api: Option<VmmSide>,
    vm: Option<MicroVm>,
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
        Ok(Controller {
            id,
            resources,
            mmds,
            console,
            exit,
            event_manager,
            api,
            vm: None,
        })
    }

    /// `InstanceStart`: builds the microVM from the configuration and starts its vCPUs.
    pub fn start(&mut self) -> Result<(), ActionError> {
        if self.vm.is_some() {
            return Err(ActionError::NotSupportedPostBoot);
        }
        // The MMDS configuration is pre-boot only; the guest is the only one it concerns.
        if let Some(config) = &self.resources.mmds_config {
            mmds::lock(&self.mmds).configure(config.version, config.imds_compat);
        }
        let mut vm = builder::build(&self.resources, &self.console, &self.exit, &self.mmds)
            .map_err(|e| ActionError::Start(e.to_string()))?;
        vm.start(&mut self.event_manager)
            .map_err(|e| ActionError::Start(e.to_string()))?;
        self.vm = Some(vm);
        Ok(())
    }

    /// Runs the event loop until the VM stops (or, before boot, until a signal); returns why.
    pub fn run(mut self) -> VmExit {
        let mut poll_until = None;
        loop {
            if let Some(reason) = self.exit.reason() {
                if let Some(vm) = &self.vm {
                    vm.log_exit_counts();
                }
                return reason;
            }
            // Right after a request, poll instead of sleeping for a moment: clients send
            // requests in bursts, and waking a sleeping thread costs more than the request.
            let polling = poll_until.is_some_and(|t| Instant::now() < t);
            let ran = match polling {
                true => self.event_manager.run_with_timeout(0),
                false => self.event_manager.run(),
            };
            if let Err(e) = ran {
                return VmExit::VmmError(format!("the event loop failed: {e}"));
            }
            if self.serve_api() > 0 {
                poll_until = Some(Instant::now() + API_POLL);
            } else if polling {
                std::hint::spin_loop();
            }
        }
    }

    /// Answers every request waiting on the channel; returns how many there were.
    fn serve_api(&mut self) -> usize {
        let mut served = 0;
        loop {
            let Some(api) = &self.api else { return served };
            let Ok(action) = api.from_api.try_recv() else {
                return served;
            };
            served += 1;
            let result = self.handle(action);
            if let Some(api) = &self.api {
                if api.to_api.send(result).is_err() {
                    // The API thread is gone; keep the VM running without it.
                    self.api = None;
                }
            }
        }
    }

    fn state(&self) -> &'static str {
        match &self.vm {
            None => rpc::STATE_NOT_STARTED,
            Some(vm) if vm.is_paused() => rpc::STATE_PAUSED,
            Some(_) => rpc::STATE_RUNNING,
        }
    }

    /// One request, with Firecracker's rules for what is allowed before and after boot.
    pub fn handle(&mut self, action: VmmAction) -> ActionResult {
        log::debug!("API request: {action:?}");
        let booted = self.vm.is_some();
        let empty = |r: Result<(), crate::config::ConfigError>| {
            r.map(|()| VmmData::Empty).map_err(ActionError::Config)
        };
        match action {
            VmmAction::GetInstanceInfo => Ok(VmmData::InstanceInfo(InstanceInfo {
                app_name: "Ember".into(),
                id: self.id.clone(),
                state: self.state().into(),
                vmm_version: env!("CARGO_PKG_VERSION").into(),
            })),
            VmmAction::GetVersion => Ok(VmmData::Version(FIRECRACKER_API_VERSION.into())),
            VmmAction::GetMachineConfig => Ok(VmmData::MachineConfig(
                self.resources.machine_config.clone(),
            )),
            VmmAction::GetFullConfig => {
                Ok(VmmData::FullConfig(Box::new(self.resources.to_config())))
            }
            VmmAction::PutMachineConfig(_)
            | VmmAction::PatchMachineConfig(_)
            | VmmAction::PutBootSource(_)
            | VmmAction::PutDrive(_)
            | VmmAction::PutNetworkInterface(_)
            | VmmAction::PutMmdsConfig(_)
            | VmmAction::InstanceStart
                if booted =>
            {
                Err(ActionError::NotSupportedPostBoot)
            }
            VmmAction::PatchDrive(_)
            | VmmAction::PatchNetworkInterface(_)
            | VmmAction::SendCtrlAltDel
            | VmmAction::FlushMetrics
            | VmmAction::Pause
            | VmmAction::Resume
                if !booted =>
            {
                Err(ActionError::NotSupportedPreBoot)
            }
            VmmAction::PutMachineConfig(machine) => {
                empty(self.resources.set_machine_config(machine))
            }
            VmmAction::PatchMachineConfig(update) => {
                let machine = update.apply(&self.resources.machine_config);
                empty(self.resources.set_machine_config(machine))
            }
            VmmAction::PutBootSource(boot) => empty(self.resources.set_boot_source(boot)),
            VmmAction::PutDrive(drive) => empty(self.resources.replace_drive(drive)),
            VmmAction::PutNetworkInterface(iface) => {
                empty(self.resources.replace_network_interface(iface))
            }
            VmmAction::PutMmdsConfig(config) => empty(self.resources.set_mmds_config(config)),
            VmmAction::PutMmds(value) => {
                mmds::lock(&self.mmds).put(value)?;
                Ok(VmmData::Empty)
            }
            VmmAction::PatchMmds(patch) => {
                mmds::lock(&self.mmds).patch(&patch)?;
                Ok(VmmData::Empty)
            }
            VmmAction::GetMmds => Ok(VmmData::Mmds(mmds::lock(&self.mmds).document())),
            VmmAction::PatchNetworkInterface(patch) => {
                if !self.resources.has_iface(&patch.iface_id) {
                    return Err(ActionError::Config(
                        crate::config::ConfigError::NoSuchIface(patch.iface_id),
                    ));
                }
                match patch.asks_for_limiter() {
                    true => Err(ActionError::NotYet(crate::config::Later::RateLimiters)),
                    false => Ok(VmmData::Empty),
                }
            }
            VmmAction::InstanceStart => self.start().map(|()| VmmData::Empty),
            VmmAction::PatchDrive(patch) => {
                if !self.resources.has_drive(&patch.drive_id) {
                    return Err(ActionError::Config(
                        crate::config::ConfigError::NoSuchDrive(patch.drive_id),
                    ));
                }
                Err(ActionError::NotYet(crate::config::Later::DriveUpdates))
            }
            // Metrics come later; with none configured, Firecracker's flush writes nothing.
            VmmAction::FlushMetrics => Ok(VmmData::Empty),
            VmmAction::SendCtrlAltDel => {
                self.running()?.send_ctrl_alt_del();
                Ok(VmmData::Empty)
            }
            VmmAction::Pause => {
                let vm = self.running()?;
                if !vm.is_paused() {
                    vm.pause().map_err(|e| ActionError::Pause(e.to_string()))?;
                }
                Ok(VmmData::Empty)
            }
            VmmAction::Resume => {
                self.running()?.resume();
                Ok(VmmData::Empty)
            }
        }
    }

    fn running(&mut self) -> Result<&mut MicroVm, ActionError> {
        self.vm.as_mut().ok_or(ActionError::NotSupportedPreBoot)
    }
}
