//! containerd's task service: each request mapped onto the sandbox's VM and its guest
//! agent. The first container of a sandbox boots the VM; the last one's shutdown ends it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use containerd_shim::api::{self, Status};
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::ttrpc::{self, Code};
use containerd_shim::{ExitSignal, TtrpcContext, TtrpcResult};
use serde_json::{json, Value};

use crate::config::Config;
use crate::events::{timestamp, Events};
use crate::host_mounts;
use crate::layers;
use crate::network;
use crate::process::{Process, Status as ProcStatus, StdioPaths};
use crate::sandbox::{self, Sandbox};
use crate::shim::{grouping, read_spec, sandbox_dir};
use crate::template;

#[derive(Debug)]
struct Container {
    bundle: String,
    slot: usize,
    dir: PathBuf,
    init: Arc<Process>,
    execs: HashMap<String, Arc<Process>>,
}

struct Inner {
    namespace: String,
    events: Events,
    exit: Arc<ExitSignal>,
    /// Held while the VM boots, so that a second container waits for the first's VM.
    sandbox: Mutex<Option<Arc<Sandbox>>>,
    containers: Mutex<HashMap<String, Container>>,
    /// The CNI network namespace the sandbox's TAP was made in.
    network: Mutex<Option<PathBuf>>,
}

#[derive(Clone)]
pub struct Service(Arc<Inner>);

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("namespace", &self.0.namespace)
            .finish_non_exhaustive()
    }
}

