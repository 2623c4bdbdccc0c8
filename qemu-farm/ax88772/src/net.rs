//! Stream sockets over unix paths or TCP, behind one type.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

use crate::addr::SockAddr;

pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub fn connect(a: &SockAddr) -> io::Result<Conn> {
        let c = match a {
            SockAddr::Unix(p) => Conn::Unix(UnixStream::connect(p)?),
            SockAddr::Inet(h) => {
                let s = TcpStream::connect(h)?;
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
                use std::os::unix::fs::FileTypeExt;
                if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(p)?;
                }
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
