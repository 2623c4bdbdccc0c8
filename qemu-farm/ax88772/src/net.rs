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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh private directory, removed when dropped.
    struct TmpDir(PathBuf);

    impl TmpDir {
        fn new(name: &str) -> TmpDir {
            let d = std::env::temp_dir().join(format!("ax-net-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            TmpDir(d)
        }
    }

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn non_blocking(c: &Conn) -> bool {
        // SAFETY: F_GETFL on a descriptor `c` owns.
        let fl = unsafe { libc::fcntl(c.as_raw_fd(), libc::F_GETFL) };
        assert!(fl >= 0);
        fl & libc::O_NONBLOCK != 0
    }

    /// `c`'s descriptor is its socket's own.
    fn fd_is(c: &Conn) {
        let inner = match c {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        };
        assert_eq!(c.as_raw_fd(), inner);
    }

    #[test]
    fn a_path_that_cannot_be_looked_at_is_an_error_not_a_free_place() {
        let d = TmpDir::new("notdir");
        let file = d.0.join("file");
        std::fs::write(&file, "").unwrap();
        // Under a regular file: ENOTDIR, not "nothing there".
        let e = remove_stale_socket(&file.join("sock"), true).unwrap_err();
        assert_ne!(e.kind(), io::ErrorKind::NotFound);
        remove_stale_socket(&d.0.join("nothing"), true).unwrap();
    }

    #[test]
    fn a_socket_that_answers_a_probe_with_an_error_is_left_in_place() {
        let d = TmpDir::new("wrongtype");
        let p = d.0.join("s");
        let _live = UnixListener::bind(&p).unwrap();
        // A datagram probe of a stream socket fails (EPROTOTYPE), which
        // does not show the socket is stale.
        assert!(remove_stale_socket(&p, false).is_err());
        assert!(p.exists(), "the socket was removed");
    }

    #[test]
    fn a_listener_accepts_a_connection_both_ways_without_blocking() {
        let d = TmpDir::new("accept");
        let a = SockAddr::Unix(d.0.join("l.sock"));
        let l = Listener::bind(&a).unwrap();
        assert!(l.accept().unwrap().is_none(), "nobody connected yet");
        let mut client = Conn::connect(&a).unwrap();
        let mut server = l.accept().unwrap().expect("the pending connection");
        fd_is(&client);
        fd_is(&server);
        let lfd = match &l {
            Listener::Unix(u, _) => u.as_raw_fd(),
            Listener::Tcp(t) => t.as_raw_fd(),
        };
        assert_eq!(l.as_raw_fd(), lfd);
        assert_eq!(client.write(b"hello").unwrap(), 5);
        let mut buf = [0u8; 16];
        assert_eq!(server.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        assert!(non_blocking(&client) && non_blocking(&server));
    }

    #[test]
    fn a_tcp_connection_is_non_blocking_too() {
        let l = Listener::bind(&SockAddr::Inet("127.0.0.1:0".into())).unwrap();
        let mut c = Conn::connect(&SockAddr::Inet(l.local_addr())).unwrap();
        fd_is(&c);
        assert!(non_blocking(&c));
        assert_eq!(c.write(b"ab").unwrap(), 2);
    }
}
