//! One vsock stream: its host Unix socket, where it is in its life, the control packets it
//! owes the guest, and both directions' credit.
//!
//! Guest to host, the guest may send at most [`BUF_ALLOC`] bytes the host has not taken;
//! what the host socket cannot take at once waits in `pending`, which therefore never holds
//! more than that (a guest that sends more is reset). Host to guest, ember reads from the
//! host socket only as much as the guest's buffer has room for (`peer_credit`), so a guest
//! that stops reading leaves the data in the host socket, and the host writer blocks.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use super::host::{parse_connect, MAX_CONNECT_LINE};
use super::packet::{Header, HOST_CID, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};

/// The buffer each connection offers the guest.
pub const BUF_ALLOC: u32 = 256 << 10;
/// A credit update is sent once the host has taken this much since the last one the guest
/// saw (every packet to the guest carries one too).
const CREDIT_UPDATE_AFTER: u32 = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Host-initiated: reading the `CONNECT <port>\n` line.
    ReadingConnect,
    /// A REQUEST is owed or was sent to the guest; its RESPONSE is awaited.
    Requested,
    Established,
}

/// Control packets owed to the guest, most urgent first.
pub mod owe {
    pub const RST: u8 = 1;
    pub const REQUEST: u8 = 2;
    pub const RESPONSE: u8 = 4;
    pub const SHUTDOWN: u8 = 8;
    pub const CREDIT_UPDATE: u8 = 16;
    pub const CREDIT_REQUEST: u8 = 32;
}

/// What a connection sends the guest next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Control(u8),
    Data,
}

/// What reading the `CONNECT` line gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Incomplete,
    Port(u32),
    /// Malformed, too long, or the host closed first.
    Bad,
}

#[derive(Debug)]
pub struct Conn {
    pub stream: UnixStream,
    /// The host's end of the stream (the port ember gives it) and the guest's.
    pub local_port: u32,
    pub peer_port: u32,
    pub state: State,
    line: Vec<u8>,
    /// Bytes for the host socket that it has not taken yet, from `pending_at`.
    pending: Vec<u8>,
    pending_at: usize,
    /// Leading pending bytes that are ember's own (the `OK` line), not the guest's.
    own_bytes: usize,
    fwd_cnt: u32,
    announced_fwd_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes sent to the guest.
    rx_cnt: u32,
    /// The host socket may have bytes (edge-triggered: set by events, cleared by EAGAIN).
    pub readable: bool,
    /// The host socket ended (read gave 0) and the guest was or will be told.
    pub host_eof: bool,
    /// The host closed its end entirely (not just shut down writing).
    pub host_hup: bool,
    /// SHUTDOWN flags the guest sent.
    pub peer_shutdown: u32,
    pub owed: u8,
    pub shutdown_flags: u32,
    /// In the device's queue of connections with something for the guest.
    pub queued: bool,
    /// When the host's `CONNECT` line, or the guest's answer (a RESPONSE, or an RST after a
    /// full SHUTDOWN), is overdue.
    pub deadline: Option<Instant>,
    credit_requested: bool,
    /// The host's writing end was shut down (the guest will send no more).
    host_write_shut: bool,
}

impl Conn {
    /// A connection a host process opened on the vsock socket; it names the port next.
    pub fn host_initiated(stream: UnixStream) -> Conn {
        Conn::new(stream, 0, 0, State::ReadingConnect)
    }

    /// A connection the guest asked for with `request`, to a host socket already connected.
    pub fn guest_initiated(stream: UnixStream, request: &Header) -> Conn {
        let mut c = Conn::new(
            stream,
            request.dst_port,
            request.src_port,
            State::Established,
        );
        c.update_peer(request);
        c.owed = owe::RESPONSE;
        c
    }

    fn new(stream: UnixStream, local_port: u32, peer_port: u32, state: State) -> Conn {
        Conn {
            stream,
            local_port,
            peer_port,
            state,
            line: Vec::new(),
            pending: Vec::new(),
            pending_at: 0,
            own_bytes: 0,
            fwd_cnt: 0,
            announced_fwd_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            rx_cnt: 0,
            readable: true,
            host_eof: false,
            host_hup: false,
            peer_shutdown: 0,
            owed: 0,
            shutdown_flags: 0,
            queued: false,
            deadline: None,
            credit_requested: false,
            host_write_shut: false,
        }
    }

