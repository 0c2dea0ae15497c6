//! The API thread: one epoll loop over the listening socket and every connection, all
//! non-blocking, so that no client (one that never sends, one that sends a byte at a time,
//! one that never reads its answers) holds up another. Requests are answered one at a time,
//! in order, by the VMM thread.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use telemetry::Span;

use vmm::rpc::ApiSide;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::http::{RequestParser, Response};
use crate::reply::to_response;
use crate::routes::{self, Routed};

/// Open connections at most. Each costs a file descriptor and at most one request's buffer.
/// A client that comes when all are taken takes the place of the connection that has been
/// quiet longest, so that held or abandoned connections never lock a client out.
pub const MAX_CONNECTIONS: usize = 256;
/// A connection quiet this long is closed (HTTP lets a server close an idle persistent
/// connection). Long, because Firecracker never closes one and some clients hold theirs
/// through a whole workload (one test held its for two minutes of vsock traffic); a full
/// server does not wait for it, it closes the quietest connection at once.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Requests served from one connection before the others get their turn.
const REQUESTS_PER_TURN: usize = 32;
/// Connections accepted before the open ones get their turn: clients that connect and
/// close in a loop cannot starve the rest.
const ACCEPTS_PER_TURN: usize = 32;
const READ_CHUNK: usize = 4096;
/// A connection's response buffer larger than this is freed once written.
const KEEP_OUT_CAPACITY: usize = 16 * 1024;
const LISTENER: u64 = u64::MAX;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the API socket {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    #[error("the API socket {0} already exists; remove it, or give --api-sock another path")]
    InUse(String),
    #[error("cannot set up the API server: {0}")]
    Setup(#[source] std::io::Error),
}

/// Creates the listening socket; the caller removes the file when ember exits. The socket is
/// bound and listening under a temporary name first and then linked into place, so that a
/// client that sees the file can connect at once (a client that waits for the file, as
/// Firecracker's do, never gets ECONNREFUSED), and an existing file is never replaced.
pub fn bind(path: &Path) -> Result<UnixListener, Error> {
    let shown = || path.display().to_string();
    let in_use = |source: std::io::Error| {
        if source.kind() == ErrorKind::AlreadyExists || source.kind() == ErrorKind::AddrInUse {
            Error::InUse(shown())
        } else {
            Error::Bind {
                path: shown(),
                source,
            }
        }
    };
    let mut staging = path.as_os_str().to_owned();
    staging.push(format!(".{}.tmp", std::process::id()));
    let staging = std::path::PathBuf::from(staging);
    let _ = std::fs::remove_file(&staging);
    let listener = match UnixListener::bind(&staging) {
        Ok(listener) => listener,
        // The longer name does not fit a socket address: bind in place instead.
        Err(e) if e.kind() == ErrorKind::InvalidInput => {
            return UnixListener::bind(path).map_err(in_use)
        }
        Err(source) => return Err(in_use(source)),
    };
    let linked = std::fs::hard_link(&staging, path);
    let _ = std::fs::remove_file(&staging);
    linked.map_err(in_use)?;
    Ok(listener)
}

#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    parser: RequestParser,
    /// The response being written, and how much of it is out.
    out: Vec<u8>,
    written: usize,
    /// Close once `out` is written: the client asked, or the stream cannot be trusted.
    closing: bool,
    /// The client has shut its side.
    eof: bool,
    /// When the client last sent or took bytes, or connected.
    active: Instant,
    /// What epoll watches it for, so that it is told only of a change.
    watching: EventSet,
    /// The last read took less than it asked for: the socket had nothing more then, so the
    /// next read waits for epoll to say there is something (one system call fewer per
    /// request; epoll is level-triggered, so nothing that came since is missed).
    drained: bool,
}

/// What to do with a connection after serving it.
enum Next {
    /// Wait until it is readable.
    Read,
    /// Wait until it is writable: a response is stuck.
    Write,
    /// Its turn is over but it may have more already read: serve it again soon.
    Yield,
    Close,
}

