//! virtio-blk on a raw image file: read, write, flush and get-id, done on the VMM thread
//! (Sync) or by the host kernel's io_uring (Async).

mod device;
mod io_uring;
mod request;

pub use device::{Block, BlockConfig, CacheType, Error, IoEngine};
pub use io_uring::probe as probe_async_engine;
pub use request::{Request, RequestError, RequestType, SECTOR_SIZE};

#[cfg(test)]
mod tests;
