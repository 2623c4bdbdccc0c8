//! The event loop: one thread, `poll(2)` over the usbredir socket, the
//! wire, and the control socket. The device model is driven from here and
//! from nowhere else, so everything happens in one deterministic order.
//!
//! This file holds the loop itself (the server's state, one turn of the
//! loop, its wait); beside it: `transport` (QEMU's usbredir connection
//! and the wire) and `control` (the control socket's clients).

use serde_json::{json, Value};
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

use usbredir::{Codec, Role};

use crate::addr::SockAddr;
use crate::ctl::CtlEnv;
use crate::device::{Device, OUR_CAPS};
use crate::net::{Conn, Listener};
use crate::wire::Wire;
use crate::{log_i, log_w};

mod control;
mod transport;

use control::{bind_ctl, CtlClient};

/// Set by SIGTERM/SIGINT; the loop stops cleanly (pcap flushed).
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error("could not connect to {addr} within {timeout:?} (--connect-timeout)")]
    ConnectTimeout { addr: String, timeout: Duration },
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile { path: PathBuf, source: io::Error },
    #[error("poll: {0}")]
    Poll(io::Error),
}

/// Which side opens the usbredir connection.
#[derive(Clone, Debug)]
pub enum UsbRole {
    /// Connect to QEMU's `-chardev socket,...,server=on,wait=off`.
    Connect(SockAddr),
    /// Wait for QEMU's `-chardev socket,...,server=off,reconnect=1`.
    Listen(SockAddr),
    /// Already connected (tests: one end of a socketpair).
    Connected,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnDisconnect {
    /// Exit with status 0 when QEMU goes away.
    Exit,
    /// Accept or reconnect again, with a freshly plugged device.
    Wait,
}

/// Bytes queued towards QEMU above which the loop stops reading from it
/// (and from the wire): a peer that does not read gets back-pressure.
pub const USB_OUT_HIGH: usize = 1 << 20;
/// Control clients served at once; more are told so and closed.
pub const CTL_CLIENTS_MAX: usize = 16;
/// Reply bytes queued towards one control client above which its
/// requests wait until it reads.
pub const CTL_OUT_HIGH: usize = 256 * 1024;
/// How long accepting pauses when the process is out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// The longest the loop sleeps when nothing is due.
const IDLE: Duration = Duration::from_millis(1000);

pub struct Server {
    dev: Device,
    codec: Codec,
    wire: Box<dyn Wire>,
    role: UsbRole,
    usb_listener: Option<Listener>,
    conn: Option<Conn>,
    usb_out: Vec<u8>,
    on_disconnect: OnDisconnect,
    connect_timeout: Duration,
    started: Instant,
    next_connect: Instant,
    ever_connected: bool,
    finished: bool,
    ctl_listener: Option<(UnixListener, PathBuf)>,
    ctl_clients: Vec<CtlClient>,
    env: CtlEnv,
    clock: Clock,
    accept_after: Instant,
    idle: Duration,
}

/// Where the loop reads the time; tests drive the model's clock by hand.
pub type Clock = Box<dyn Fn() -> Instant + Send>;

fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

const HELLO_VERSION: &str = concat!("phyfarm ax88772-emu ", env!("CARGO_PKG_VERSION"));

impl Server {
    /// Bind every socket. Nothing is read or written yet.
    pub fn new(
        dev: Device,
        wire: Box<dyn Wire>,
        role: UsbRole,
        on_disconnect: OnDisconnect,
        ctl_path: Option<PathBuf>,
    ) -> Result<Server, ServerError> {
        Server::with_capture_dir(dev, wire, role, on_disconnect, ctl_path, None)
    }