#[derive(Debug)]
pub struct ApiServer {
    listener: UnixListener,
    epoll: Epoll,
    connections: HashMap<RawFd, Connection>,
    /// Connections that yielded their turn with requests still buffered.
    ready: Vec<RawFd>,
    vmm: ApiSide,
    max_payload: usize,
    metrics: Arc<telemetry::Metrics>,
    idle_timeout: Duration,
}

impl ApiServer {
    pub fn new(
        listener: UnixListener,
        vmm: ApiSide,
        max_payload: usize,
        metrics: Arc<telemetry::Metrics>,
    ) -> Result<Self, Error> {
        listener.set_nonblocking(true).map_err(Error::Setup)?;
        let epoll = Epoll::new().map_err(Error::Setup)?;
        epoll
            .ctl(
                ControlOperation::Add,
                listener.as_raw_fd(),
                EpollEvent::new(EventSet::IN, LISTENER),
            )
            .map_err(Error::Setup)?;
        Ok(ApiServer {
            listener,
            epoll,
            connections: HashMap::new(),
            ready: Vec::new(),
            vmm,
            max_payload,
            metrics,
            idle_timeout: IDLE_TIMEOUT,
        })
    }

    /// Closes connections quiet for `timeout` instead of [`IDLE_TIMEOUT`].
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Milliseconds until the quietest connection's idle time runs out; -1 if none is open.
    fn next_deadline_ms(&self) -> i32 {
        let Some(oldest) = self.connections.values().map(|c| c.active).min() else {
            return -1;
        };
        let left = (oldest + self.idle_timeout).saturating_duration_since(Instant::now());
        // Rounded up, so that the wait does not end just before the deadline.
        (left.as_millis() as i32).saturating_add(1)
    }

    /// Closes every connection whose idle time has run out.
    fn close_idle(&mut self) {
        let timeout = self.idle_timeout;
        let before = self.connections.len();
        self.connections.retain(|_, c| c.active.elapsed() < timeout);
        let closed = before - self.connections.len();
        if closed > 0 {
            log::debug!("API: closed {closed} idle connections");
        }
    }

