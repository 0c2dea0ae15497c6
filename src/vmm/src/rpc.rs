//! What the API thread may ask of the VMM thread, and what it gets back. The API thread parses
//! and routes requests; only the VMM thread ([`crate::controller`]) acts on them. Requests go
//! through a channel, with an eventfd that wakes the VMM thread's event loop; the answer
//! comes back through a channel the API thread sleeps on. Neither thread polls: on a host
//! whose cores are all busy, a thread that spins for its answer takes the CPU from the one
//! that would give it.
//!
//! `GET /` and `GET /version` change nothing and read only what the VMM thread publishes
//! here, so the API thread answers them itself, without waking the VMM thread.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, Sender};
use std::sync::Arc;

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

use crate::config::{
    BalloonDeviceConfig, BalloonStatsUpdate, BalloonUpdate, BootSourceConfig, ConfigError,
    DriveConfig, EntropyDeviceConfig, LoggerConfig, MachineConfig, MachineConfigUpdate,
    MetricsConfig, MmdsConfig, NetworkInterfaceConfig, PartialDrive, PartialNetworkInterface,
    VmConfig, VsockDeviceConfig,
};

/// One request, already parsed into Ember's configuration model.
#[derive(Debug, Clone, PartialEq)]
pub enum VmmAction {
    GetInstanceInfo,
    GetVersion,
    GetMachineConfig,
    PutMachineConfig(MachineConfig),
    PatchMachineConfig(MachineConfigUpdate),
    PutBootSource(BootSourceConfig),
    PutDrive(DriveConfig),
    PatchDrive(PartialDrive),
    /// `BlockDeviceRescan`: the drive's file changed size on the host.
    RescanDrive(String),
    PutNetworkInterface(NetworkInterfaceConfig),
    PatchNetworkInterface(PartialNetworkInterface),
    PutMmdsConfig(MmdsConfig),
    PutEntropy(EntropyDeviceConfig),
    PutVsock(VsockDeviceConfig),
    PutCpuConfig(crate::config::CpuTemplate),
    PutSerial(crate::config::SerialConfig),
    PutBalloon(BalloonDeviceConfig),
    PatchBalloon(BalloonUpdate),
    PatchBalloonStats(BalloonStatsUpdate),
    GetBalloon,
    GetBalloonStats,
    StartBalloonHinting(devices::virtio::balloon::StartHintingCmd),
    StopBalloonHinting,
    GetBalloonHinting,
    PutMmds(serde_json::Value),
    PatchMmds(serde_json::Value),
    GetMmds,
    GetFullConfig,
    PutLogger(LoggerConfig),
    PutMetrics(MetricsConfig),
    InstanceStart,
    SendCtrlAltDel,
    FlushMetrics,
    Pause,
    Resume,
    CreateSnapshot(crate::snapshot::SnapshotCreateParams),
    LoadSnapshot(crate::snapshot::load::SnapshotLoadParams),
}

/// When Firecracker allows an action: before the microVM starts, after, or at any time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    PreBoot,
    PostBoot,
    Any,
}

impl VmmAction {
    /// When the action is allowed. Every action is listed, so a new one must choose.
    pub fn phase(&self) -> Phase {
        use VmmAction::*;
        match self {
            PutMachineConfig(_) | PatchMachineConfig(_) | PutBootSource(_) => Phase::PreBoot,
            PutDrive(_) | PutNetworkInterface(_) | PutMmdsConfig(_) => Phase::PreBoot,
            PutEntropy(_) | PutVsock(_) | PutCpuConfig(_) | PutSerial(_) => Phase::PreBoot,
            PutBalloon(_) | PutLogger(_) | PutMetrics(_) => Phase::PreBoot,
            InstanceStart | LoadSnapshot(_) => Phase::PreBoot,
            PatchDrive(_) | RescanDrive(_) | PatchNetworkInterface(_) => Phase::PostBoot,
            SendCtrlAltDel | FlushMetrics | Pause | Resume | CreateSnapshot(_) => Phase::PostBoot,
            GetInstanceInfo | GetVersion | GetMachineConfig | GetFullConfig => Phase::Any,
            PatchBalloon(_) | PatchBalloonStats(_) | GetBalloon | GetBalloonStats => Phase::Any,
            StartBalloonHinting(_) | StopBalloonHinting | GetBalloonHinting => Phase::Any,
            PutMmds(_) | PatchMmds(_) | GetMmds => Phase::Any,
        }
    }

