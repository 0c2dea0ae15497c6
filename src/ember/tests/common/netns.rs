//! Network namespaces for the network tests: every TAP device and host address lives in a
//! namespace the test creates and removes, so no traffic reaches any other network. Host-side
//! peers run on threads that joined the namespace.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::skip;

pub struct NetNs {
    pub name: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl NetNs {
    /// A fresh namespace with loopback up, or None after printing why it cannot be made.
    pub fn new_or_skip(test: &str) -> Option<NetNs> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "ember-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        if let Err(e) = ip(&["netns", "add", &name]) {
            skip(test, &format!("cannot create a network namespace ({e})"));
            return None;
        }
        let ns = NetNs { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        Some(ns)
    }

    /// Runs a command inside the namespace; panics if it fails.
    pub fn exec(&self, cmd: &[&str]) -> String {
        let mut ip = Command::new("ip");
        ip.args(["netns", "exec", &self.name]).args(cmd);
        super::output_of(&mut ip, &cmd.join(" "))
    }

    /// Adds TAP device `tap`, with host address `cidr` (if any) and `mtu`, and brings it up.
    pub fn add_tap(&self, tap: &str, cidr: Option<&str>, mtu: u32) {
        self.add_tap_owned(tap, cidr, mtu, None);
    }

    /// [`NetNs::add_tap`], with the TAP owned by `owner` (uid and gid), so that an
    /// unprivileged (jailed) ember may attach to it.
    pub fn add_tap_owned(&self, tap: &str, cidr: Option<&str>, mtu: u32, owner: Option<u32>) {
        let id = owner.map(|o| o.to_string());
        let mut add = vec!["ip", "tuntap", "add", tap, "mode", "tap"];
        if let Some(id) = &id {
            add.extend(["user", id, "group", id]);
        }
        self.exec(&add);
        self.exec(&["ip", "link", "set", tap, "mtu", &mtu.to_string()]);
        if let Some(cidr) = cidr {
            self.exec(&["ip", "addr", "add", cidr, "dev", tap]);
        }
        self.exec(&["ip", "link", "set", tap, "up"]);
    }

    /// A counter of `/sys/class/net/<dev>/statistics`, as the namespace sees it.
    pub fn counter(&self, dev: &str, name: &str) -> u64 {
        let path = format!("/sys/class/net/{dev}/statistics/{name}");
        self.exec(&["cat", &path]).trim().parse().unwrap()
    }

    /// Moves the calling thread into the namespace (for host-side sockets).
    pub fn enter(&self) {
        let file = std::fs::File::open(format!("/var/run/netns/{}", self.name)).unwrap();
        // SAFETY: setns takes a descriptor we own and a flag; it changes only this thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }

    /// Runs `f` on a thread inside the namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(path).unwrap();
            // SAFETY: as in `enter`.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Removing the namespace removes its TAP devices and addresses.
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Every frame seen on one device, from a packet socket opened inside a namespace.
pub struct Capture {
    fd: std::os::fd::OwnedFd,
}

impl Capture {
    /// Starts capturing on `dev`; call from a thread inside the namespace (see [`NetNs::enter`]).
    pub fn open(dev: &str) -> Capture {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket() takes no pointers.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let name = std::ffi::CString::new(dev).unwrap();
        // SAFETY: `name` is a valid C string for the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(index != 0, "no device {dev}");
        // SAFETY: zeroes are a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        // SAFETY: `addr` is a sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: SO_RCVTIMEO reads one timeval of the size given.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Capture { fd }
    }

    /// The next frame (its first 128 bytes), or None after 200 ms without one.
    pub fn next(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 128];
        // SAFETY: recv writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if n <= 0 {
            return None;
        }
        buf.truncate((n as usize).min(128));
        Some(buf)
    }
}

/// The first connection to `listener` within `deadline`, with a 120 s read timeout.
pub fn accept(listener: &TcpListener, deadline: Duration) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let started = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(120)))
                    .unwrap();
                return stream;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(started.elapsed() < deadline, "the guest never connected");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// What a host-side [`sink`] read from its connection.
pub use guest_agent::Received;

/// A host-side peer in `ns`: listens on `addr` (before this returns), takes the first
/// connection and hands it to `serve` on its own thread.
fn peer<T: Send + 'static>(
    ns: &NetNs,
    addr: &str,
    serve: impl FnOnce(TcpStream) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let addr = addr.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = ns.spawn(move || {
        let listener = TcpListener::bind(&addr).unwrap();
        tx.send(()).unwrap();
        serve(accept(&listener, super::linux::linux_deadline()))
    });
    rx.recv().unwrap();
    thread
}

/// A peer that reads one connection to its end.
pub fn sink(ns: &NetNs, addr: &str, skip: u64) -> std::thread::JoinHandle<Received> {
    peer(ns, addr, move |mut stream| {
        guest_agent::receive(&mut stream, skip, 1 << 18).unwrap()
        // Dropping the stream closes it: the guest waits for that to know the data arrived.
    })
}

/// A peer that sends `len` bytes of the guest agent's pattern from `seed` to one connection.
pub fn source(ns: &NetNs, addr: &str, len: u64, seed: u64) -> std::thread::JoinHandle<()> {
    peer(ns, addr, move |mut stream| {
        guest_agent::write_pattern(&mut stream, len, seed).unwrap();
    })
}
