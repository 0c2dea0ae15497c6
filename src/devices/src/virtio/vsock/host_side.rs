//! The host's Unix sockets: accepting and reading `CONNECT` lines, their readiness events,
//! the answer timer, and keeping the event loop's watch list in step.

use std::time::{Duration, Instant};

use event_manager::{EventOps, Events};
use vmm_sys_util::epoll::EventSet;

use super::conn::{owe, Conn, Line, State};
use super::{Vsock, CONNECT_LINE_TIMEOUT, FIRST_HOST_PORT, MAX_CONNS};

impl Vsock {
    /// Takes every connection waiting on the listener.
    pub(super) fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CONNS || stream.set_nonblocking(true).is_err() {
                        log::debug!("vsock: a host connection refused");
                        continue;
                    }
                    let mut conn = Conn::host_initiated(stream);
                    // A host that never names a port does not hold a slot for long.
                    conn.deadline = Some(Instant::now() + CONNECT_LINE_TIMEOUT);
                    let id = self.add_conn(conn);
                    self.read_connect_line(id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.metrics.muxer_event_fails.inc();
                    log::warn!("vsock: accepting on {:?} failed: {e}", self.uds_path);
                    break;
                }
            }
        }
    }

    pub(super) fn read_connect_line(&mut self, id: u32) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        match conn.read_connect_line() {
            Line::Incomplete => {}
            Line::Bad => {
                log::debug!("vsock: a host connection without a valid CONNECT line");
                self.remove_conn(id);
            }
            Line::Port(port) => {
                let peer = port;
                let mut local = self.next_port;
                while self.ports.contains_key(&(local, peer)) {
                    local = local.wrapping_add(1).max(FIRST_HOST_PORT);
                }
                self.next_port = local.wrapping_add(1).max(FIRST_HOST_PORT);
                let Some(conn) = self.conns.get_mut(&id) else {
                    return;
                };
                conn.local_port = local;
                conn.peer_port = peer;
                conn.state = State::Requested;
                conn.deadline = None;
                conn.owed = owe::REQUEST;
                self.ports.insert((local, peer), id);
                self.schedule(id);
            }
        }
    }

    pub(super) fn on_conn_event(&mut self, id: u32, set: EventSet) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if set.contains(EventSet::ERROR) {
            self.metrics.conn_event_fails.inc();
            return self.kill(id);
        }
        if set.contains(EventSet::HANG_UP) {
            conn.host_hup = true;
        }
        if conn.state == State::ReadingConnect {
            return self.read_connect_line(id);
        }
        if set.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP) {
            conn.readable = true;
        }
        if set.contains(EventSet::OUT) && conn.has_pending() {
            match conn.flush() {
                Ok(()) => {
                    if conn.finish_guest_side() {
                        return self.kill(id);
                    }
                }
                Err(_) => {
                    self.metrics.tx_write_fails.inc();
                    return self.kill(id);
                }
            }
        }
        self.schedule(id);
    }

    /// Connections whose guest did not answer in time are reset; host connections that did
    /// not send their `CONNECT` line in time are closed.
    pub(super) fn on_timer(&mut self) {
        let now = Instant::now();
        let late: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            log::debug!("vsock: the guest did not answer in time; connection reset");
            self.kill(id);
        }
    }

    /// Arms the timer for the earliest deadline (on the VMM thread).
    pub(super) fn rearm_timer(&mut self) {
        let first = self
            .conns
            .values()
            .filter_map(|c| c.deadline)
            .chain(self.reset_unacked)
            .min();
        if first == self.armed {
            return;
        }
        self.armed = first;
        let result = match first {
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                self.timer.reset(wait.max(Duration::from_millis(1)), None)
            }
            None => self.timer.clear(),
        };
        if let Err(e) = result {
            self.metrics.muxer_event_fails.inc();
            log::warn!("vsock: cannot arm the timer: {e}");
        }
    }

    /// Watches new connections and forgets ended ones.
    pub(super) fn sync_watches(&mut self, ops: &mut EventOps) {
        for conn in self.closed.drain(..) {
            let _ = ops.remove(Events::empty(&conn.stream));
        }
        for id in std::mem::take(&mut self.to_watch) {
            let Some(conn) = self.conns.get(&id) else {
                continue;
            };
            let set = EventSet::IN | EventSet::OUT | EventSet::READ_HANG_UP;
            let events = Events::with_data(&conn.stream, id, set | EventSet::EDGE_TRIGGERED);
            if let Err(e) = ops.add(events) {
                self.metrics.conn_event_fails.inc();
                log::warn!("vsock: cannot watch a connection: {e}");
                self.kill(id);
            }
        }
    }
}
