//! `containers [PORT]`: the agent's container service on vsock (default port 1025). The host
//! (the containerd shim) creates, starts, signals and removes containers and their execs,
//! and joins their standard streams, one request per connection (protocol.rs). A request
//! that is malformed, too long or of another version gets an error line; the service goes on.

mod console;
mod host_paths;
mod network;
mod process;
pub mod protocol;
mod reaper;
mod rootfs;
mod runtime;
mod stats;
mod sys;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};

use protocol::{Op, MAX_REQUEST, VERSION};

pub const DEFAULT_PORT: u32 = 1025;

/// Mounts what containers need (cgroup v2, /run), becomes the subreaper and serves.
pub fn serve(port: u32) -> Result<String, String> {
    prepare()?;
    reaper::start().map_err(|e| format!("cannot become the subreaper: {e}"))?;
    let listener =
        crate::vsock::listener(port).map_err(|e| format!("listen on vsock port {port}: {e}"))?;
    println!("ember-agent: containers on vsock port {port}");
    loop {
        let conn = crate::vsock::accept(&listener).map_err(|e| format!("accept: {e}"))?;
        std::thread::spawn(move || answer(conn));
    }
}

fn prepare() -> Result<(), String> {
    let mounted = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for (fstype, dir) in [("tmpfs", "/run"), ("cgroup2", "/sys/fs/cgroup")] {
        if mounted.lines().any(|l| l.split(' ').nth(1) == Some(dir)) {
            continue;
        }
        if !std::path::Path::new(dir).is_dir() {
            return Err(format!("{dir} is missing: the guest image must have it"));
        }
        let status = std::process::Command::new("/bin/mount")
            .args(["-t", fstype, fstype, dir])
            .status()
            .map_err(|e| format!("mount {dir}: {e}"))?;
        if !status.success() {
            return Err(format!("cannot mount {fstype} on {dir}"));
        }
    }
    std::fs::create_dir_all(runtime::BUNDLES).map_err(|e| e.to_string())
}

/// Reads one request line of at most MAX_REQUEST bytes.
fn request(conn: &File) -> Result<(String, BufReader<File>), String> {
    let reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut limited = reader.take(MAX_REQUEST as u64 + 1);
    let mut line = Vec::new();
    limited
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("cannot read the request: {e}"))?;
    if line.len() > MAX_REQUEST {
        return Err(format!("the request is longer than {MAX_REQUEST} bytes"));
    }
    let line = String::from_utf8(line).map_err(|_| "the request is not UTF-8".to_string())?;
    Ok((line, limited.into_inner()))
}

fn reply(conn: &mut File, answer: Result<serde_json::Value, String>) {
    let line = match answer {
        Ok(ok) => serde_json::json!({ "ok": ok }),
        Err(e) => serde_json::json!({ "error": e }),
    };
    let _ = conn.write_all(format!("{line}\n").as_bytes());
}

fn answer(mut conn: File) {
    let (line, reader) = match request(&conn) {
        Ok(r) => r,
        Err(e) => return reply(&mut conn, Err(e)),
    };
    let op = match protocol::parse(&line) {
        Ok(op) => op,
        Err(e) => return reply(&mut conn, Err(e)),
    };
    // A stream request answers first, then carries the stream (bytes the host sent after
    // its request line are still in `reader`'s buffer, so it is what stdin reads from).
    if let Op::Stdio { stream, .. } = op {
        let target = op.target().expect("stdio names a process");
        let process = match runtime::process(&target) {
            Ok(p) => p,
            Err(e) => return reply(&mut conn, Err(e)),
        };
        if stream == protocol::Stream::Stdin {
            reply(&mut conn, Ok(serde_json::json!({})));
            if let Err(e) = process.feed_stdin(reader) {
                eprintln!("ember-agent: stdin: {e}");
            }
            return;
        }
        // An exec's streams exist once it starts: the host takes them before its `start`,
        // so the answer comes now and the stream when there is one.
        if !process.output_available(stream) {
            return reply(
                &mut conn,
                Err("the stream is already attached, or the process has none".into()),
            );
        }
        reply(&mut conn, Ok(serde_json::json!({})));
        match process.take_output(stream) {
            Ok(from) => process::copy_out(from, conn),
            Err(e) => eprintln!("ember-agent: stdio: {e}"),
        }
        return;
    }
    let answer = handle(op);
    reply(&mut conn, answer);
}

fn handle(op: Op) -> Result<serde_json::Value, String> {
    use serde_json::json;
    let target = op.target();
    let process = || runtime::process(target.as_ref().expect("the op names a process"));
    match op {
        Op::Ping {} => Ok(json!({"version": VERSION, "runtime": runtime::RUNTIME})),
        Op::Network {
            interface,
            address,
            gateway,
            mtu,
            mac,
        } => network::configure(
            &interface,
            &address,
            gateway.as_deref(),
            mtu,
            mac.as_deref(),
        )
        .map(|()| json!({})),
        Op::Create {
            id,
            spec,
            rootfs,
            host_paths,
        } => host_paths::write_all(&host_paths)
            .and_then(|()| runtime::create(&id, spec, &rootfs))
            .map(|pid| json!({ "pid": pid })),
        Op::Exec {
            id,
            exec_id,
            process,
        } => runtime::exec(&id, &exec_id, &process).map(|()| json!({})),
        Op::Start { .. } => runtime::start(target.as_ref().expect("start names a process"))
            .map(|pid| json!({ "pid": pid })),
        Op::Wait { .. } => Ok(json!({ "exit_status": process()?.wait() })),
        Op::State { .. } => serde_json::to_value(process()?.state()).map_err(|e| e.to_string()),
        Op::Kill {
            ref id,
            signal,
            all: true,
            ..
        } => runtime::kill_all(id, signal).map(|()| json!({})),
        Op::Kill { signal, .. } => process()?.signal(signal).map(|()| json!({})),
        Op::Resize { width, height, .. } => process()?.resize(width, height).map(|()| json!({})),
        Op::CloseStdin { .. } => {
            process()?.close_stdin();
            Ok(json!({}))
        }
        Op::Stats { .. } => {
            let init = process()?;
            if init.state().status != protocol::Status::Running {
                return Err("the container is not running".into());
            }
            stats::of_process(init.pid())
        }
        Op::Delete { .. } => runtime::delete(target.as_ref().expect("delete names a process"))
            .map(|code| json!({ "exit_status": code })),
        Op::Stdio { .. } => unreachable!("answered above"),
    }
}
