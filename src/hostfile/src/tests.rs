use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use vmm_sys_util::tempdir::TempDir;

use super::*;

/// A fresh directory, removed when the test ends (passed or not).
fn scratch(name: &str) -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join(format!("hostfile-{name}-"))).unwrap()
}

fn fifo(dir: &Path) -> PathBuf {
    let path = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    path
}

#[test]
fn a_fifo_is_refused_at_once_for_every_use() {
    let dir = scratch("fifo");
    let path = fifo(dir.as_path());
    let started = Instant::now();
    let e = read(&path, 1 << 20).unwrap_err();
    assert_eq!(e.to_string(), "it is a FIFO, not a regular file");
    let e = open(&path, Kind::RegularOrBlockDevice, true).unwrap_err();
    assert_eq!(
        e.to_string(),
        "it is a FIFO, not a regular file or a block device"
    );
    let e = create(&path).unwrap_err();
    assert_eq!(e.to_string(), "it is a FIFO, not a regular file");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn devices_and_directories_are_refused_and_never_read() {
    let e = read(Path::new("/dev/zero"), 1 << 20).unwrap_err();
    assert_eq!(
        e.to_string(),
        "it is a character device, not a regular file"
    );
    let e = open(Path::new("/dev/null"), Kind::RegularOrBlockDevice, false).unwrap_err();
    assert!(e.to_string().contains("a character device"));
    let e = read(Path::new("/tmp"), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("is a directory"));
    // create() leaves a device alone: it is never truncated or written.
    let e = create(Path::new("/dev/null")).unwrap_err();
    assert!(e.to_string().contains("a character device"), "{e}");
}

#[test]
fn reads_stop_at_the_limit_and_say_so() {
    let dir = scratch("limit");
    let path = dir.as_path().join("f");
    std::fs::write(&path, vec![b'x'; 4097]).unwrap();
    let e = read(&path, 4096).unwrap_err();
    assert_eq!(e.to_string(), "it is over the limit of 4096 bytes");
    assert_eq!(read(&path, 4097).unwrap().len(), 4097);
    std::fs::write(&path, [0xff, 0xfe]).unwrap();
    assert!(matches!(read_to_string(&path, 10), Err(Error::NotText)));
}

#[test]
fn create_truncates_a_regular_file() {
    let dir = scratch("create");
    let path = dir.as_path().join("out");
    std::fs::write(&path, b"old contents").unwrap();
    let mut f = create(&path).unwrap();
    std::io::Write::write_all(&mut f, b"new").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
}

#[test]
fn connect_refuses_a_listener_that_never_accepts_instead_of_waiting() {
    let dir = scratch("connect");
    let path = dir.as_path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // Fill the backlog (its length is the kernel's somaxconn at most): connections succeed
    // until it is full, then connect() says so at once.
    let started = Instant::now();
    let mut held = Vec::new();
    let e = loop {
        match connect(&path, Duration::from_secs(1)) {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
        assert!(held.len() < 100_000, "the backlog never filled");
    };
    assert!(matches!(e, Error::Busy), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let e = connect(dir.as_path(), Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.to_string(), "it is a directory, not a socket");
}

#[test]
fn a_nonblocking_connect_reaches_a_listener_and_fails_cleanly_without_one() {
    let tmp = scratch("nonblocking");
    let path = tmp.as_path().join("l");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut s = connect_nonblocking(&path).unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    use std::io::{Read, Write};
    s.write_all(b"hi").unwrap();
    let mut b = [0u8; 2];
    peer.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hi");
    let missing = connect_nonblocking(&tmp.as_path().join("missing")).unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn outputs_append_to_files_fifos_and_devices_and_refuse_the_rest() {
    let dir = scratch("output");
    let path = dir.as_path().join("out.log");
    std::fs::write(&path, b"old\n").unwrap();
    std::io::Write::write_all(&mut open_output(&path).unwrap(), b"new\n").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"old\nnew\n", "appended");
    let created = dir.as_path().join("fresh.log");
    open_output(&created).unwrap();
    assert!(created.exists());
    // A FIFO with no reader opens at once, and a full one answers EAGAIN, not a wait.
    let started = Instant::now();
    let mut pipe = open_output(&fifo(dir.as_path())).unwrap();
    let chunk = [7u8; 4096];
    let full = loop {
        match std::io::Write::write(&mut pipe, &chunk) {
            Ok(_) => assert!(started.elapsed() < Duration::from_secs(5)),
            Err(e) => break e,
        }
    };
    assert_eq!(full.kind(), std::io::ErrorKind::WouldBlock);
    open_output(Path::new("/dev/null")).unwrap();
    let e = open_output(dir.as_path()).unwrap_err();
    assert!(
        e.to_string().contains("Is a directory") || e.to_string().contains("a directory"),
        "{e}"
    );
}