    /// The operation whose duration `latencies_us` reports, if this is one.
    pub fn timed(&self) -> Option<telemetry::Timed> {
        use telemetry::Timed;
        match self {
            VmmAction::CreateSnapshot(params) => Some(match params.snapshot_type {
                crate::snapshot::SnapshotType::Full => Timed::FullCreateSnapshot,
                crate::snapshot::SnapshotType::Diff => Timed::DiffCreateSnapshot,
            }),
            VmmAction::LoadSnapshot(_) => Some(Timed::LoadSnapshot),
            VmmAction::Pause => Some(Timed::PauseVm),
            VmmAction::Resume => Some(Timed::ResumeVm),
            _ => None,
        }
    }
}

/// `GET /`: Firecracker's `InstanceInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceInfo {
    pub app_name: String,
    pub id: String,
    pub state: String,
    pub vmm_version: String,
}

/// The microVM's state, as `InstanceInfo.state` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum InstanceState {
    NotStarted,
    Running,
    Paused,
}

impl InstanceState {
    pub fn name(self) -> &'static str {
        match self {
            InstanceState::NotStarted => "Not started",
            InstanceState::Running => "Running",
            InstanceState::Paused => "Paused",
        }
    }

    /// The state a published byte holds (only ever written from an `InstanceState`).
    fn from_u8(byte: u8) -> Self {
        match byte {
            1 => InstanceState::Running,
            2 => InstanceState::Paused,
            _ => InstanceState::NotStarted,
        }
    }
}

/// Firecracker's `app_name`, here Ember's.
pub const APP_NAME: &str = "Ember";

/// The Firecracker API version whose paths and bodies Ember serves (`GET /version`).
pub const FIRECRACKER_API_VERSION: &str = "1.16.1";

