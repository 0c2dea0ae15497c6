//! Ember's REST API. So far only its HTTP/1.1 layer ([`http`]): an incremental request parser
//! with limits on the header block and the body, and the response writer. The server thread
//! and the routes follow (issue 4).

pub mod http;
