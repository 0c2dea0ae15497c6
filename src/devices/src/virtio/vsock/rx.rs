//! Host to guest: what each connection owes the guest, put in the RX queue's buffers in turn,
//! data only as far as the guest's credit goes.

use std::time::Instant;

use virtio_queue::{QueueOwnedT, QueueT};

use super::chain::{writable_buffers, write_buffers};
use super::conn::{owe, Next};
use super::packet::*;
use super::{Vsock, ANSWER_TIMEOUT, MAX_ORPHAN_RSTS, RX};

fn op_for(bit: u8) -> u16 {
    match bit {
        owe::RST => OP_RST,
        owe::REQUEST => OP_REQUEST,
        owe::RESPONSE => OP_RESPONSE,
        owe::SHUTDOWN => OP_SHUTDOWN,
        owe::CREDIT_UPDATE => OP_CREDIT_UPDATE,
        _ => OP_CREDIT_REQUEST,
    }
}

impl Vsock {
    /// The next thing for the guest: an orphan RST, or the first queued connection's packet.
    pub(super) fn next_for_guest(&mut self) -> Option<(u32, Next)> {
        if !self.orphan_rsts.is_empty() {
            return Some((0, Next::Control(owe::RST)));
        }
        while let Some(&id) = self.queue.front() {
            if let Some(conn) = self.conns.get_mut(&id) {
                if let Some(next) = conn.next() {
                    return Some((id, next));
                }
                conn.queued = false;
            }
            self.queue.pop_front();
        }
        None
    }

    /// Fills RX buffers with what is owed to the guest, and reads the TX queue again if it
    /// waited for the RSTs to drain; true if any RX buffer was used.
    pub fn process_rx(&mut self) -> bool {
        let mut used = self.fill_rx();
        while self.tx_stalled && self.orphan_rsts.len() < MAX_ORPHAN_RSTS {
            if !self.process_tx() {
                break;
            }
            used |= self.fill_rx();
        }
        used
    }

    fn fill_rx(&mut self) -> bool {
        if !self.rx_open() {
            return false;
        }
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let mut used_any = false;
        while let Some((id, next)) = self.next_for_guest() {
            let Some(chain) = active.queues[RX].pop_descriptor_chain(&active.mem) else {
                break;
            };
            let head = chain.head_index();
            let bufs = writable_buffers(&active.mem, chain).unwrap_or_default();
            let room = bufs.iter().map(|b| b.1).sum::<usize>();
            // Too small for a header, or (for data) for a byte after it.
            if room < HEADER_LEN || (room == HEADER_LEN && next == Next::Data) {
                self.metrics.invalid_packets.inc();
                let _ = active.queues[RX].add_used(&active.mem, head, 0);
                used_any = true;
                continue;
            }
            buf.resize(HEADER_LEN + MAX_PAYLOAD as usize, 0);
            let Some(len) = self.packet_for_guest(id, next, &mut buf, room - HEADER_LEN) else {
                active.queues[RX].go_to_previous_position();
                continue;
            };
            let used = HEADER_LEN + len;
            if !write_buffers(&active.mem, &bufs, &buf[..used]) {
                self.metrics.invalid_packets.inc();
            }
            self.metrics.rx_packets_count.inc();
            if active.queues[RX]
                .add_used(&active.mem, head, used as u32)
                .is_err()
            {
                log::debug!("vsock: RX used ring update failed");
            }
            used_any = true;
        }
        if used_any {
            active.notify(RX);
        }
        self.buf = buf;
        self.common.active = Some(active);
        used_any
    }

    /// Puts the packet `next` of connection `id` in `buf` (header, then at most `room`
    /// payload bytes); its payload length, or `None` if there turned out to be nothing.
    pub(super) fn packet_for_guest(
        &mut self,
        id: u32,
        next: Next,
        buf: &mut [u8],
        room: usize,
    ) -> Option<usize> {
        if id == 0 {
            let header = self.orphan_rsts.pop_front()?;
            buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
            return Some(0);
        }
        let cid = self.cid;
        let conn = self.conns.get_mut(&id)?;
        let mut ended = false;
        let (header, len) = match next {
            Next::Control(bit) => {
                conn.owed &= !bit;
                let mut h = conn.header(cid, op_for(bit), 0);
                match bit {
                    owe::REQUEST => conn.deadline = Some(Instant::now() + ANSWER_TIMEOUT),
                    owe::SHUTDOWN => {
                        h.flags = conn.shutdown_flags;
                        if h.flags == SHUTDOWN_SEND | SHUTDOWN_RCV {
                            conn.deadline = Some(Instant::now() + ANSWER_TIMEOUT);
                        }
                    }
                    owe::RST => ended = true,
                    _ => {}
                }
                (h, 0)
            }
            Next::Data => {
                let want = room.min(conn.peer_credit() as usize);
                match conn.read_host(&mut buf[HEADER_LEN..HEADER_LEN + want]) {
                    Ok(0) => {
                        conn.on_host_eof();
                        return None;
                    }
                    Ok(n) => {
                        self.metrics.rx_bytes_count.add(n as u64);
                        let h = conn.header(cid, OP_RW, n as u32);
                        // Others get a turn before this connection's next packet.
                        if self.queue.front() == Some(&id) {
                            self.queue.pop_front();
                            self.queue.push_back(id);
                        }
                        (h, n)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        conn.readable = false;
                        return None;
                    }
                    Err(_) => {
                        self.metrics.rx_read_fails.inc();
                        self.kill(id);
                        return None;
                    }
                }
            }
        };
        if ended {
            self.remove_conn(id);
        }
        buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        Some(len)
    }
}
