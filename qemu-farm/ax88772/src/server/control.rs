//! The control socket as the event loop serves it: bound private to this
//! user, clients of this uid (or root) accepted up to a bound, their
//! request lines read a bounded amount at a time and answered through
//! `ctl`, replies queued until the client reads them.

use serde_json::json;
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use super::{out_of_fds, Server, ACCEPT_PAUSE, CTL_CLIENTS_MAX, CTL_OUT_HIGH};
use crate::ctl;
use crate::log_w;

pub(super) struct CtlClient {
    pub(super) s: UnixStream,
    pub(super) inbuf: Vec<u8>,
    pub(super) out: Vec<u8>,
    pub(super) discarding: bool,
    pub(super) eof: bool,
    pub(super) closed: bool,
}

impl CtlClient {
    /// What to wait for on this client's socket.
    pub(super) fn events(&self) -> libc::c_short {
        // Requests already read but not answered (replies were piling
        // up): wake when the client can take more.
        let work = !self.out.is_empty() || self.inbuf.contains(&b'\n');
        let out = if work { libc::POLLOUT } else { 0 };
        let inp = if self.eof || self.out.len() >= CTL_OUT_HIGH {
            0
        } else {
            libc::POLLIN
        };
        inp | out
    }
}

/// Bind the control socket: mode 0600, in a directory only this user can
/// enter (created 0700 when missing), never replacing a live socket.
pub(super) fn bind_ctl(p: &std::path::Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            // 0700 whatever the umask is (another thread may be binding).
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?
        }
        Err(e) => return Err(e),
        Ok(m) => {
            if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} must be a directory owned by uid {uid} with mode 0700 (it is {}, mode {:o}, uid {})",
                        dir.display(),
                        if m.is_dir() { "a directory" } else { "not a directory" },
                        m.mode() & 0o7777,
                        m.uid()
                    ),
                ));
            }
        }
    }
    crate::net::remove_stale_socket(p, true)?;
    // SAFETY: umask only swaps the process's file creation mask.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(p);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let l = l?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The uid at the other end of a unix socket.
pub(super) fn peer_uid(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

impl Server {
    pub(super) fn accept_ctl(&mut self, now: Instant) {
        let Some((l, _)) = &self.ctl_listener else {
            return;
        };
        let mut fresh = Vec::new();
        loop {
            match l.accept() {
                Ok((s, _)) => fresh.push(s),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if out_of_fds(&e) {
                        log_w!("ctl: accept: {e}; accepting pauses for {ACCEPT_PAUSE:?}");
                        self.accept_after = now + ACCEPT_PAUSE;
                    }
                    break;
                }
            }
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for s in fresh {
            match peer_uid(&s) {
                Some(uid) if uid == me || uid == 0 => {}
                other => {
                    log_w!("ctl: connection from uid {other:?} refused (only uid {me} and root)");
                    continue;
                }
            }
            if self.ctl_clients.len() >= CTL_CLIENTS_MAX {
                log_w!("ctl: connection refused: {CTL_CLIENTS_MAX} control clients already");
                let e = json!({ "ok": false, "error": format!("too many control clients (at most {CTL_CLIENTS_MAX})") });
                let _ = s.set_nonblocking(true);
                let _ = (&s).write(format!("{e}\n").as_bytes());
                continue;
            }
            if s.set_nonblocking(true).is_ok() {
                self.ctl_clients.push(CtlClient {
                    s,
                    inbuf: Vec::new(),
                    out: Vec::new(),
                    discarding: false,
                    eof: false,
                    closed: false,
                });
            }
        }
    }

    /// Read a client's requests (a bounded amount per turn, none while its
    /// replies pile up) and answer them.
    pub(super) fn serve_ctl(&mut self, i: usize, now: Instant) {
        let mut buf = [0u8; 8192];
        for _ in 0..8 {
            self.ctl_lines(i, now);
            let c = &mut self.ctl_clients[i];
            Self::write_ctl(c);
            if c.closed || c.eof || c.out.len() >= CTL_OUT_HIGH {
                break;
            }
            match c.s.read(&mut buf) {
                Ok(0) => c.eof = true,
                Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => c.closed = true,
            }
        }
        self.ctl_lines(i, now);
        let c = &mut self.ctl_clients[i];
        Self::write_ctl(c);
        if c.eof && c.out.is_empty() && !c.inbuf.contains(&b'\n') {
            c.closed = true;
        }
    }

    /// Answer the complete request lines of client `i` while its reply
    /// queue is below the high-water mark. A line is measured before it is
    /// split off: one longer than [`ctl::MAX_LINE`] gets an error reply.
    fn ctl_lines(&mut self, i: usize, now: Instant) {
        loop {
            let c = &mut self.ctl_clients[i];
            if c.closed || c.out.len() >= CTL_OUT_HIGH {
                return;
            }
            let too_long = json!({ "ok": false, "error": format!("request longer than {} bytes", ctl::MAX_LINE) });
            let Some(pos) = c.inbuf.iter().position(|&b| b == b'\n') else {
                if c.inbuf.len() > ctl::MAX_LINE {
                    c.inbuf.clear();
                    if !c.discarding {
                        c.discarding = true;
                        log_w!("ctl: request longer than {} bytes refused", ctl::MAX_LINE);
                        c.out.extend_from_slice(format!("{too_long}\n").as_bytes());
                    }
                }
                return;
            };
            if std::mem::take(&mut c.discarding) {
                c.inbuf.drain(..=pos);
                continue;
            }
            if pos > ctl::MAX_LINE {
                c.inbuf.drain(..=pos);
                log_w!("ctl: request longer than {} bytes refused", ctl::MAX_LINE);
                c.out.extend_from_slice(format!("{too_long}\n").as_bytes());
                continue;
            }
            let line: Vec<u8> = c.inbuf.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if text.trim().is_empty() {
                continue;
            }
            let reply = ctl::handle_line(&mut self.dev, now, &text, &self.env);
            let c = &mut self.ctl_clients[i];
            c.out.extend_from_slice(reply.as_bytes());
            c.out.push(b'\n');
        }
    }

    fn write_ctl(c: &mut CtlClient) {
        while !c.out.is_empty() {
            match c.s.write(&c.out) {
                Ok(0) => {
                    c.closed = true;
                    return;
                }
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.closed = true;
                    return;
                }
            }
        }
    }

    pub(super) fn flush_ctl(&mut self) {
        for c in &mut self.ctl_clients {
            Self::write_ctl(c);
        }
    }
}