impl InstanceInfo {
    /// `GET /`'s answer for microVM `id` in `state`.
    pub fn new(id: &str, state: InstanceState) -> Self {
        InstanceInfo {
            app_name: APP_NAME.into(),
            id: id.into(),
            state: state.name().into(),
            vmm_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// What `GET /` shows, as the VMM thread last published it.
#[derive(Debug)]
struct Published {
    id: String,
    /// An [`InstanceState`] as its `u8`.
    state: AtomicU8,
}

/// A successful answer.
#[derive(Debug, Clone)]
pub enum VmmData {
    Empty,
    InstanceInfo(InstanceInfo),
    /// The Firecracker API version Ember implements.
    Version(String),
    MachineConfig(MachineConfig),
    FullConfig(Box<VmConfig>),
    Mmds(serde_json::Value),
    Balloon(BalloonDeviceConfig),
    BalloonStats(devices::virtio::balloon::BalloonStats),
    HintingStatus(devices::virtio::balloon::HintingStatus),
}

/// Why `InstanceStart` failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Build(#[from] crate::builder::BuildError),
    #[error(transparent)]
    Launch(#[from] crate::microvm::Error),
    #[error(transparent)]
    Seccomp(#[from] seccomp::Error),
}

/// A refused or failed request; the API shows it as `{"fault_message": "<this sentence>"}`.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("Start microvm error: {0}")]
    Start(#[source] StartError),
    #[error("The requested operation is not supported before starting the microVM.")]
    NotSupportedPreBoot,
    #[error("The requested operation is not supported after starting the microVM.")]
    NotSupportedPostBoot,
    #[error(transparent)]
    Hinting(#[from] devices::virtio::balloon::HintingError),
    #[error(transparent)]
    Mmds(#[from] mmds::StoreError),
    #[error("the microVM could not be paused: {0}")]
    Pause(#[source] crate::microvm::Error),
    #[error("drive {id}: {reason}")]
    DriveUpdate { id: String, reason: String },
    #[error("Cannot initialize the logger: cannot open {path}: {source}")]
    Logger {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Metrics(#[from] crate::metrics_writer::Error),
    #[error("Cannot create the snapshot: {0}")]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error("Cannot load the snapshot: {0}")]
    LoadSnapshot(#[source] crate::snapshot::SnapshotError),
}

pub type ActionResult = Result<VmmData, ActionError>;

/// The API thread's end.
#[derive(Debug)]
pub struct ApiSide {
    to_vmm: Sender<VmmAction>,
    from_vmm: Receiver<ActionResult>,
    wake: EventFd,
    published: Arc<Published>,
}

/// The VMM thread's end.
#[derive(Debug)]
pub struct VmmSide {
    pub(crate) from_api: Receiver<VmmAction>,
    pub(crate) to_api: Sender<ActionResult>,
    pub(crate) wake: EventFd,
    published: Arc<Published>,
}

/// A connected pair of ends, for microVM `id`.
pub fn channel(id: &str) -> std::io::Result<(ApiSide, VmmSide)> {
    let (to_vmm, from_api) = mpsc::channel();
    let (to_api, from_vmm) = mpsc::channel();
    let wake = EventFd::new(libc::EFD_NONBLOCK)?;
    let published = Arc::new(Published {
        id: id.to_string(),
        state: AtomicU8::new(0),
    });
    let api = ApiSide {
        to_vmm,
        from_vmm,
        wake: wake.try_clone()?,
        published: published.clone(),
    };
    Ok((
        api,
        VmmSide {
            from_api,
            to_api,
            wake,
            published,
        },
    ))
}

impl ApiSide {
    /// Sends one request and sleeps until its answer comes. Fails only when the VMM thread
    /// is gone, which happens when ember is exiting.
    pub fn call(&self, action: VmmAction) -> Result<ActionResult, RecvError> {
        match action {
            VmmAction::GetInstanceInfo => {
                let state = InstanceState::from_u8(self.published.state.load(Ordering::Acquire));
                return Ok(Ok(VmmData::InstanceInfo(InstanceInfo::new(
                    &self.published.id,
                    state,
                ))));
            }
            VmmAction::GetVersion => {
                return Ok(Ok(VmmData::Version(FIRECRACKER_API_VERSION.into())))
            }
            _ => {}
        }
        self.to_vmm.send(action).map_err(|_| RecvError)?;
        let _ = self.wake.write(1);
        self.from_vmm.recv()
    }
}

impl VmmSide {
    /// Publishes the microVM's state for `GET /`; called before each answer is sent, so
    /// that a client sees the state its request left.
    pub(crate) fn publish(&self, state: InstanceState) {
        self.published.state.store(state as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_of(api: &ApiSide) -> String {
        match api.call(VmmAction::GetInstanceInfo) {
            Ok(Ok(VmmData::InstanceInfo(info))) => {
                assert_eq!(
                    (info.app_name.as_str(), info.id.as_str()),
                    (APP_NAME, "vm-7")
                );
                info.state
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn get_root_and_version_are_answered_without_the_vmm_thread() {
        // Nothing serves `vmm`: a request that went to it would wait for ever.
        let (api, vmm) = channel("vm-7").unwrap();
        assert_eq!(state_of(&api), "Not started");
        vmm.publish(InstanceState::Running);
        assert_eq!(state_of(&api), "Running");
        vmm.publish(InstanceState::Paused);
        assert_eq!(state_of(&api), "Paused");
        match api.call(VmmAction::GetVersion) {
            Ok(Ok(VmmData::Version(v))) => assert_eq!(v, FIRECRACKER_API_VERSION),
            other => panic!("{other:?}"),
        }
        assert!(
            vmm.from_api.try_recv().is_err(),
            "nothing reached the VMM thread"
        );
    }

    #[test]
    fn other_requests_go_to_the_vmm_thread_and_wake_it() {
        let (api, vmm) = channel("vm-7").unwrap();
        let server = std::thread::spawn(move || {
            let action = vmm.from_api.recv().unwrap();
            assert_eq!(vmm.wake.read().unwrap(), 1, "the event loop was woken");
            vmm.to_api.send(Ok(VmmData::Empty)).unwrap();
            action
        });
        assert!(matches!(
            api.call(VmmAction::GetMachineConfig),
            Ok(Ok(VmmData::Empty))
        ));
        assert_eq!(server.join().unwrap(), VmmAction::GetMachineConfig);
    }
}