fn error(code: Code, message: impl Into<String>) -> ttrpc::Error {
    let message = message.into();
    log::warn!("{message}");
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

/// containerd names a container's init by an empty exec ID; the agent by none.
fn exec_of(exec_id: &str) -> Option<&str> {
    (!exec_id.is_empty()).then_some(exec_id)
}

fn failed(message: impl std::fmt::Display) -> ttrpc::Error {
    error(Code::FAILED_PRECONDITION, message.to_string())
}

impl Service {
    pub fn new(namespace: &str, events: Events, exit: Arc<ExitSignal>) -> Service {
        Service(Arc::new(Inner {
            namespace: namespace.to_string(),
            events,
            exit,
            sandbox: Mutex::new(None),
            containers: Mutex::new(HashMap::new()),
            network: Mutex::new(None),
        }))
    }

    fn containers(&self) -> MutexGuard<'_, HashMap<String, Container>> {
        self.0.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running sandbox (booted by the first container).
    fn sandbox(&self) -> TtrpcResult<Arc<Sandbox>> {
        let sandbox = self.0.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        sandbox
            .clone()
            .ok_or_else(|| error(Code::NOT_FOUND, "the sandbox has no VM"))
    }

    /// The sandbox's VM, booted now if this is its first container.
    fn sandbox_for(&self, config: &Config, spec: &Value, id: &str) -> TtrpcResult<Arc<Sandbox>> {
        let mut slot = self.0.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sandbox) = slot.as_ref() {
            if let Some(why) = sandbox.ended() {
                return Err(failed(format!("the sandbox's VM has ended ({why})")));
            }
            return Ok(sandbox.clone());
        }
        let limit = spec["linux"]["resources"]["memory"]["limit"]
            .as_i64()
            .filter(|&l| l > 0);
        let mem = match limit {
            Some(bytes) => {
                (bytes as u64)
                    .div_ceil(1 << 20)
                    .min(u64::from(u32::MAX / 2)) as u32
                    + config.overhead_mib
            }
            None => config.mem_size_mib,
        };
        let dir = sandbox_dir(config, &self.0.namespace, &grouping(spec, id));
        // A CNI network namespace: a TAP there, the VM's NIC on it, the guest's eth0 given
        // CNI's address and MAC.
        let netns = network::netns_of(spec);
        let net = match &netns {
            Some(ns) => Some(network::prepare(ns).map_err(failed)?),
            None => None,
        };
        let undo = |e: String| {
            sandbox::discard(&dir);
            if let Some(ns) = &netns {
                network::tear_down(ns);
            }
            failed(e)
        };
        let vm = match config.start_from_template {
            true => template::ensure(config, mem, netns.as_deref())
                .and_then(|t| Sandbox::restore(config, &t, dir.clone(), netns.as_deref())),
            false => Sandbox::boot(config, dir.clone(), mem, netns.as_deref()),
        }
        .map_err(|e| undo(e.to_string()))?;
        if let Some(net) = &net {
            let configured = network::connect(net)
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    let request = json!({"op": "network", "interface": "eth0",
                        "address": net.address, "gateway": net.gateway, "mtu": net.mtu,
                        "mac": net.mac});
                    vm.agent.ask(request).map(drop).map_err(|e| e.to_string())
                });
            if let Err(e) = configured {
                vm.stop();
                return Err(undo(e));
            }
            *self.0.network.lock().unwrap_or_else(|e| e.into_inner()) = netns;
        }
        let sandbox = Arc::new(vm);
        *slot = Some(sandbox.clone());
        Ok(sandbox)
    }

    /// The process `exec_id` (empty: the init) of container `id`.
    fn process(&self, id: &str, exec_id: &str) -> TtrpcResult<Arc<Process>> {
        let containers = self.containers();
        let c = containers
            .get(id)
            .ok_or_else(|| error(Code::NOT_FOUND, format!("container {id} does not exist")))?;
        if exec_id.is_empty() {
            return Ok(c.init.clone());
        }
        c.execs.get(exec_id).cloned().ok_or_else(|| {
            error(
                Code::NOT_FOUND,
                format!("process {exec_id} of container {id} does not exist"),
            )
        })
    }

    fn do_create(&self, req: &api::CreateTaskRequest) -> TtrpcResult<u32> {
        let id = req.id.as_str();
        if self.containers().contains_key(id) {
            return Err(error(
                Code::ALREADY_EXISTS,
                format!("container {id} exists"),
            ));
        }
        if !req.checkpoint.is_empty() {
            return Err(error(
                Code::UNIMPLEMENTED,
                "the Ember shim does not restore container checkpoints",
            ));
        }
        let start = Instant::now();
        let config = Config::load().map_err(failed)?;
        let bundle = Path::new(&req.bundle);
        let mut spec = read_spec(bundle).map_err(|e| error(Code::INVALID_ARGUMENT, e))?;
        // Before a VM is started for it: a mount that cannot reach the guest fails here.
        let host_paths =
            host_mounts::to_guest(&mut spec).map_err(|e| error(Code::INVALID_ARGUMENT, e))?;
        let sandbox = self.sandbox_for(&config, &spec, id)?;
        let vm_ready = start.elapsed();
        let dir = sandbox.dir.join("containers").join(id);
        let disks = layers::prepare(
            &req.rootfs,
            bundle,
            &config.cache_dir.join("layers"),
            &dir,
            config.writable_layer_mib,
        )
        .map_err(failed)?;
        let disks_ready = start.elapsed();
        let slot = sandbox
            .attach(id, &disks.image, &disks.writable)
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(&dir);
                failed(e)
            })?;
        let undo = |e: String| {
            sandbox.detach(slot);
            let _ = std::fs::remove_dir_all(&dir);
            failed(e)
        };
        let request = json!({"op": "create", "id": id, "spec": spec, "host_paths": host_paths, "rootfs": {
            "device": format!("layers{slot}"), "fstype": "ext4", "size": disks.image_bytes,
            "writable": {"device": format!("upper{slot}"), "fstype": "ext4", "size": disks.writable_bytes}}});
        let answer = sandbox
            .agent
            .ask(request)
            .map_err(|e| undo(e.to_string()))?;
        log::info!(
            "create {id}: VM ready at {vm_ready:?}, disks at {disks_ready:?}, created in the guest at {:?}",
            start.elapsed()
        );
        let pid = answer["pid"].as_u64().unwrap_or(0) as u32;
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let init = Arc::new(Process::new(id, None, stdio, pid));
        if let Err(e) = init.connect_stdio(&sandbox.agent) {
            let _ = sandbox.agent.ask(json!({"op": "delete", "id": id}));
            return Err(undo(e.to_string()));
        }
        let container = Container {
            bundle: req.bundle.clone(),
            slot,
            dir,
            init,
            execs: HashMap::new(),
        };
        self.containers().insert(id.to_string(), container);
        self.0.events.created(id, &req.bundle, pid);
        Ok(pid)
    }

    /// Waits for the process's exit in the background; containerd hears of it.
    fn watch(&self, process: Arc<Process>, agent: crate::agent::Agent) {
        let events = self.clone();
        std::thread::spawn(move || {
            if process.watch(&agent) {
                let (_, pid, status, at) = process.snapshot();
                let exec = process.exec_id.as_deref().unwrap_or(&process.id);
                events.0.events.exited(
                    &process.id,
                    exec,
                    pid,
                    status,
                    at.unwrap_or(SystemTime::now()),
                );
            }
        });
    }
}