    /// [`Server::new`], with `pcap start` writing under `capture_dir`.
    pub fn with_capture_dir(
        dev: Device,
        wire: Box<dyn Wire>,
        role: UsbRole,
        on_disconnect: OnDisconnect,
        ctl_path: Option<PathBuf>,
        capture_dir: Option<PathBuf>,
    ) -> Result<Server, ServerError> {
        let usb_listener = match &role {
            UsbRole::Listen(a) => Some(Listener::bind(a).map_err(|source| ServerError::Bind {
                addr: a.to_string(),
                source,
            })?),
            _ => None,
        };
        let ctl_listener = match ctl_path {
            Some(p) => Some((
                bind_ctl(&p).map_err(|source| ServerError::Bind {
                    addr: p.display().to_string(),
                    source,
                })?,
                p,
            )),
            None => None,
        };
        let now = Instant::now();
        let about = json!({
            "usb": match &role {
                UsbRole::Connect(a) => format!("connect:{a}"),
                UsbRole::Listen(_) => format!("listen:{}", usb_listener.as_ref().map(|l| l.local_addr()).unwrap_or_default()),
                UsbRole::Connected => "connected".into(),
            },
            "wire": wire.describe(),
            "ctl": ctl_listener.as_ref().map(|(_, p)| p.clone()),
            "caps": OUR_CAPS.0,
            "pid": std::process::id(),
            "capture_dir": capture_dir,
        });
        let env = CtlEnv::new(about, capture_dir)
            .map_err(|(addr, source)| ServerError::Bind { addr, source })?;
        Ok(Server {
            dev,
            codec: Codec::new(Role::Host, OUR_CAPS),
            wire,
            role,
            usb_listener,
            conn: None,
            usb_out: Vec::new(),
            on_disconnect,
            connect_timeout: Duration::from_secs(30),
            started: now,
            next_connect: now,
            ever_connected: false,
            finished: false,
            ctl_listener,
            ctl_clients: Vec::new(),
            env,
            clock: Box::new(Instant::now),
            accept_after: now,
            idle: IDLE,
        })
    }

    /// Replace the clock (tests: a clock they advance themselves).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The loop's current time.
    pub fn now(&self) -> Instant {
        (self.clock)()
    }

    pub fn set_connect_timeout(&mut self, t: Duration) {
        self.connect_timeout = t;
    }

    /// Where things are, for the readiness line and `describe`.
    pub fn about(&self) -> &Value {
        &self.env.about
    }

