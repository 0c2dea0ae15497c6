//! The microVM metadata service (MMDS). The host fills a JSON [`store::DataStore`] through the
//! API; the guest reads it over HTTP at a link-local address. Frames the guest sends to that
//! address never reach the TAP: the net device hands them to an [`stack::MmdsStack`], a
//! user-space TCP/IPv4 stack (smoltcp) with an HTTP server ([`responder`]) on port 80.

pub mod frame;
pub mod request;
pub mod responder;
pub mod stack;
pub mod store;
pub mod token;

pub use stack::MmdsStack;
pub use store::{DataStore, StoreError, Version};
pub use token::random_bytes;

use std::sync::{Arc, Mutex, MutexGuard};

/// One store per microVM, shared by the API (VMM thread) and every interface that reaches it.
pub type SharedStore = Arc<Mutex<DataStore>>;

/// Locks the store; a panic elsewhere cannot leave it half-written (every update replaces
/// the value whole), so a poisoned lock is still usable.
pub fn lock(store: &SharedStore) -> MutexGuard<'_, DataStore> {
    store.lock().unwrap_or_else(|e| e.into_inner())
}

/// Firecracker's default MMDS address.
pub const DEFAULT_IPV4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 169, 254);
