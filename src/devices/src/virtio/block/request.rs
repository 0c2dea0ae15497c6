//! One virtio-blk request, parsed from a guest descriptor chain and checked before any byte
//! of the disk is touched: header first (device-readable), data buffers in the direction the
//! request type needs, a one-byte device-writable status last, every buffer inside guest
//! memory and the whole transfer inside the disk.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

pub const SECTOR_SIZE: u64 = 512;
const HEADER_LEN: u32 = 16;
/// Largest transfer one request may ask for: bounds the work a single guest request causes.
const MAX_DATA_LEN: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    In,
    Out,
    Flush,
    GetId,
    Unsupported(u32),
}

impl From<u32> for RequestType {
    fn from(value: u32) -> Self {
        match value {
            VIRTIO_BLK_T_IN => RequestType::In,
            VIRTIO_BLK_T_OUT => RequestType::Out,
            VIRTIO_BLK_T_FLUSH => RequestType::Flush,
            VIRTIO_BLK_T_GET_ID => RequestType::GetId,
            other => RequestType::Unsupported(other),
        }
    }
}

/// Why a chain is not a request the device can act on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("the descriptor chain is empty")]
    Empty,
    #[error("the request header is missing, too short or device-writable")]
    BadHeader,
    #[error("the request header lies outside guest memory")]
    HeaderOutsideMemory,
    #[error("the status descriptor is missing, empty or not device-writable")]
    BadStatus,
    #[error("a data buffer points the wrong way for this request type")]
    WrongDirection,
    #[error("a data buffer lies outside guest memory")]
    BufferOutsideMemory,
    #[error("the data length is not a whole number of sectors")]
    PartialSector,
    #[error("the data length is too large")]
    TooLong,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: RequestType,
    pub sector: u64,
    pub data: Vec<(GuestAddress, u32)>,
    pub status: GuestAddress,
}

impl Request {
    /// Total length of the data buffers.
    pub fn data_len(&self) -> u64 {
        self.data.iter().map(|&(_, len)| u64::from(len)).sum()
    }

    /// Parses the descriptors of one chain. virtio-queue's chain iterator already stops at
    /// loops, at chains longer than the queue and at descriptors outside the table; here every
    /// address and length is checked against guest memory.
    pub fn parse<M: GuestMemory>(
        mem: &M,
        chain: impl Iterator<Item = Descriptor>,
    ) -> Result<Request, RequestError> {
        let descriptors: Vec<Descriptor> = chain.collect();
        let (header, rest) = descriptors.split_first().ok_or(RequestError::Empty)?;
        if header.is_write_only() || header.len() < HEADER_LEN {
            return Err(RequestError::BadHeader);
        }
        let kind_raw: u32 = mem
            .read_obj(header.addr())
            .map_err(|_| RequestError::HeaderOutsideMemory)?;
        let sector_addr = header
            .addr()
            .checked_add(8)
            .ok_or(RequestError::HeaderOutsideMemory)?;
        let sector: u64 = mem
            .read_obj(sector_addr)
            .map_err(|_| RequestError::HeaderOutsideMemory)?;
        let kind = RequestType::from(kind_raw);

        let (status, data) = rest.split_last().ok_or(RequestError::BadStatus)?;
        if !status.is_write_only()
            || status.len() < 1
            || !mem.check_range(status.addr(), 1, Permissions::Write)
        {
            return Err(RequestError::BadStatus);
        }
        let device_writes = matches!(kind, RequestType::In | RequestType::GetId);
        let mut buffers = Vec::with_capacity(data.len());
        let mut total: u64 = 0;
        for d in data {
            if matches!(
                kind,
                RequestType::In | RequestType::Out | RequestType::GetId
            ) && d.is_write_only() != device_writes
            {
                return Err(RequestError::WrongDirection);
            }
            let access = if d.is_write_only() {
                Permissions::Write
            } else {
                Permissions::Read
            };
            if !mem.check_range(d.addr(), d.len() as usize, access) {
                return Err(RequestError::BufferOutsideMemory);
            }
            total += u64::from(d.len());
            if total > MAX_DATA_LEN {
                return Err(RequestError::TooLong);
            }
            buffers.push((d.addr(), d.len()));
        }
        if matches!(kind, RequestType::In | RequestType::Out) && !total.is_multiple_of(SECTOR_SIZE)
        {
            return Err(RequestError::PartialSector);
        }
        Ok(Request {
            kind,
            sector,
            data: buffers,
            status: status.addr(),
        })
    }
}