    /// Print the readiness line and write `ready_file` (atomically).
    pub fn announce_ready(&self, ready_file: Option<&PathBuf>) -> Result<(), ServerError> {
        log_i!("ready {}", self.env.about);
        if let Some(p) = ready_file {
            let tmp = p.with_extension("tmp");
            let write = || -> io::Result<()> {
                std::fs::write(&tmp, format!("{}\n", self.env.about))?;
                std::fs::rename(&tmp, p)
            };
            write().map_err(|source| ServerError::ReadyFile {
                path: p.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Use an already-open usbredir connection (tests, inherited sockets).
    pub fn attach(&mut self, c: Conn) {
        self.open_transport(c, self.now());
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The device, for what the control socket would ask of it.
    pub fn device_mut(&mut self) -> &mut Device {
        &mut self.dev
    }

    /// Run until QEMU goes away (with `--on-disconnect exit`) or a signal.
    pub fn run(&mut self) -> Result<(), ServerError> {
        // Paced frames are ~123 us apart: the default 50 us timer slack
        // would add up to half a frame time to every paced wake-up.
        // SAFETY: PR_SET_TIMERSLACK takes a plain integer; no memory is shared.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        while !self.finished && !STOP.load(Ordering::SeqCst) {
            self.step()?;
        }
        if let Err(e) = self.dev.pcap_stop() {
            log_w!("pcap: {e}");
        }
        self.flush_ctl();
        Ok(())
    }

    /// Run the device's timers, send everything the device produced, and
    /// return how long the loop may sleep before the next deadline. Nothing
    /// the device produced stays behind while the loop sleeps.
    pub fn prepare(&mut self, now: Instant) -> Duration {
        // Packets held back while the device had no room.
        self.decode();
        let next = self.dev.poll(now);
        self.flush_device(now);
        let mut timeout = self.idle;
        if let Some(t) = next {
            timeout = timeout.min(t.saturating_duration_since(now));
        }
        if let Some(t) = self.wire.tick() {
            timeout = timeout.min(t);
        }
        if self.conn.is_none() && matches!(self.role, UsbRole::Connect(_)) {
            timeout = timeout.min(self.next_connect.saturating_duration_since(now));
        }
        if self.accept_after > now {
            timeout = timeout.min(self.accept_after - now);
        }
        timeout
    }

    // Long: one turn of the event loop (connect, poll, read, hand packets to the device, write), each part a few lines over the server's state.
    /// One turn of the loop: wait for something, then handle it. Every
    /// event is handled at its own time, read from the clock.
    pub fn step(&mut self) -> Result<(), ServerError> {
        let now = self.now();
        self.try_connect(now)?;
        let timeout = self.prepare(now);
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut add = |fd: RawFd, ev: libc::c_short| {
            fds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
            fds.len() - 1
        };
        let takes_input = self.takes_usb_input();
        let usb_i = self.conn.as_ref().map(|c| {
            let out = if self.usb_out.is_empty() {
                0
            } else {
                libc::POLLOUT
            };
            let inp = if takes_input { libc::POLLIN } else { 0 };
            add(c.as_raw_fd(), inp | out)
        });
        let accepting = self.accept_after <= now;
        let lst_i = match (&self.conn, &self.usb_listener) {
            (None, Some(l)) if accepting => Some(add(l.as_raw_fd(), libc::POLLIN)),
            _ => None,
        };
        let wire_room = self.dev.partner_may_send() && self.usb_out.len() < USB_OUT_HIGH;
        let wire_fd = self.wire.fd();
        let wire_events = if wire_room { libc::POLLIN } else { 0 }
            | if self.wire.wants_write() {
                libc::POLLOUT
            } else {
                0
            };
        // A socket with nothing asked of it is left out: a peer that hung
        // up would report POLLHUP on every turn while the guest is not
        // reading, and the loop would spin until it does.
        let wire_i = wire_fd
            .filter(|_| wire_events != 0)
            .map(|fd| add(fd, wire_events));
        let ctl_i = match &self.ctl_listener {
            Some((l, _)) if accepting => Some(add(l.as_raw_fd(), libc::POLLIN)),
            _ => None,
        };
        let client_base = fds.len();
        for c in &self.ctl_clients {
            fds.push(libc::pollfd {
                fd: c.s.as_raw_fd(),
                events: c.events(),
                revents: 0,
            });
        }

        let ts = poll_timeout(timeout);
        let n = loop {
            // SAFETY: fds is a valid, exclusively borrowed array of pollfd;
            // ts outlives the call; a null sigmask leaves the mask alone.
            let n = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            if n >= 0 {
                break n;
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                if STOP.load(Ordering::SeqCst) {
                    return Ok(());
                }
                continue;
            }
            return Err(ServerError::Poll(e));
        };
        let ready = |i: Option<usize>, mask: libc::c_short| {
            n > 0 && i.is_some_and(|i| fds[i].revents & mask != 0)
        };
        let hup = libc::POLLHUP | libc::POLLERR;
        if ready(usb_i, libc::POLLIN | hup) {
            self.read_usb();
        }
        if ready(usb_i, libc::POLLOUT) {
            let now = self.now();
            self.write_usb(now);
        }
        if ready(lst_i, libc::POLLIN) {
            if let Some(l) = &self.usb_listener {
                match l.accept() {
                    Ok(Some(c)) => {
                        let now = self.now();
                        self.open_transport(c, now)
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if out_of_fds(&e) {
                            self.accept_after = self.now() + ACCEPT_PAUSE;
                        }
                        log_w!("usb: accept: {e}")
                    }
                }
            }
        }
        // A wire without a descriptor is read every turn, within the same
        // back-pressure as one with.
        if wire_room && (wire_fd.is_none() || ready(wire_i, libc::POLLIN | hup)) {
            self.read_wire();
        }
        if ready(wire_i, libc::POLLOUT) {
            self.wire.flush();
        }
        if ready(ctl_i, libc::POLLIN) {
            let now = self.now();
            self.accept_ctl(now);
        }
        if n > 0 {
            for i in 0..self.ctl_clients.len() {
                if fds.get(client_base + i).is_some_and(|f| f.revents != 0) {
                    let now = self.now();
                    self.serve_ctl(i, now);
                }
            }
        }
        self.ctl_clients.retain(|c| !c.closed);
        let now = self.now();
        self.dev.poll(now);
        self.flush_device(now);
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some((_, p)) = &self.ctl_listener {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The wait until the next deadline, rounded up to the microsecond (so a
/// deadline a few nanoseconds away does not spin) and at most a second.
/// Paced frames are ~123 us apart at 100 Mbit/s; poll(2)'s whole
/// milliseconds held every paced completion up to a millisecond late.
pub fn poll_timeout(d: Duration) -> libc::timespec {
    let d = d.min(Duration::from_secs(1));
    let us = d.as_nanos().div_ceil(1000) as i64;
    libc::timespec {
        tv_sec: (us / 1_000_000) as libc::time_t,
        tv_nsec: ((us % 1_000_000) * 1000) as libc::c_long,
    }
}

#[cfg(test)]
mod tests;
