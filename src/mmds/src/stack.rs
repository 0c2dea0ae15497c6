//! The MMDS's own network endpoint: ARP for its address, and a TCP/IPv4 stack (smoltcp) with
//! the HTTP server on port 80. The net device gives it the guest's frames that
//! [`frame::destination`] says are for the MMDS, and takes back the frames it answers with.
//!
//! Everything is bounded, because the guest may be hostile: at most [`MAX_CONNECTIONS`]
//! connections (further SYNs are refused with RST), [`MAX_REQUEST`] bytes per request, a
//! fixed queue of frames in each direction, and connections that stop making progress are
//! dropped after [`IDLE_TIMEOUT`].

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};

use crate::frame::{self, Destination, Mac, ETHERTYPE_IPV4, ETH_HEADER};
use crate::request::{self, Parsed, MAX_REQUEST};
use crate::responder::{self, Answer};
use crate::SharedStore;

/// The MAC the MMDS answers ARP with (Firecracker's).
pub const MMDS_MAC: Mac = [0x06, 0x01, 0x23, 0x45, 0x67, 0x01];
pub const HTTP_PORT: u16 = 80;
pub const MAX_CONNECTIONS: usize = 32;
/// Sockets kept listening, so that a burst of connections is accepted at once.
const LISTENING: usize = 4;
const TX_BUFFER: usize = 16 * 1024;
/// IP MTU towards the guest; smoltcp derives its MSS from it.
const MTU: usize = 1500;
/// Frames queued towards the guest, and packets from it waiting for the stack.
const QUEUE_LIMIT: usize = 128;
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// A handshake that the guest does not complete frees its socket sooner.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// The link between smoltcp and the net device: IP packets each way.
#[derive(Debug, Default)]
struct Link {
    from_guest: VecDeque<Vec<u8>>,
    to_guest: VecDeque<Vec<u8>>,
}

struct RxToken(Vec<u8>);
struct TxToken<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.0.push_back(packet);
        r
    }
}

impl phy::Device for Link {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: SmolInstant) -> Option<(RxToken, TxToken<'_>)> {
        if self.to_guest.len() >= QUEUE_LIMIT {
            return None;
        }
        let packet = self.from_guest.pop_front()?;
        Some((RxToken(packet), TxToken(&mut self.to_guest)))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<TxToken<'_>> {
        (self.to_guest.len() < QUEUE_LIMIT).then_some(TxToken(&mut self.to_guest))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = MTU;
        // The link is memory inside one process: the guest may leave checksums to its
        // offload (partial checksums), and nothing can corrupt a frame on the way.
        let mut checksum = ChecksumCapabilities::default();
        checksum.ipv4 = Checksum::Tx;
        checksum.tcp = Checksum::Tx;
        checksum.udp = Checksum::Tx;
        checksum.icmpv4 = Checksum::Tx;
        caps.checksum = checksum;
        caps
    }
}

/// One socket's HTTP state.
#[derive(Debug)]
struct Conn {
    handle: SocketHandle,
    request: Vec<u8>,
    response: Vec<u8>,
    sent: usize,
    close_after: bool,
    /// Since when the connection has made no progress; set when it leaves LISTEN.
    last_progress: std::time::Instant,
    listening: bool,
}

impl Conn {
    fn reset(&mut self, now: std::time::Instant) {
        self.request.clear();
        self.response = Vec::new();
        self.sent = 0;
        self.close_after = false;
        self.last_progress = now;
        self.listening = true;
    }
}

pub struct MmdsStack {
    ip: Ipv4Addr,
    store: SharedStore,
    guest_mac: Option<Mac>,
    iface: Interface,
    sockets: SocketSet<'static>,
    link: Link,
    conns: Vec<Conn>,
    /// ARP replies, and IP packets with their Ethernet header, for the guest.
    out: VecDeque<Vec<u8>>,
    epoch: std::time::Instant,
}

impl std::fmt::Debug for MmdsStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmdsStack")
            .field("ip", &self.ip)
            .field("connections", &self.conns.len())
            .finish()
    }
}

