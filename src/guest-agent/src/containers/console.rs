//! A container process with a terminal: crun makes the pseudo-terminal and sends its master
//! side to the `--console-socket` (one descriptor in an SCM_RIGHTS message), before its
//! `create` or `exec --detach` returns.

use std::fs::File;
use std::os::unix::net::UnixListener;

use super::sys;

/// The master side crun sent to `listener` (its connection is already queued).
pub fn receive(listener: &UnixListener) -> Result<File, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("console socket: {e}"))?;
    let (conn, _) = listener
        .accept()
        .map_err(|e| format!("crun sent no terminal to the console socket: {e}"))?;
    sys::recv_fd(&conn).map_err(|e| match e {
        sys::RecvFdError::Io(e) => format!("console socket: {e}"),
        sys::RecvFdError::NoDescriptor => "crun's console message carried no terminal".into(),
    })
}