    /// Reads the `CONNECT` line a byte at a time, so that nothing after it is consumed.
    pub fn read_connect_line(&mut self) -> Line {
        let mut byte = [0u8; 1];
        loop {
            match self.stream.read(&mut byte) {
                Ok(0) => return Line::Bad,
                Ok(_) => {
                    self.line.push(byte[0]);
                    if byte[0] == b'\n' {
                        return parse_connect(&self.line).map_or(Line::Bad, Line::Port);
                    }
                    if self.line.len() >= MAX_CONNECT_LINE {
                        return Line::Bad;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Line::Incomplete,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Line::Bad,
            }
        }
    }

    /// Takes the credit fields of a packet from the guest.
    pub fn update_peer(&mut self, h: &Header) {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = h.fwd_cnt;
        if self.peer_credit() > 0 {
            self.credit_requested = false;
        }
    }

    /// How many bytes the guest has room for.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = self.rx_cnt.wrapping_sub(self.peer_fwd_cnt);
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    /// A header for a packet to the guest, carrying this side's credit.
    pub fn header(&mut self, guest_cid: u64, op: u16, len: u32) -> Header {
        self.announced_fwd_cnt = self.fwd_cnt;
        Header {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: self.local_port,
            dst_port: self.peer_port,
            len,
            kind: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// What to send the guest next, if anything (data only as far as its credit goes).
    pub fn next(&mut self) -> Option<Next> {
        for bit in [owe::RST, owe::REQUEST, owe::RESPONSE] {
            if self.owed & bit != 0 {
                return Some(Next::Control(bit));
            }
        }
        let open = self.state == State::Established && self.peer_shutdown & SHUTDOWN_RCV == 0;
        if open && self.readable && !self.host_eof {
            if self.peer_credit() > 0 {
                return Some(Next::Data);
            }
            if !self.credit_requested {
                self.credit_requested = true;
                self.owed |= owe::CREDIT_REQUEST;
            }
        }
        [owe::SHUTDOWN, owe::CREDIT_UPDATE, owe::CREDIT_REQUEST]
            .into_iter()
            .find(|&bit| self.owed & bit != 0)
            .map(Next::Control)
    }

    /// Reads host bytes for the guest into `buf` (already cut to the guest's credit).
    /// `Ok(0)` is the end of the host's stream.
    pub fn read_host(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.rx_cnt = self.rx_cnt.wrapping_add(n as u32);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The host stream ended: the guest is told with a SHUTDOWN (both ways once the host
    /// closed entirely, so that the guest answers with an RST).
    pub fn on_host_eof(&mut self) {
        self.host_eof = true;
        self.shutdown_flags = match self.host_hup {
            true => SHUTDOWN_SEND | SHUTDOWN_RCV,
            false => SHUTDOWN_SEND,
        };
        self.owed |= owe::SHUTDOWN;
    }

    /// Guest bytes for the host; `false` if they exceed the credit this side gave.
    pub fn send_to_host(&mut self, data: &[u8]) -> io::Result<bool> {
        if self.pending_len() + data.len() > BUF_ALLOC as usize {
            return Ok(false);
        }
        self.pending.extend_from_slice(data);
        self.flush()?;
        Ok(true)
    }

    /// Ember's own line for the host (`OK <port>\n`), ahead of any guest data.
    pub fn send_line_to_host(&mut self, line: &[u8]) -> io::Result<()> {
        debug_assert!(self.pending.len() == self.pending_at);
        self.pending.extend_from_slice(line);
        self.own_bytes += line.len();
        self.flush()
    }

    /// Writes what the host socket takes of `pending`; counts the guest's bytes as forwarded.
    pub fn flush(&mut self) -> io::Result<()> {
        while self.pending_at < self.pending.len() {
            match self.stream.write(&self.pending[self.pending_at..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.pending_at += n;
                    let own = n.min(self.own_bytes);
                    self.own_bytes -= own;
                    self.fwd_cnt = self.fwd_cnt.wrapping_add((n - own) as u32);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.pending_at == self.pending.len() {
            self.pending.clear();
            self.pending_at = 0;
        } else if self.pending_at > self.pending.len() / 2 {
            self.pending.drain(..self.pending_at);
            self.pending_at = 0;
        }
        if self.fwd_cnt.wrapping_sub(self.announced_fwd_cnt) >= CREDIT_UPDATE_AFTER {
            self.owed |= owe::CREDIT_UPDATE;
        }
        Ok(())
    }

    /// Guest bytes held for the host.
    pub fn pending_len(&self) -> usize {
        self.pending.len() - self.pending_at - self.own_bytes
    }

    pub fn has_pending(&self) -> bool {
        self.pending_at < self.pending.len()
    }

    /// After the guest said it sends no more and everything reached the host: the host's
    /// reader sees the end. Returns true once the guest has shut down both ways and is owed
    /// its RST.
    pub fn finish_guest_side(&mut self) -> bool {
        if self.has_pending() {
            return false;
        }
        if self.peer_shutdown & SHUTDOWN_SEND != 0 && !self.host_write_shut {
            self.host_write_shut = true;
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        self.peer_shutdown == SHUTDOWN_SEND | SHUTDOWN_RCV
    }
}
