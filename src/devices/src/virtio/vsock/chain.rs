//! Reading and writing packets in the guest's descriptor chains: every address and length
//! the guest gave is checked against guest memory, and sizes are capped.

use vm_memory::{Bytes, GuestAddress, GuestMemory as _, Permissions};

use super::packet::{Header, HEADER_LEN, MAX_PAYLOAD};
use crate::virtio::GuestMemory;

/// Why a TX chain is not a packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Bad {
    WriteOnly,
    OutsideMemory,
    Short,
    Length,
}

/// The chain's device-writable buffers, capped at a header and the largest payload.
pub fn writable_buffers(
    mem: &GuestMemory,
    chain: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
) -> Option<Vec<(GuestAddress, usize)>> {
    let mut out = Vec::new();
    let mut room = HEADER_LEN + MAX_PAYLOAD as usize;
    for d in chain {
        if !d.is_write_only() || !mem.check_range(d.addr(), d.len() as usize, Permissions::Write) {
            return None;
        }
        let len = (d.len() as usize).min(room);
        if len > 0 {
            out.push((d.addr(), len));
            room -= len;
        }
    }
    Some(out)
}

/// Reads a TX chain (header and payload) into `buf`; returns the header.
pub fn read_packet(
    mem: &GuestMemory,
    chain: impl Iterator<Item = virtio_queue::desc::split::Descriptor>,
    buf: &mut Vec<u8>,
) -> Result<Header, Bad> {
    buf.clear();
    let cap = HEADER_LEN + MAX_PAYLOAD as usize;
    for d in chain {
        if d.is_write_only() {
            return Err(Bad::WriteOnly);
        }
        let len = d.len() as usize;
        if !mem.check_range(d.addr(), len, Permissions::Read) {
            return Err(Bad::OutsideMemory);
        }
        let take = len.min(cap - buf.len());
        let at = buf.len();
        buf.resize(at + take, 0);
        mem.read_slice(&mut buf[at..], d.addr())
            .map_err(|_| Bad::OutsideMemory)?;
    }
    let Some(raw) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(Bad::Short);
    };
    let header = Header::parse(raw);
    if header.len > MAX_PAYLOAD || header.len as usize > buf.len() - HEADER_LEN {
        return Err(Bad::Length);
    }
    buf.truncate(HEADER_LEN + header.len as usize);
    Ok(header)
}

/// Writes `bytes` across `bufs`; false if they do not fit.
pub fn write_buffers(mem: &GuestMemory, bufs: &[(GuestAddress, usize)], bytes: &[u8]) -> bool {
    let mut done = 0;
    for &(addr, len) in bufs {
        if done == bytes.len() {
            break;
        }
        let n = len.min(bytes.len() - done);
        if mem.write_slice(&bytes[done..done + n], addr).is_err() {
            return false;
        }
        done += n;
    }
    done == bytes.len()
}
