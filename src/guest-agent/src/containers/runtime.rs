//! Containers, run by the guest's OCI runtime (crun). Each has a bundle directory under
//! [`BUNDLES`] holding its root filesystem's mount point, its `config.json` (the host's spec,
//! adapted to the guest) and the runtime's log; crun keeps its own state under [`CRUN_ROOT`].

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio as Std};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use super::console;
use super::process::{Process, Stdio};
use super::protocol::{valid_id, Rootfs, Target};
use super::reaper;
use super::rootfs;

pub const RUNTIME: &str = "/usr/bin/crun";
pub const BUNDLES: &str = "/run/ember/containers";
const CRUN_ROOT: &str = "/run/crun";

struct Container {
    bundle: PathBuf,
    init: Arc<Process>,
    execs: HashMap<String, Arc<Process>>,
    /// Execs registered and not yet started: their process files, whether they have a
    /// terminal, and the process whose streams a host may already be waiting for.
    pending: HashMap<String, (PathBuf, bool, Arc<Process>)>,
}

fn containers() -> &'static Mutex<HashMap<String, Container>> {
    static C: OnceLock<Mutex<HashMap<String, Container>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<String, Container>> {
    containers().lock().unwrap_or_else(|e| e.into_inner())
}

/// The process a target names.
pub fn process(target: &Target) -> Result<Arc<Process>, String> {
    let all = lock();
    let c = all
        .get(&target.id)
        .ok_or_else(|| format!("no container {}", target.id))?;
    match &target.exec_id {
        None => Ok(c.init.clone()),
        Some(e) => c
            .execs
            .get(e)
            .or_else(|| c.pending.get(e).map(|p| &p.2))
            .cloned()
            .ok_or_else(|| format!("no exec {e} in container {}", target.id)),
    }
}

/// Runs crun with `args`, standard streams `stdio` (pipes handed to the container's
/// process), and waits for it; its log's last lines are the error.
fn crun(bundle: &Path, args: &[&str], stdio: [Std; 3]) -> Result<(), String> {
    let log = bundle.join("crun.log");
    let [stdin, stdout, stderr] = stdio;
    let child = Command::new(RUNTIME)
        .arg("--root")
        .arg(CRUN_ROOT)
        .arg(format!("--log=file:{}", log.display()))
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot run {RUNTIME}: {e}"))?;
    reaper::spawned();
    match reaper::wait(child.id()) {
        0 => Ok(()),
        code => {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let last: Vec<&str> = text.lines().rev().take(3).collect();
            let last: Vec<&str> = last.into_iter().rev().collect();
            Err(format!(
                "crun {} exited with status {code}: {}",
                args[0],
                last.join(" / ")
            ))
        }
    }
}

/// No standard streams: for crun's own commands.
fn nothing() -> [Std; 3] {
    [Std::null(), Std::null(), Std::null()]
}

/// Pipes for a process without a terminal: the child's ends, and the agent's.
fn pipes() -> ([Std; 3], Stdio) {
    let pair = super::sys::pipe;
    match (pair(), pair(), pair()) {
        (Ok((in_r, in_w)), Ok((out_r, out_w)), Ok((err_r, err_w))) => (
            [in_r.into(), out_w.into(), err_w.into()],
            Stdio {
                stdin: Some(in_w),
                stdout: Some(out_r),
                stderr: Some(err_r),
                terminal: None,
            },
        ),
        _ => (nothing(), Stdio::default()),
    }
}

/// The host's spec made to run in this guest: the root filesystem is the bundle's
/// `rootfs`; hooks and namespaces given by a host path (meaningless here) are dropped, so a
/// container given the sandbox's network namespace shares the VM's network. A namespace of
/// a process (`/proc/PID/ns/...`) is kept: the PIDs the host knows are this guest's (the
/// shim reports them), so a container can join another one's namespaces, as in a pod.
/// `/proc/PID/ns/TYPE`: a namespace of a process of this guest.
fn guest_path(path: &str) -> bool {
    let mut parts = path.split('/').skip(1);
    parts.next() == Some("proc")
        && parts
            .next()
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        && parts.next() == Some("ns")
        && parts.next().is_some_and(|t| !t.is_empty())
        && parts.next().is_none()
}

