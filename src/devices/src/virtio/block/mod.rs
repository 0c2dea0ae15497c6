//! virtio-blk on a raw image file: read, write, flush and get-id.

mod device;
mod request;

pub use device::{Block, BlockConfig, CacheType, Error};
pub use request::{Request, RequestError, RequestType, SECTOR_SIZE};

#[cfg(test)]
mod tests;
