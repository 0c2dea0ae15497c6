//! Ember's REST API, Firecracker's, on a Unix socket. Bytes become requests in [`http`], requests
//! become [`vmm::rpc::VmmAction`]s in [`routes`], the VMM thread acts on them, and its answers
//! become responses in [`reply`]. [`server`] is the thread that does all this for every
//! connection; it never touches the VM itself.

pub mod http;
pub mod reply;
pub mod routes;
pub mod server;

pub use server::{bind, ApiServer};
