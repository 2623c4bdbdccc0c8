//! Byte streams to the model or to usbredirect: TCP, or a virtio-serial
//! port found through sysfs; connecting within a deadline.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A byte stream to the model or to usbredirect: TCP or a virtio-serial port.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Port(File),
}

impl Conn {
    pub(crate) fn try_clone(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Port(f) => Conn::Port(f.try_clone()?),
        })
    }
    pub(crate) fn fd(&self) -> i32 {
        match self {
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Port(f) => f.as_raw_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Port(f) => f.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Port(f) => f.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `c` has data within `timeout`.
pub(crate) fn readable(c: &Conn, timeout: Duration) -> Result<bool> {
    let mut p = libc::pollfd {
        fd: c.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == ErrorKind::Interrupted {
            return Ok(false);
        }
        bail!("poll: {e}");
    }
    Ok(rc > 0)
}

/// The virtio-serial port named `name` (/dev/vportNpM, found through sysfs).
pub(crate) fn open_port(name: &str, timeout: Duration) -> Result<File> {
    open_port_in(
        Path::new("/sys/class/virtio-ports"),
        Path::new("/dev"),
        name,
        timeout,
    )
}

/// [`open_port`], with the sysfs class directory `ports` and the device
/// directory `dev` given.
pub(crate) fn open_port_in(
    ports: &Path,
    dev: &Path,
    name: &str,
    timeout: Duration,
) -> Result<File> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(dir) = std::fs::read_dir(ports) {
            for e in dir.flatten() {
                let n = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if n.trim() == name {
                    let dev = dev.join(e.file_name());
                    return OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&dev)
                        .with_context(|| format!("opening {} ({name})", dev.display()));
                }
            }
        }
        if Instant::now() > deadline {
            bail!("no virtio-serial port named {name} in {}", ports.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn connect(addr: &str, timeout: Duration) -> Result<Conn> {
    connect_by(addr, timeout, Instant::now)
}

/// [`connect`], reading the time from `now`.
pub(crate) fn connect_by(addr: &str, timeout: Duration, now: impl Fn() -> Instant) -> Result<Conn> {
    if let Some(name) = addr.strip_prefix("port:") {
        return Ok(Conn::Port(open_port(name, timeout)?));
    }
    let deadline = now() + timeout;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(Conn::Tcp(s));
            }
            Err(_) if now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => bail!("cannot connect to the model at {addr}: {e}"),
        }
    }
}