fn adapt(mut spec: Value) -> Result<(Value, bool), String> {
    let object = spec
        .as_object_mut()
        .ok_or("the spec is not a JSON object")?;
    let readonly = object
        .get("root")
        .and_then(|r| r.get("readonly"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    object.insert(
        "root".into(),
        serde_json::json!({"path": "rootfs", "readonly": readonly}),
    );
    object.remove("hooks");
    if let Some(ns) = object
        .get_mut("linux")
        .and_then(|l| l.get_mut("namespaces"))
        .and_then(Value::as_array_mut)
    {
        ns.retain(|n| n.get("path").and_then(Value::as_str).is_none_or(guest_path));
    }
    let terminal = object
        .get("process")
        .and_then(|p| p.get("terminal"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((spec, terminal))
}

fn read_pid(file: &Path) -> Result<u32, String> {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| format!("crun left no pid in {}", file.display()))
}

/// Runs `args` (crun create or exec) for `process`, with or without a terminal, and puts its
/// streams and pid in place.
fn launch(
    bundle: &Path,
    name: &str,
    args: &[&str],
    terminal: bool,
    process: &Arc<Process>,
) -> Result<(), String> {
    let pid_file = bundle.join(format!("{name}.pid"));
    let pid_arg = pid_file.to_string_lossy().into_owned();
    let mut all: Vec<&str> = vec![args[0], "--pid-file", &pid_arg];
    if terminal {
        let sock = bundle.join(format!("{name}.console"));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).map_err(|e| format!("console socket: {e}"))?;
        let sock_arg = sock.to_string_lossy().into_owned();
        all.extend(["--console-socket", sock_arg.as_str()]);
        all.extend_from_slice(&args[1..]);
        crun(bundle, &all, nothing())?;
        let master = console::receive(&listener)?;
        process.set_stdio(Stdio {
            stdin: master.try_clone().ok(),
            stdout: master.try_clone().ok(),
            stderr: None,
            terminal: Some(master),
        });
    } else {
        all.extend_from_slice(&args[1..]);
        let (child, ours) = pipes();
        crun(bundle, &all, child)?;
        process.set_stdio(ours);
    }
    let pid = read_pid(&pid_file)?;
    process.watch(pid, args[0] == "exec");
    Ok(())
}

/// Mounts the root filesystem and creates the container; its init waits for `start`.
pub fn create(id: &str, spec: Value, rootfs: &Rootfs) -> Result<u32, String> {
    if !valid_id(id) {
        return Err(format!(
            "container ID {id:?} is not 1 to 64 letters, digits, _ - ."
        ));
    }
    if lock().contains_key(id) {
        return Err(format!("container {id} exists"));
    }
    let (spec, terminal) = adapt(spec)?;
    let bundle = Path::new(BUNDLES).join(id);
    rootfs::mount(rootfs, &bundle)?;
    let undo = |e: String| {
        rootfs::unmount(&bundle);
        let _ = std::fs::remove_dir_all(&bundle);
        e
    };
    let text = serde_json::to_vec(&spec).map_err(|e| undo(e.to_string()))?;
    std::fs::write(bundle.join("config.json"), text).map_err(|e| undo(e.to_string()))?;
    let bundle_arg = bundle.to_string_lossy().into_owned();
    let init = Process::pending();
    let args = ["create", "--bundle", &bundle_arg, id];
    launch(&bundle, "init", &args, terminal, &init).map_err(|e| {
        // Whatever crun made before the failure goes too, so the ID can be used again.
        let _ = crun(&bundle, &["delete", "--force", id], nothing());
        undo(e)
    })?;
    let pid = init.pid();
    lock().insert(
        id.to_string(),
        Container {
            bundle,
            init,
            execs: HashMap::new(),
            pending: HashMap::new(),
        },
    );
    Ok(pid)
}

/// Registers an exec: its OCI process object, written for `crun exec --process`.
pub fn exec(id: &str, exec_id: &str, process: &Value) -> Result<(), String> {
    if !valid_id(exec_id) {
        return Err(format!(
            "exec ID {exec_id:?} is not 1 to 64 letters, digits, _ - ."
        ));
    }
    let mut all = lock();
    let c = all
        .get_mut(id)
        .ok_or_else(|| format!("no container {id}"))?;
    if c.execs.contains_key(exec_id) || c.pending.contains_key(exec_id) {
        return Err(format!("exec {exec_id} exists in container {id}"));
    }
    let terminal = process
        .get("terminal")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let file = c.bundle.join(format!("exec-{exec_id}.json"));
    let text = serde_json::to_vec(process).map_err(|e| e.to_string())?;
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    c.pending
        .insert(exec_id.to_string(), (file, terminal, Process::pending()));
    Ok(())
}

/// Starts the init (`crun start`) or a registered exec (`crun exec --detach`); the pid.
pub fn start(target: &Target) -> Result<u32, String> {
    let (bundle, pending) = {
        let mut all = lock();
        let c = all
            .get_mut(&target.id)
            .ok_or_else(|| format!("no container {}", target.id))?;
        let pending = match &target.exec_id {
            None => None,
            Some(e) => Some(
                c.pending
                    .remove(e)
                    .ok_or_else(|| format!("no registered exec {e} in container {}", target.id))?,
            ),
        };
        (c.bundle.clone(), pending)
    };
    let id = target.id.as_str();
    match (&target.exec_id, pending) {
        (Some(exec_id), Some((file, terminal, process))) => {
            let file_arg = file.to_string_lossy().into_owned();
            let args = ["exec", "--detach", "--process", &file_arg, id];
            let launched = launch(
                &bundle,
                &format!("exec-{exec_id}"),
                &args,
                terminal,
                &process,
            );
            if let Err(e) = launched {
                // Whoever waits for its streams gets none.
                process.set_stdio(Stdio::default());
                return Err(e);
            }
            let pid = process.pid();
            if let Some(c) = lock().get_mut(id) {
                c.execs.insert(exec_id.clone(), process);
            }
            Ok(pid)
        }
        _ => {
            let init = process(target)?;
            crun(&bundle, &["start", id], nothing())?;
            init.set_running();
            Ok(init.pid())
        }
    }
}

/// Signals every process of the container (`crun kill --all`).
pub fn kill_all(id: &str, signal: i32) -> Result<(), String> {
    let bundle = lock()
        .get(id)
        .map(|c| c.bundle.clone())
        .ok_or_else(|| format!("no container {id}"))?;
    let sig = signal.to_string();
    crun(&bundle, &["kill", "--all", id, &sig], nothing())
}

/// Forgets an exited exec, or removes the container: its processes are killed, crun's state
/// deleted, the root filesystem unmounted and the bundle removed.
pub fn delete(target: &Target) -> Result<i32, String> {
    let mut all = lock();
    let c = all
        .get_mut(&target.id)
        .ok_or_else(|| format!("no container {}", target.id))?;
    if let Some(exec_id) = &target.exec_id {
        if let Some((_, _, process)) = c.pending.remove(exec_id) {
            process.set_stdio(Stdio::default());
            return Ok(0);
        }
        let p = c
            .execs
            .get(exec_id)
            .ok_or_else(|| format!("no exec {exec_id} in container {}", target.id))?;
        if !p.stopped() {
            return Err(format!("exec {exec_id} is still running"));
        }
        let code = p.state().exit_status.unwrap_or(0);
        c.execs.remove(exec_id);
        return Ok(code);
    }
    let c = all.remove(&target.id).expect("looked up above");
    drop(all);
    let deleted = crun(&c.bundle, &["delete", "--force", &target.id], nothing());
    rootfs::unmount(&c.bundle);
    let _ = std::fs::remove_dir_all(&c.bundle);
    deleted?;
    Ok(c.init.state().exit_status.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hosts_spec_is_adapted_to_the_guest() {
        let spec = json!({"root": {"path": "/host/rootfs", "readonly": true},
            "hooks": {"prestart": [{"path": "/host/hook"}]},
            "process": {"terminal": true, "args": ["sh"]},
            "linux": {"namespaces": [{"type": "pid"},
                {"type": "network", "path": "/var/run/netns/cni-1"},
                {"type": "ipc", "path": "/proc/40/ns/ipc"},
                {"type": "uts", "path": "/proc/x/ns/uts"}]}});
        let (adapted, terminal) = adapt(spec).unwrap();
        assert!(terminal);
        assert_eq!(adapted["root"], json!({"path": "rootfs", "readonly": true}));
        assert!(adapted.get("hooks").is_none());
        assert_eq!(
            adapted["linux"]["namespaces"],
            json!([{"type": "pid"}, {"type": "ipc", "path": "/proc/40/ns/ipc"}])
        );
        assert!(adapt(json!([1])).is_err());
    }
}