    /// Serves until the VMM thread goes away (ember is exiting).
    pub fn run(mut self) {
        let mut events = vec![EpollEvent::default(); 64];
        loop {
            let timeout = if self.ready.is_empty() {
                self.next_deadline_ms()
            } else {
                0
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("the API server's epoll failed: {e}");
                    return;
                }
            };
            for event in &events[..n] {
                let alive = if event.data() == LISTENER {
                    self.accept_some()
                } else {
                    self.serve(event.data() as RawFd)
                };
                if !alive {
                    return;
                }
            }
            for fd in std::mem::take(&mut self.ready) {
                if !self.serve(fd) {
                    return;
                }
            }
            self.close_idle();
        }
    }

    /// Accepts up to [`ACCEPTS_PER_TURN`] clients and serves what each has sent already
    /// (a client that has closed frees its place at once); false if the VMM thread is gone.
    /// More waiting clients keep the listener readable for the next turn.
    fn accept_some(&mut self) -> bool {
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Some(fd) = self.add(stream) {
                        if !self.serve(fd) {
                            return false;
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of file descriptors, most likely: leave the client in the backlog,
                    // and pause, since the listener stays readable and epoll would return
                    // at once, over and over.
                    log::warn!("the API server cannot accept a connection: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    return true;
                }
            }
        }
        true
    }

    /// Watches a new connection; its descriptor, or None if it could not be watched.
    fn add(&mut self, stream: UnixStream) -> Option<RawFd> {
        if self.connections.len() >= MAX_CONNECTIONS {
            // Connections whose clients have written or closed since the last turn are
            // served first: a closed one frees its place, and a request waiting to be read
            // is answered rather than thrown away with its connection.
            self.serve_waiting();
        }
        if self.connections.len() >= MAX_CONNECTIONS {
            // The quietest connection gives its place to the newcomer.
            let quietest = self.connections.iter().min_by_key(|(_, c)| c.active);
            if let Some((&fd, _)) = quietest {
                log::info!("API: {MAX_CONNECTIONS} connections are open; closed the quietest");
                self.connections.remove(&fd);
            }
        }
        let fd = stream.as_raw_fd();
        let watching = EventSet::IN | EventSet::READ_HANG_UP;
        let registered = stream.set_nonblocking(true).and_then(|()| {
            self.epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(watching, fd as u64),
            )
        });
        if let Err(e) = registered {
            log::warn!("the API server cannot watch a connection: {e}");
            return None;
        }
        self.connections.insert(
            fd,
            Connection {
                stream,
                parser: RequestParser::new(self.max_payload),
                out: Vec::new(),
                written: 0,
                closing: false,
                eof: false,
                active: Instant::now(),
                watching,
                drained: false,
            },
        );
        Some(fd)
    }

    /// Serves every connection epoll reports ready now (the listener is left for the turn
    /// that is accepting). Readiness is level-triggered, so nothing reported here is lost
    /// to the main loop.
    fn serve_waiting(&mut self) {
        let mut events = vec![EpollEvent::default(); MAX_CONNECTIONS + 1];
        let Ok(n) = self.epoll.wait(0, &mut events) else {
            return;
        };
        for event in &events[..n] {
            if event.data() != LISTENER {
                // A VMM thread that is gone is seen again by the main loop's next serve.
                let _ = self.serve(event.data() as RawFd);
            }
        }
    }

    /// Serves one connection as far as it can go now; false if the VMM thread is gone.
    fn serve(&mut self, fd: RawFd) -> bool {
        let Some(mut conn) = self.connections.remove(&fd) else {
            return true;
        };
        conn.active = Instant::now();
        let (next, vmm_alive) = self.advance(&mut conn);
        let interest = match next {
            Next::Close => None,
            Next::Read | Next::Yield => Some(EventSet::IN | EventSet::READ_HANG_UP),
            Next::Write => Some(EventSet::OUT),
        };
        if matches!(next, Next::Yield) {
            self.ready.push(fd);
        }
        if let Some(events) = interest {
            let watched = events == conn.watching
                || self
                    .epoll
                    .ctl(
                        ControlOperation::Modify,
                        fd,
                        EpollEvent::new(events, fd as u64),
                    )
                    .is_ok();
            if watched {
                conn.watching = events;
                self.connections.insert(fd, conn);
            }
        }
        // Dropping a closed connection closes its socket, which also leaves the epoll set.
        vmm_alive
    }

    fn advance(&mut self, conn: &mut Connection) -> (Next, bool) {
        let mut served = 0;
        loop {
            match flush(conn) {
                Ok(true) => {}
                Ok(false) => return (Next::Write, true),
                Err(_) => return (Next::Close, true),
            }
            if conn.closing {
                return (Next::Close, true);
            }
            if served == REQUESTS_PER_TURN {
                return (Next::Yield, true);
            }
            match conn.parser.next_request() {
                Ok(Some(request)) => {
                    served += 1;
                    let started = Instant::now();
                    let response = match routes::parse(&request) {
                        Routed::Answer(response) => response,
                        Routed::Action(action) => {
                            let deprecated = routes::deprecation(&action);
                            match (action.timed(), self.vmm.call(action)) {
                                (timed, Ok(result)) => {
                                    if let (Some(op), Ok(_)) = (timed, &result) {
                                        let micros = started.elapsed().as_micros() as u64;
                                        self.metrics.latencies.record(op, Span::Api, micros);
                                    }
                                    match (deprecated, to_response(&result)) {
                                        (Some(why), answer) if answer.status < 300 => {
                                            log::warn!("{why}");
                                            answer.with_header("Deprecation", "true".into())
                                        }
                                        (_, answer) => answer,
                                    }
                                }
                                (_, Err(_)) => {
                                    let gone = Response::fault(503, "ember is shutting down");
                                    queue(conn, &gone.with_header("Connection", "close".into()));
                                    conn.closing = true;
                                    let _ = flush(conn);
                                    return (Next::Close, false);
                                }
                            }
                        }
                    };
                    if !request.keep_alive {
                        conn.closing = true;
                    }
                    queue(conn, &response);
                    let resource = request.path.split('/').find(|s| !s.is_empty());
                    self.metrics.api.record(
                        &request.method,
                        resource.unwrap_or(""),
                        response.status >= 400,
                        started.elapsed().as_micros() as u64,
                    );
                }
                Ok(None) => {
                    if conn.parser.take_continue() {
                        conn.out.clear();
                        conn.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        conn.written = 0;
                        continue;
                    }
                    if conn.eof {
                        return (Next::Close, true);
                    }
                    if std::mem::take(&mut conn.drained) {
                        return (Next::Read, true);
                    }
                    match read_some(conn) {
                        Ok(true) => {}
                        Ok(false) => return (Next::Read, true),
                        Err(_) => return (Next::Close, true),
                    }
                }
                Err(e) => {
                    // The stream's framing is lost: answer, then close.
                    log::info!("API: refused a malformed request: {e}");
                    let response = Response::fault(e.status(), &e.to_string())
                        .with_header("Connection", "close".into());
                    queue(conn, &response);
                    conn.closing = true;
                }
            }
        }
    }
}

