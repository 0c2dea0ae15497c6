//! One sandbox, one microVM: the `ember` process the shim starts for the first container of
//! a sandbox, configured from a file with its API socket kept open, and the disks its
//! containers' root filesystems reach the guest through.
//!
//! Ember, like Firecracker, cannot add a disk to a running VM, so a sandbox boots with
//! `slots` pairs of placeholder disks (`layersN` read-only, `upperN` writable, small sparse
//! files); a container takes a free pair and the shim points it at the container's layer
//! image and writable layer with `PATCH /drives`, which tells the guest the new size.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent::Agent;
use crate::config::Config;
use crate::http;
use crate::sys;

/// How long one readiness ping may wait for the agent before the next is tried (a guest
/// under load on a kvm_pvm host answers within seconds).
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Placeholder disks are this big (sparse): a size every guest driver accepts.
const STUB_BYTES: u64 = 1 << 20;
const BASE_ARGS: &str =
    "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot prepare the sandbox directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot start {0}: {1}")]
    Spawn(PathBuf, std::io::Error),
    #[error("the sandbox's ember exited while its guest booted ({0}); its console log is {1}")]
    DiedBooting(String, PathBuf),
    #[error("the sandbox's guest agent did not answer within {0} s; its console log is {1}")]
    BootTimeout(u64, PathBuf),
    #[error("the sandbox's VM has ended ({0})")]
    Gone(String),
    #[error("all {0} container slots of the sandbox are in use")]
    Full(usize),
    #[error("ember refused {0}: {1}")]
    Api(String, String),
}

/// Files of a sandbox, under its directory.
pub struct Paths {
    pub dir: PathBuf,
}

impl Paths {
    pub fn api(&self) -> PathBuf {
        self.dir.join("api.sock")
    }
    pub fn vsock(&self) -> PathBuf {
        self.dir.join("vsock.sock")
    }
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
    pub fn pid(&self) -> PathBuf {
        self.dir.join("ember.pid")
    }
    /// The shim serving the sandbox.
    pub fn shim_pid(&self) -> PathBuf {
        self.dir.join("shim.pid")
    }
    fn stub_ro(&self) -> PathBuf {
        self.dir.join("stub-ro")
    }
    fn stub_rw(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("stub-rw{slot}"))
    }
}

#[derive(Debug)]
pub struct Sandbox {
    pub dir: PathBuf,
    pub agent: Agent,
    pub pid: u32,
    /// Which container holds each slot.
    slots: Mutex<Vec<Option<String>>>,
    /// Why ember ended, once it has.
    ended: Arc<(Mutex<Option<String>>, Condvar)>,
}

impl Sandbox {
    /// Starts the VM and waits until its agent answers.
    /// With `netns`, ember runs in that network namespace with a NIC on its TAP
    /// ([`crate::network`]).
    pub fn boot(
        config: &Config,
        dir: PathBuf,
        mem_size_mib: u32,
        netns: Option<&Path>,
    ) -> Result<Sandbox, Error> {
        let paths = Paths { dir: dir.clone() };
        let io = |e| Error::Dir(dir.clone(), e);
        std::fs::create_dir_all(&dir).map_err(io)?;
        make_stubs(&paths, config.slots, true)?;
        let vm = vm_config(config, &paths, mem_size_mib, netns.is_some());
        let vm_file = dir.join("vm.json");
        std::fs::write(&vm_file, vm.to_string()).map_err(io)?;
        let args = [OsStr::new("--config-file"), vm_file.as_os_str()];
        let sandbox = Sandbox::spawn(config, dir, &args, netns)?;
        sandbox.wait_for_agent(Duration::from_secs(config.boot_timeout_secs))?;
        Ok(sandbox)
    }