impl containerd_shim::Task for Service {
    fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        let pid = self.do_create(&req)?;
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        let process = self.process(&req.id, &req.exec_id)?;
        let sandbox = self.sandbox()?;
        let exec = exec_of(&req.exec_id);
        let begin = Instant::now();
        let answer = sandbox
            .agent
            .ask(json!({"op": "start", "id": req.id, "exec_id": exec}))
            .map_err(failed)?;
        log::info!(
            "start {}: started in the guest in {:?}",
            req.id,
            begin.elapsed()
        );
        let pid = answer["pid"].as_u64().unwrap_or(0) as u32;
        process.started(pid);
        self.watch(process, sandbox.agent.clone());
        self.0.events.started(&req.id, exec, pid);
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        let process = self.process(&req.id, &req.exec_id)?;
        let bundle = self
            .containers()
            .get(&req.id)
            .map(|c| c.bundle.clone())
            .unwrap_or_default();
        let (status, pid, exit_status, exited_at) = process.snapshot();
        let status = match status {
            ProcStatus::Created => Status::CREATED,
            ProcStatus::Running => Status::RUNNING,
            ProcStatus::Stopped => Status::STOPPED,
        };
        Ok(api::StateResponse {
            id: req.id.clone(),
            exec_id: req.exec_id.clone(),
            bundle,
            pid,
            status: status.into(),
            stdin: process.stdio.stdin.clone(),
            stdout: process.stdio.stdout.clone(),
            stderr: process.stdio.stderr.clone(),
            terminal: process.stdio.terminal,
            exit_status,
            exited_at: exited_at.map(timestamp).into(),
            ..Default::default()
        })
    }

    fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        let process = self.process(&req.id, &req.exec_id)?;
        if process.snapshot().0 == ProcStatus::Stopped {
            return Err(error(Code::NOT_FOUND, "process already finished"));
        }
        let exec = exec_of(&req.exec_id);
        self.sandbox()?
            .agent
            .ask(json!({"op": "kill", "id": req.id, "exec_id": exec, "signal": req.signal, "all": req.all}))
            .map_err(failed)?;
        Ok(api::Empty::new())
    }

    fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<api::Empty> {
        let exists = match self.containers().get(&req.id) {
            None => {
                return Err(error(
                    Code::NOT_FOUND,
                    format!("container {} does not exist", req.id),
                ))
            }
            Some(c) => c.execs.contains_key(&req.exec_id) || req.exec_id.is_empty(),
        };
        if exists {
            return Err(error(
                Code::ALREADY_EXISTS,
                format!("process {:?} exists", req.exec_id),
            ));
        }
        let spec = req
            .spec
            .as_ref()
            .map(|any| any.value.as_slice())
            .unwrap_or_default();
        let process: Value = serde_json::from_slice(spec).map_err(|e| {
            error(
                Code::INVALID_ARGUMENT,
                format!("the exec's process spec is not JSON: {e}"),
            )
        })?;
        let sandbox = self.sandbox()?;
        sandbox
            .agent
            .ask(json!({"op": "exec", "id": req.id, "exec_id": req.exec_id, "process": process}))
            .map_err(failed)?;
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let exec = Arc::new(Process::new(&req.id, Some(&req.exec_id), stdio, 0));
        exec.connect_stdio(&sandbox.agent).map_err(failed)?;
        if let Some(c) = self.containers().get_mut(&req.id) {
            c.execs.insert(req.exec_id.clone(), exec);
        }
        self.0.events.exec_added(&req.id, &req.exec_id);
        Ok(api::Empty::new())
    }

    fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        self.process(&req.id, &req.exec_id)?;
        let exec = exec_of(&req.exec_id);
        let (width, height) = (
            req.width.min(u16::MAX.into()),
            req.height.min(u16::MAX.into()),
        );
        self.sandbox()?
            .agent
            .ask(json!({"op": "resize", "id": req.id, "exec_id": exec, "width": width, "height": height}))
            .map_err(failed)?;
        Ok(api::Empty::new())
    }

    fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<api::Empty> {
        let process = self.process(&req.id, &req.exec_id)?;
        if req.stdin {
            process.close_stdin();
        }
        Ok(api::Empty::new())
    }

    fn wait(&self, _ctx: &TtrpcContext, req: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        let process = self.process(&req.id, &req.exec_id)?;
        let (exit_status, at) = process.wait();
        Ok(api::WaitResponse {
            exit_status,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        if !self.containers().contains_key(&req.id) {
            return Err(error(
                Code::NOT_FOUND,
                format!("container {} does not exist", req.id),
            ));
        }
        let sandbox = self.sandbox()?;
        let reading = sandbox
            .agent
            .ask(json!({"op": "stats", "id": req.id}))
            .map_err(failed)?;
        let stats = crate::metrics::from_agent(&reading).map_err(failed)?;
        Ok(api::StatsResponse {
            stats: MessageField::some(stats),
            ..Default::default()
        })
    }

    fn pids(&self, _ctx: &TtrpcContext, req: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        let containers = self.containers();
        let c = containers.get(&req.id).ok_or_else(|| {
            error(
                Code::NOT_FOUND,
                format!("container {} does not exist", req.id),
            )
        })?;
        let processes = std::iter::once(&c.init)
            .chain(c.execs.values())
            .filter(|p| p.snapshot().0 == ProcStatus::Running)
            .map(|p| containerd_shim::protos::types::task::ProcessInfo {
                pid: p.snapshot().1,
                ..Default::default()
            })
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let process = self.process(&req.id, &req.exec_id)?;
        let sandbox = self.sandbox()?;
        let exec = exec_of(&req.exec_id);
        if exec.is_some() && process.snapshot().0 == ProcStatus::Running {
            return Err(failed(format!("process {} is running", req.exec_id)));
        }
        // The agent kills what still runs; the watcher records the exit it reports.
        let deleted = sandbox
            .agent
            .ask(json!({"op": "delete", "id": req.id, "exec_id": exec}));
        if let Err(e) = &deleted {
            if sandbox.ended().is_none() && process.snapshot().0 != ProcStatus::Created {
                log::warn!("deleting {} in the guest: {e}", req.id);
            }
        }
        if process.snapshot().0 != ProcStatus::Stopped {
            let status = deleted
                .ok()
                .and_then(|a| a["exit_status"].as_u64())
                .unwrap_or(137);
            process.exit(status as u32);
        }
        let (_, pid, exit_status, at) = process.snapshot();
        let at = at.unwrap_or(SystemTime::now());
        let mut containers = self.containers();
        match exec {
            Some(e) => {
                if let Some(c) = containers.get_mut(&req.id) {
                    c.execs.remove(e);
                }
            }
            None => {
                if let Some(c) = containers.remove(&req.id) {
                    sandbox.detach(c.slot);
                    let _ = std::fs::remove_dir_all(&c.dir);
                }
                self.0.events.deleted(&req.id, pid, exit_status, at);
            }
        }
        Ok(api::DeleteResponse {
            pid,
            exit_status,
            exited_at: MessageField::some(timestamp(at)),
            ..Default::default()
        })
    }

    fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self
            .process(&req.id, "")
            .map(|p| p.snapshot().1)
            .unwrap_or(0);
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    fn shutdown(&self, _ctx: &TtrpcContext, _req: api::ShutdownRequest) -> TtrpcResult<api::Empty> {
        if !self.containers().is_empty() {
            return Ok(api::Empty::new());
        }
        if let Some(sandbox) = self
            .0
            .sandbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            sandbox.stop();
        }
        if let Some(netns) = self
            .0
            .network
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            network::tear_down(&netns);
        }
        self.0.exit.signal();
        Ok(api::Empty::new())
    }
}
