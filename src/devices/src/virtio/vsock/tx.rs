//! Guest to host: the TX queue's packets, checked, and applied to their connections.

use std::ffi::OsString;

use virtio_queue::QueueT;

use super::chain::read_packet;
use super::conn::{owe, Conn, State};
use super::packet::*;
use super::{Vsock, MAX_CONNS, MAX_ORPHAN_RSTS, TX};

impl Vsock {
    /// Reads every packet the guest queued, while the RSTs owed for them have room.
    pub fn process_tx(&mut self) -> bool {
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let mut used_any = false;
        self.tx_stalled = false;
        loop {
            if self.orphan_rsts.len() >= MAX_ORPHAN_RSTS {
                self.tx_stalled = true;
                break;
            }
            let Some(chain) = active.queues[TX].pop_descriptor_chain(&active.mem) else {
                break;
            };
            let head = chain.head_index();
            let packet = read_packet(&active.mem, chain, &mut buf);
            if active.queues[TX].add_used(&active.mem, head, 0).is_err() {
                log::debug!("vsock: TX used ring update failed");
            }
            used_any = true;
            match packet {
                Ok(header) => self.on_guest_packet(&header, &buf[HEADER_LEN..]),
                Err(why) => {
                    self.metrics.invalid_packets.inc();
                    log::debug!("vsock: a TX chain that is not a packet: {why:?}");
                }
            }
        }
        if used_any {
            active.notify(TX);
        }
        self.buf = buf;
        self.common.active = Some(active);
        used_any
    }

    pub(super) fn on_guest_packet(&mut self, h: &Header, payload: &[u8]) {
        self.metrics.tx_packets_count.inc();
        if h.src_cid != self.cid || h.dst_cid != HOST_CID {
            self.metrics.invalid_packets.inc();
            log::debug!(
                "vsock: a packet from CID {} to CID {}",
                h.src_cid,
                h.dst_cid
            );
            return;
        }
        if h.kind != TYPE_STREAM {
            self.metrics.invalid_packets.inc();
            if h.op != OP_RST {
                self.orphan_rst(h);
            }
            return;
        }
        let Some(&id) = self.ports.get(&(h.dst_port, h.src_port)) else {
            match h.op {
                OP_REQUEST => self.guest_connect(h),
                OP_RST => {}
                _ => self.orphan_rst(h),
            }
            return;
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.update_peer(h);
        match (h.op, conn.state) {
            (OP_RESPONSE, State::Requested) => {
                conn.state = State::Established;
                conn.deadline = None;
                let line = format!("OK {}\n", conn.local_port);
                if conn.send_line_to_host(line.as_bytes()).is_err() {
                    self.metrics.tx_write_fails.inc();
                    return self.kill(id);
                }
            }
            (OP_RW, State::Established) if conn.peer_shutdown & SHUTDOWN_SEND == 0 => {
                self.metrics.tx_bytes_count.add(payload.len() as u64);
                match conn.send_to_host(payload) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.metrics.invalid_packets.inc();
                        log::debug!("vsock: the guest sent past its credit; reset");
                        return self.kill(id);
                    }
                    Err(_) => {
                        self.metrics.tx_write_fails.inc();
                        return self.kill(id);
                    }
                }
            }
            (OP_SHUTDOWN, State::Established) => {
                conn.peer_shutdown |= h.flags & (SHUTDOWN_RCV | SHUTDOWN_SEND);
                if conn.finish_guest_side() {
                    return self.kill(id);
                }
            }
            (OP_RST, _) => return self.remove_conn(id),
            (OP_CREDIT_UPDATE, _) => {}
            (OP_CREDIT_REQUEST, _) => conn.owed |= owe::CREDIT_UPDATE,
            _ => {
                self.metrics.invalid_packets.inc();
                return self.kill(id);
            }
        }
        self.schedule(id);
    }

    /// A guest REQUEST to the host: connects to `<uds_path>_<port>`, or answers with an RST.
    pub(super) fn guest_connect(&mut self, h: &Header) {
        if self.conns.len() >= MAX_CONNS {
            log::debug!("vsock: {MAX_CONNS} connections already; guest request refused");
            return self.orphan_rst(h);
        }
        let mut path = OsString::from(self.uds_path.as_os_str());
        path.push(format!("_{}", h.dst_port));
        match hostfile::connect_nonblocking(std::path::Path::new(&path)) {
            Ok(stream) => {
                let id = self.add_conn(Conn::guest_initiated(stream, h));
                self.schedule(id);
            }
            Err(e) => {
                log::debug!("vsock: guest connection to {path:?} refused: {e}");
                self.orphan_rst(h);
            }
        }
    }
}