impl MmdsStack {
    /// A stack that answers at `ip` from `store`.
    pub fn new(ip: Ipv4Addr, store: SharedStore) -> Self {
        let mut link = Link::default();
        let epoch = std::time::Instant::now();
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = random_seed();
        let mut iface = Interface::new(config, &mut link, SmolInstant::ZERO);
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), 32));
        });
        // Every reply goes back the way the guest's packet came; there is no other way.
        let _ = iface.routes_mut().add_default_ipv4_route(ip);
        MmdsStack {
            ip,
            store,
            guest_mac: None,
            iface,
            sockets: SocketSet::new(Vec::new()),
            link,
            conns: Vec::new(),
            out: VecDeque::new(),
            epoch,
        }
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// Takes one guest frame if it is for the MMDS, and answers what can be answered now;
    /// false if it is not (it then goes to the TAP).
    pub fn receive(&mut self, frame: &[u8]) -> bool {
        match frame::destination(frame, self.ip) {
            Destination::Arp => {
                if let Some(reply) = frame::arp_reply(frame, MMDS_MAC, self.ip) {
                    if self.out.len() < QUEUE_LIMIT {
                        self.out.push_back(reply);
                    }
                }
            }
            Destination::Tcp => {
                let ip = &frame[ETH_HEADER..];
                // No answer can go to 0.0.0.0, a broadcast or a multicast address (and
                // smoltcp asserts on the first): such segments are dropped here.
                let source = ip
                    .get(12..16)
                    .map(|a| Ipv4Addr::new(a[0], a[1], a[2], a[3]));
                if !source
                    .is_some_and(|a| !a.is_unspecified() && !a.is_broadcast() && !a.is_multicast())
                {
                    return true;
                }
                self.guest_mac = frame::source(frame).filter(|m| m[0] & 1 == 0);
                let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
                if (20..=ip.len()).contains(&total) && self.link.from_guest.len() < QUEUE_LIMIT {
                    self.link.from_guest.push_back(ip[..total].to_vec());
                }
                self.poll();
            }
            Destination::Tap => return false,
        }
        true
    }

    /// The next frame for the guest, if any; it stays queued until [`MmdsStack::pop_frame`].
    pub fn next_frame(&self) -> Option<&[u8]> {
        self.out.front().map(Vec::as_slice)
    }

    pub fn pop_frame(&mut self) {
        self.out.pop_front();
        if self.out.is_empty() {
            // Room again: let the stack send what it held back.
            self.poll();
        }
    }

    pub fn has_frames(&self) -> bool {
        !self.out.is_empty()
    }

    fn now(&self) -> SmolInstant {
        SmolInstant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// Runs the stack: timers, incoming packets, the HTTP side, outgoing packets.
    pub fn poll(&mut self) {
        self.add_listeners(std::time::Instant::now());
        for _ in 0..8 {
            let now = self.now();
            let changed = self.iface.poll(now, &mut self.link, &mut self.sockets);
            let served = self.serve();
            if changed == smoltcp::iface::PollResult::None && !served {
                break;
            }
        }
        self.frame_packets();
    }

    /// How long until [`MmdsStack::poll`] has timers to run, if it has any.
    pub fn poll_delay(&mut self) -> Option<Duration> {
        let now = self.now();
        let stack = self.iface.poll_delay(now, &self.sockets);
        let idle = self
            .conns
            .iter()
            .filter(|c| self.sockets.get::<tcp::Socket>(c.handle).state() != tcp::State::Listen)
            .map(|c| {
                let limit = self.timeout_of(c);
                limit.saturating_sub(c.last_progress.elapsed())
            })
            .min();
        let delay = match (stack, idle) {
            (Some(a), Some(b)) => Some(Duration::from(a).min(b)),
            (Some(a), None) => Some(Duration::from(a)),
            (None, b) => b,
        };
        // Nothing is lost by waking a little late, and a 0 would spin.
        delay.map(|d| d.max(Duration::from_millis(1)))
    }

    fn timeout_of(&self, conn: &Conn) -> Duration {
        match self.sockets.get::<tcp::Socket>(conn.handle).state() {
            tcp::State::SynReceived => HANDSHAKE_TIMEOUT,
            _ => IDLE_TIMEOUT,
        }
    }

    /// Wraps the stack's IP packets for the guest in Ethernet.
    fn frame_packets(&mut self) {
        while self.out.len() < QUEUE_LIMIT {
            let Some(packet) = self.link.to_guest.pop_front() else {
                break;
            };
            if let Some(dst) = self.guest_mac {
                self.out
                    .push_back(frame::ethernet(dst, MMDS_MAC, ETHERTYPE_IPV4, &packet));
            }
        }
    }

    /// Keeps enough sockets listening, and moves each connection's request and response
    /// along; true if anything was read or written.
    fn serve(&mut self) -> bool {
        let now = std::time::Instant::now();
        self.add_listeners(now);
        let mut progress = false;
        for i in 0..self.conns.len() {
            let timeout = self.timeout_of(&self.conns[i]);
            let conn = &mut self.conns[i];
            let socket = self.sockets.get_mut::<tcp::Socket>(conn.handle);
            match socket.state() {
                tcp::State::Listen => {
                    conn.listening = true;
                    continue;
                }
                // The guest has the whole response; a TIME-WAIT would only hold the socket.
                tcp::State::Closed | tcp::State::TimeWait => {
                    socket.abort();
                    let _ = socket.listen(HTTP_PORT);
                    conn.reset(now);
                    continue;
                }
                _ => {}
            }
            if conn.listening {
                // A SYN came in since the last look: the handshake's clock starts now.
                conn.listening = false;
                conn.last_progress = now;
            }
            if conn.last_progress.elapsed() >= timeout {
                log::debug!("MMDS: dropping a connection that made no progress");
                socket.abort();
                continue;
            }
            if serve_connection(&self.store, conn, socket, now) {
                conn.last_progress = now;
                progress = true;
            }
        }
        progress
    }

    fn add_listeners(&mut self, now: std::time::Instant) {
        let listening = self
            .conns
            .iter()
            .filter(|c| self.sockets.get::<tcp::Socket>(c.handle).state() == tcp::State::Listen)
            .count();
        for _ in listening..LISTENING {
            if self.conns.len() >= MAX_CONNECTIONS {
                break;
            }
            let mut socket = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; MAX_REQUEST]),
                tcp::SocketBuffer::new(vec![0; TX_BUFFER]),
            );
            if socket.listen(HTTP_PORT).is_err() {
                break;
            }
            let handle = self.sockets.add(socket);
            self.conns.push(Conn {
                handle,
                request: Vec::new(),
                response: Vec::new(),
                sent: 0,
                close_after: false,
                last_progress: now,
                listening: true,
            });
        }
    }
}