fn queue(conn: &mut Connection, response: &Response) {
    conn.out.clear();
    response.write_to(&mut conn.out);
    conn.written = 0;
}

/// Writes what is pending; true when nothing is left.
fn flush(conn: &mut Connection) -> std::io::Result<bool> {
    while conn.written < conn.out.len() {
        match conn.stream.write(&conn.out[conn.written..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => conn.written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    conn.out.clear();
    // The buffer is kept for the next response, unless a large one (a big metadata
    // document) grew it: an idle connection holds little.
    if conn.out.capacity() > KEEP_OUT_CAPACITY {
        conn.out = Vec::new();
    }
    conn.written = 0;
    Ok(true)
}

/// Reads one chunk into the parser; false if nothing is there yet. End of stream is
/// recorded, so that what was already sent is still answered.
fn read_some(conn: &mut Connection) -> std::io::Result<bool> {
    let mut buf = [0u8; READ_CHUNK];
    loop {
        match conn.stream.read(&mut buf) {
            Ok(0) => {
                conn.eof = true;
                return Ok(true);
            }
            Ok(n) => {
                conn.parser.feed(&buf[..n]);
                conn.drained = n < buf.len();
                return Ok(true);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on a fresh socket, closing connections idle for `idle`; no VMM answers.
    fn server(name: &str, idle: Duration) -> (std::path::PathBuf, vmm::rpc::VmmSide) {
        let path = std::env::temp_dir().join(format!("ember-api-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = bind(&path).unwrap();
        let (api, vmm) = vmm::rpc::channel("test").unwrap();
        let metrics = Arc::new(telemetry::Metrics::default());
        let server = ApiServer::new(listener, api, 1024, metrics).unwrap();
        std::thread::spawn(move || server.with_idle_timeout(idle).run());
        (path, vmm)
    }

    #[test]
    fn an_idle_connection_is_closed_after_the_timeout() {
        let (path, _vmm) = server("idle", Duration::from_millis(300));
        let started = Instant::now();
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(c.read(&mut buf).unwrap(), 0, "the server closed it");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(3), "{waited:?}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_full_server_makes_room_by_closing_the_quietest_connection() {
        let (path, _vmm) = server("full", Duration::from_secs(600));
        let held: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        // Let the server accept them all, in order.
        std::thread::sleep(Duration::from_millis(300));
        let mut newcomer = UnixStream::connect(&path).unwrap();
        newcomer
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // The newcomer is served (a malformed request gets its 400): it was not refused.
        newcomer.write_all(b"BAD\r\n\r\n").unwrap();
        let mut answer = String::new();
        newcomer.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        // The first connection, the quietest, was closed to make room.
        let mut first = &held[0];
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(first.read(&mut [0u8; 1]).unwrap(), 0);
        std::fs::remove_file(path).unwrap();
    }
}
