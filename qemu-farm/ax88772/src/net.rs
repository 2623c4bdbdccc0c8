//! Stream sockets over unix paths or TCP, behind one type.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

use crate::addr::SockAddr;

/// How long a TCP connect may hold the event loop.
const TCP_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(200);

/// Make way for binding a unix socket at `p`: nothing there is fine; a
/// stale socket (nobody accepts on it) is removed; a live socket, or a
/// file that is not a socket, is left alone and reported.
pub fn remove_stale_socket(p: &std::path::Path, stream: bool) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let m = match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) => m,
    };
    if !m.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", p.display()),
        ));
    }
    let probe = if stream {
        UnixStream::connect(p).map(drop)
    } else {
        std::os::unix::net::UnixDatagram::unbound().and_then(|d| d.connect(p))
    };
    match probe {
        Ok(()) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is a live socket (another emulator?); not replaced",
                p.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(p),
        Err(e) => Err(e),
    }
}

pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub fn connect(a: &SockAddr) -> io::Result<Conn> {
        let c = match a {
            SockAddr::Unix(p) => Conn::Unix(UnixStream::connect(p)?),
            SockAddr::Inet(h) => {
                use std::net::ToSocketAddrs;
                let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{h}: no address"));
                let mut found = None;
                for a in h.to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, TCP_CONNECT_TIMEOUT) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or(last)?;
                s.set_nodelay(true)?;
                Conn::Tcp(s)
            }
        };
        c.set_nonblocking()?;
        Ok(c)
    }

    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_nonblocking(true),
            Conn::Tcp(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(b),
            Conn::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(b),
            Conn::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        }
    }
}

pub enum Listener {
    Unix(UnixListener, std::path::PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Bind and listen. A stale unix socket file at the path is replaced.
    pub fn bind(a: &SockAddr) -> io::Result<Listener> {
        let l = match a {
            SockAddr::Unix(p) => {
                remove_stale_socket(p, true)?;
                Listener::Unix(UnixListener::bind(p)?, p.clone())
            }
            SockAddr::Inet(h) => Listener::Tcp(TcpListener::bind(h)?),
        };
        match &l {
            Listener::Unix(u, _) => u.set_nonblocking(true)?,
            Listener::Tcp(t) => t.set_nonblocking(true)?,
        }
        Ok(l)
    }

    /// Accept a pending connection, if any.
    pub fn accept(&self) -> io::Result<Option<Conn>> {
        let r = match self {
            Listener::Unix(u, _) => u.accept().map(|(s, _)| Conn::Unix(s)),
            Listener::Tcp(t) => t.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }),
        };
        match r {
            Ok(c) => {
                c.set_nonblocking()?;
                Ok(Some(c))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The bound address (the real port when 0 was asked for).
    pub fn local_addr(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
            Listener::Tcp(t) => t.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Listener::Unix(u, _) => u.as_raw_fd(),
            Listener::Tcp(t) => t.as_raw_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}