/// Reads what the guest sent, answers complete requests one at a time, and writes as much
/// of the answer as the socket takes; true if anything moved.
fn serve_connection(
    store: &SharedStore,
    conn: &mut Conn,
    socket: &mut tcp::Socket,
    now: std::time::Instant,
) -> bool {
    let mut progress = false;
    if socket.can_recv() {
        // One byte past the limit is enough to know a request is too long.
        let room = (MAX_REQUEST + 1).saturating_sub(conn.request.len());
        let got = socket.recv(|data| {
            let n = data.len().min(room);
            (n, data[..n].to_vec())
        });
        if let Ok(bytes) = got {
            progress |= !bytes.is_empty();
            conn.request.extend_from_slice(&bytes);
        }
    }
    loop {
        if conn.sent < conn.response.len() {
            if !socket.can_send() {
                break;
            }
            match socket.send_slice(&conn.response[conn.sent..]) {
                Ok(n) => {
                    conn.sent += n;
                    progress |= n > 0;
                }
                Err(_) => break,
            }
            if conn.sent < conn.response.len() {
                break;
            }
            conn.response = Vec::new();
            conn.sent = 0;
            if conn.close_after {
                socket.close();
                break;
            }
        }
        if conn.close_after {
            break;
        }
        match request::parse(&conn.request) {
            Parsed::Incomplete => break,
            Parsed::Request(req, used) => {
                conn.request.drain(..used);
                let answer = responder::answer(&mut crate::lock(store), &req, now);
                conn.response = answer.to_bytes(req.close);
                conn.close_after = req.close;
            }
            Parsed::Bad(why) => {
                log::debug!("MMDS: bad request from the guest: {why}");
                conn.request.clear();
                let answer = Answer {
                    status: 400,
                    content_type: "text/plain",
                    body: format!("Bad request: {why}."),
                    allow: None,
                };
                conn.response = answer.to_bytes(true);
                conn.close_after = true;
            }
        }
        progress = true;
    }
    // The guest closed its side with nothing left to answer.
    if !socket.may_recv() && conn.response.is_empty() && socket.state() == tcp::State::CloseWait {
        socket.close();
    }
    progress
}

fn random_seed() -> u64 {
    let mut seed = [0u8; 8];
    match crate::token::random_bytes(&mut seed) {
        Ok(()) => u64::from_ne_bytes(seed),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

#[cfg(test)]
mod tests;