    /// Starts the VM from a template's snapshot (a booted guest whose agent waits): the
    /// sandbox's own vsock socket, and its own placeholders for the writable disks (the
    /// template's are not shared with a guest). With `netns`, ember runs there, where the
    /// template's NIC finds the sandbox's TAP by the same name.
    pub fn restore(
        config: &Config,
        template: &Path,
        dir: PathBuf,
        netns: Option<&Path>,
    ) -> Result<Sandbox, Error> {
        let paths = Paths { dir: dir.clone() };
        std::fs::create_dir_all(&dir).map_err(|e| Error::Dir(dir.clone(), e))?;
        make_stubs(&paths, config.slots, false)?;
        let sandbox = Sandbox::spawn(config, dir, &[], netns)?;
        let start = Instant::now();
        while !paths.api().exists() {
            if let Some(why) = sandbox.ended() {
                return Err(Error::DiedBooting(why, paths.console()));
            }
            if start.elapsed() > Duration::from_secs(10) {
                sandbox.stop();
                return Err(Error::Api(
                    "the API socket".into(),
                    "it never appeared".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let load = json!({"snapshot_path": template.join("vmstate"),
            "mem_backend": {"backend_type": "File", "backend_path": template.join("mem")},
            "resume_vm": true, "vsock_override": {"uds_path": paths.vsock()}});
        let api_up = start.elapsed();
        let restored = sandbox.api("PUT", "/snapshot/load", &load).and_then(|()| {
            (0..config.slots)
                .try_for_each(|slot| sandbox.point(&format!("upper{slot}"), &paths.stub_rw(slot)))
        });
        if let Err(e) = restored {
            sandbox.stop();
            return Err(e);
        }
        let loaded = start.elapsed();
        sandbox.wait_for_agent(Duration::from_secs(config.boot_timeout_secs))?;
        log::info!(
            "restored {}: API up at {api_up:?}, loaded and disks re-pointed at {loaded:?}, agent answered at {:?}",
            sandbox.dir.display(),
            start.elapsed()
        );
        Ok(sandbox)
    }

    /// Runs `ember --api-sock` with `args`, its output going to the console log.
    fn spawn(
        config: &Config,
        dir: PathBuf,
        args: &[&OsStr],
        netns: Option<&Path>,
    ) -> Result<Sandbox, Error> {
        let paths = Paths { dir: dir.clone() };
        let io = |e| Error::Dir(dir.clone(), e);
        let console = std::fs::File::create(paths.console()).map_err(io)?;
        let console2 = console.try_clone().map_err(io)?;
        let _ = std::fs::remove_file(paths.api());
        let _ = std::fs::remove_file(paths.vsock());

        let binary = config.ember_binary();
        let mut command = Command::new(&binary);
        command
            .arg("--api-sock")
            .arg(paths.api())
            .args(args)
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(console2);
        sys::kill_with_parent(&mut command);
        if let Some(netns) = netns {
            let ns = std::fs::File::open(netns).map_err(|e| Error::Dir(netns.to_path_buf(), e))?;
            sys::enter_netns(&mut command, ns);
        }
        // The child is spawned and waited for by a thread of its own that lives as long as
        // it does: the parent-death signal is tied to the thread that spawned it.
        let ended = Arc::new((Mutex::new(None), Condvar::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let ended2 = ended.clone();
        std::thread::Builder::new()
            .name("ember".into())
            .spawn(move || {
                let mut child = match command.spawn() {
                    Ok(child) => child,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(child.id()));
                let why = match child.wait() {
                    Ok(status) => status.to_string(),
                    Err(e) => e.to_string(),
                };
                log::info!("the sandbox's ember ended: {why}");
                *ended2.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                ended2.1.notify_all();
            })
            .map_err(|e| Error::Spawn(binary.clone(), e))?;
        let pid = rx
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the ember thread ended")))
            .map_err(|e| Error::Spawn(binary.clone(), e))?;
        let _ = std::fs::write(paths.pid(), pid.to_string());
        let _ = std::fs::write(paths.shim_pid(), std::process::id().to_string());
        Ok(Sandbox {
            dir,
            agent: Agent { uds: paths.vsock() },
            pid,
            slots: Mutex::new(vec![None; config.slots]),
            ended,
        })
    }

    /// Pauses the booted guest and writes its snapshot (`vmstate`, `mem`) into its
    /// directory: the template later sandboxes start from.
    pub fn snapshot(&self) -> Result<(), Error> {
        self.api("PATCH", "/vm", &json!({"state": "Paused"}))?;
        let create = json!({"snapshot_type": "Full", "snapshot_path": self.dir.join("vmstate"),
            "mem_file_path": self.dir.join("mem")});
        self.api("PUT", "/snapshot/create", &create)
    }

    fn paths(&self) -> Paths {
        Paths {
            dir: self.dir.clone(),
        }
    }

    fn wait_for_agent(&self, timeout: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            if let Some(why) = self.ended() {
                return Err(Error::DiedBooting(why, self.paths().console()));
            }
            if self.agent.answers(PING_TIMEOUT) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                self.stop();
                return Err(Error::BootTimeout(
                    timeout.as_secs(),
                    self.paths().console(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why ember ended, if it has.
    pub fn ended(&self) -> Option<String> {
        self.ended
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Gives `container` a free slot whose disks now read `image` and `writable`; the slot.
    pub fn attach(&self, container: &str, image: &Path, writable: &Path) -> Result<usize, Error> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let free = slots
                .iter()
                .position(Option::is_none)
                .ok_or(Error::Full(slots.len()))?;
            slots[free] = Some(container.to_string());
            free
        };
        let patched = self
            .point(&format!("layers{slot}"), image)
            .and_then(|()| self.point(&format!("upper{slot}"), writable));
        if let Err(e) = patched {
            self.detach(slot);
            return Err(e);
        }
        Ok(slot)
    }

    /// Points `slot`'s disks back at the placeholders and frees it.
    pub fn detach(&self, slot: usize) {
        let paths = self.paths();
        let _ = self.point(&format!("layers{slot}"), &paths.stub_ro());
        let _ = self.point(&format!("upper{slot}"), &paths.stub_rw(slot));
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get_mut(slot) {
            *s = None;
        }
    }

    fn point(&self, drive: &str, file: &Path) -> Result<(), Error> {
        let body = json!({"drive_id": drive, "path_on_host": file});
        self.api("PATCH", &format!("/drives/{drive}"), &body)
    }

    /// One API request; anything but 204 is an error with Ember's sentence.
    fn api(&self, method: &str, path: &str, body: &Value) -> Result<(), Error> {
        if let Some(why) = self.ended() {
            return Err(Error::Gone(why));
        }
        let what = format!("{method} {path}");
        let (status, answer) = http::request(&self.paths().api(), method, path, &body.to_string())
            .map_err(|e| Error::Api(what.clone(), e.to_string()))?;
        if status != 204 {
            let sentence = serde_json::from_str::<Value>(&answer)
                .ok()
                .and_then(|v| v["fault_message"].as_str().map(str::to_string))
                .unwrap_or(answer);
            return Err(Error::Api(what, sentence));
        }
        Ok(())
    }

    /// Ends the VM (SIGKILL: the guest holds nothing the host needs) and removes the
    /// sandbox's files.
    pub fn stop(&self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Ends the VM, keeping its files.
    pub fn kill(&self) {
        if self.ended().is_none() {
            // Our own child, which its thread has not reaped (ended is unset): the pid is
            // still ours.
            sys::kill(self.pid as i32);
            let guard = self.ended.0.lock().unwrap_or_else(|e| e.into_inner());
            let _ = self
                .ended
                .1
                .wait_timeout_while(guard, Duration::from_secs(10), |why| why.is_none());
        }
    }
}

/// Cleans up after a shim that died: ends the sandbox's ember if it still runs (it is the
/// one whose command line names this sandbox's API socket) and removes the directory. While
/// the sandbox's shim lives, nothing: containerd runs `delete` whenever its connection for
/// a task closes, also for one container of a pod whose shim goes on serving the others.
/// True if it cleaned up.
pub fn clean_up(dir: &Path) -> bool {
    let paths = Paths {
        dir: dir.to_path_buf(),
    };
    let contains = |cmdline: &[u8], name: &[u8]| cmdline.windows(name.len()).any(|w| w == name);
    if running(&paths.shim_pid(), |cmdline| {
        contains(cmdline, b"containerd-shim-ember-v2")
    })
    .is_some()
    {
        return false;
    }
    discard(dir);
    true
}

/// Ends the sandbox's ember if it still runs (the process named by its pid file whose
/// command line names this sandbox's API socket) and removes the sandbox's directory: after
/// a sandbox failed to start, nothing of it is left.
pub fn discard(dir: &Path) {
    let paths = Paths {
        dir: dir.to_path_buf(),
    };
    let api = paths.api();
    let ours = |cmdline: &[u8]| {
        cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == api.as_os_str().as_encoded_bytes())
    };
    if let Some(pid) = running(&paths.pid(), ours) {
        // A process whose command line names this sandbox's socket.
        sys::kill(pid);
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The process named by the pid file `file`, if it runs and its command line is one that
/// `is_it` recognises (a pid file can outlive its process, and the pid be reused).
fn running(file: &Path, is_it: impl Fn(&[u8]) -> bool) -> Option<i32> {
    let pid = std::fs::read_to_string(file)
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    is_it(&cmdline).then_some(pid)
}

/// The placeholder disks: one read-only (unless `read_only` is false: a restored sandbox
/// keeps its template's) and one writable per slot.
fn make_stubs(paths: &Paths, slots: usize, read_only: bool) -> Result<(), Error> {
    let ro = read_only.then(|| paths.stub_ro());
    for stub in ro.into_iter().chain((0..slots).map(|i| paths.stub_rw(i))) {
        std::fs::File::create(&stub)
            .and_then(|f| f.set_len(STUB_BYTES))
            .map_err(|e| Error::Dir(paths.dir.clone(), e))?;
    }
    Ok(())
}

/// The VM: the project's guest with the agent's container service as its command, the
/// vsock device, and the placeholder disks.
fn vm_config(config: &Config, paths: &Paths, mem_size_mib: u32, nic: bool) -> Value {
    let mut drives = vec![json!({"drive_id": "rootfs", "path_on_host": config.rootfs,
        "is_root_device": true, "is_read_only": true})];
    for slot in 0..config.slots {
        drives.push(
            json!({"drive_id": format!("layers{slot}"), "path_on_host": paths.stub_ro(),
            "is_root_device": false, "is_read_only": true}),
        );
        drives.push(
            json!({"drive_id": format!("upper{slot}"), "path_on_host": paths.stub_rw(slot),
            "is_root_device": false, "is_read_only": false}),
        );
    }
    json!({
        "boot-source": {
            "kernel_image_path": config.kernel,
            "boot_args": format!("{BASE_ARGS} {} ember_cmd=\"ember-agent containers\"", config.boot_args),
        },
        "drives": drives,
        "machine-config": {"vcpu_count": config.vcpu_count, "mem_size_mib": mem_size_mib},
        "vsock": {"guest_cid": 3, "uds_path": paths.vsock()},
        "network-interfaces": if nic {
            json!([{"iface_id": "eth0", "host_dev_name": crate::network::TAP}])
        } else {
            json!([])
        },
    })
}
