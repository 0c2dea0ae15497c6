//! The agent's vsock side: `serve PORT` listens on AF_VSOCK and answers one request line per
//! connection, each on its own thread, so the host can run commands, move data both ways
//! and ask what the guest sees. Requests (one line, then the stream):
//!
//!   ECHO                      echo every byte until the host ends its side
//!   SINK                      read to the end; answer `received N checksum X`
//!   SOURCE BYTES SEED         write BYTES of the test pattern, then close
//!   STATUS                    `source_written N`: bytes all SOURCE streams have written
//!   INFO                      `cpus N memtotal_kib M`
//!   RUN COMMAND...            run `sh -c COMMAND`; its output, then `exit N`
//!   SEND PORT BYTES SEED      connect to the host (CID 2) on PORT, send BYTES of the
//!                             pattern, end the sending side, read the host's reply; answer
//!                             `sent N checksum X reply R`
//!   FETCH PORT                connect to the host on PORT, read to the end; answer
//!                             `received N checksum X`, or `refused ERROR`

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use guest_agent::{read_checksum, write_pattern, Checksum, Pattern};

use crate::number;

const HOST_CID: u32 = 2;
const CHUNK: usize = 64 << 10;

/// Bytes written by every SOURCE stream so far.
static SOURCE_WRITTEN: AtomicU64 = AtomicU64::new(0);

fn vsock_socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the result is checked before it is used.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain data; all zeroes is valid.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

const ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

fn check(r: libc::c_int) -> io::Result<()> {
    match r < 0 {
        true => Err(io::Error::last_os_error()),
        false => Ok(()),
    }
}

/// A stream connected to the host's `port` (ember's `<uds_path>_<port>`).
pub fn connect(port: u32) -> io::Result<File> {
    let fd = vsock_socket()?;
    let a = address(HOST_CID, port);
    // SAFETY: `a` is a valid sockaddr_vm that outlives the call.
    check(unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(a).cast(), ADDR_LEN) })?;
    Ok(File::from(fd))
}

fn shutdown_write(f: &File) {
    // SAFETY: a plain syscall on a descriptor `f` owns.
    unsafe { libc::shutdown(f.as_raw_fd(), libc::SHUT_WR) };
}

/// A vsock socket listening on `port` for any CID.
pub(crate) fn listener(port: u32) -> io::Result<OwnedFd> {
    let fd = vsock_socket()?;
    let a = address(libc::VMADDR_CID_ANY, port);
    // SAFETY: `a` is a valid sockaddr_vm that outlives the call.
    check(unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(a).cast(), ADDR_LEN) })?;
    // SAFETY: a plain syscall on a descriptor `fd` owns.
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// The next connection on `listener` (interrupted waits are retried).
pub(crate) fn accept(listener: &OwnedFd) -> io::Result<File> {
    loop {
        // SAFETY: null address arguments are allowed; the result is checked.
        let c = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c >= 0 {
            // SAFETY: `c` was just accepted and nothing else owns it.
            return Ok(File::from(unsafe { OwnedFd::from_raw_fd(c) }));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `serve PORT`: answers connections until the guest stops.
pub fn serve(port: &str) -> Result<String, String> {
    let port = u32::try_from(number(port)?).map_err(|_| "bad port".to_string())?;
    let fd = listener(port).map_err(|e| format!("listen on vsock port {port}: {e}"))?;
    println!("ember-agent: serving vsock port {port}");
    loop {
        let stream = accept(&fd).map_err(|e| format!("accept: {e}"))?;
        std::thread::spawn(move || {
            if let Err(e) = answer(stream) {
                eprintln!("ember-agent: vsock request failed: {e}");
            }
        });
    }
}

fn answer(stream: File) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = stream;
    let reply = match words[..] {
        ["ECHO"] => return echo(reader, out),
        ["SINK"] => sink(&mut reader)?,
        ["SOURCE", bytes, seed] => return source(&mut out, bytes, seed),
        ["STATUS"] => format!("source_written {}", SOURCE_WRITTEN.load(Ordering::SeqCst)),
        ["INFO"] => info(),
        ["RUN", ..] => return run(&line["RUN".len()..], out),
        ["SEND", port, bytes, seed] => send(port, bytes, seed),
        ["FETCH", port] => fetch(port),
        _ => format!("error: unknown request {:?}", line.trim_end()),
    };
    out.write_all(format!("{reply}\n").as_bytes())
}

fn echo(mut reader: BufReader<File>, mut out: File) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        out.write_all(&buf[..n])?;
    }
}

fn sink(reader: &mut BufReader<File>) -> io::Result<String> {
    let (n, sum) = read_checksum(reader, Checksum::default())?;
    Ok(format!("received {n} checksum {sum:016x}"))
}

fn source(out: &mut File, bytes: &str, seed: &str) -> io::Result<()> {
    let bad = |e| io::Error::new(io::ErrorKind::InvalidInput, e);
    let (mut left, seed) = (number(bytes).map_err(bad)?, number(seed).map_err(bad)?);
    let mut pattern = Pattern::new(seed);
    let mut buf = vec![0u8; CHUNK];
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        pattern.fill(&mut buf[..n]);
        let mut at = 0;
        while at < n {
            let w = out.write(&buf[at..n])?;
            at += w;
            SOURCE_WRITTEN.fetch_add(w as u64, Ordering::SeqCst);
        }
        left -= n as u64;
    }
    Ok(())
}

fn info() -> String {
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .map(|t| t.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_default();
    format!("cpus {cpus} memtotal_kib {mem}")
}

fn run(command: &str, mut out: File) -> io::Result<()> {
    let output = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(command.trim())
        .output()?;
    out.write_all(&output.stdout)?;
    out.write_all(&output.stderr)?;
    let code = output.status.code().unwrap_or(-1);
    out.write_all(format!("exit {code}\n").as_bytes())
}

fn port_of(port: &str) -> Result<u32, String> {
    u32::try_from(number(port)?).map_err(|_| format!("bad port {port}"))
}

fn send(port: &str, bytes: &str, seed: &str) -> String {
    let run = || -> Result<String, String> {
        let (port, total, seed) = (port_of(port)?, number(bytes)?, number(seed)?);
        let mut s = connect(port).map_err(|e| format!("refused {e}"))?;
        let sum = write_pattern(&mut s, total, seed).map_err(|e| format!("write: {e}"))?;
        shutdown_write(&s);
        let mut reply = String::new();
        s.read_to_string(&mut reply)
            .map_err(|e| format!("read: {e}"))?;
        Ok(format!(
            "sent {total} checksum {sum:016x} reply {}",
            reply.trim_end()
        ))
    };
    run().unwrap_or_else(|e| e)
}

fn fetch(port: &str) -> String {
    let run = || -> Result<String, String> {
        let mut s = connect(port_of(port)?).map_err(|e| format!("refused {e}"))?;
        let (n, sum) =
            read_checksum(&mut s, Checksum::default()).map_err(|e| format!("read: {e}"))?;
        Ok(format!("received {n} checksum {sum:016x}"))
    };
    run().unwrap_or_else(|e| e)
}
