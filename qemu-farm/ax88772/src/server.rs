//! The event loop: one thread, `poll(2)` over the usbredir socket, the
//! wire, and the control socket. The device model is driven from here and
//! from nowhere else, so everything happens in one deterministic order.

use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

use usbredir::{Codec, Role};

use crate::addr::SockAddr;
use crate::ctl::{self, CtlEnv};
use crate::device::{Device, OUR_CAPS};
use crate::net::{Conn, Listener};
use crate::wire::Wire;
use crate::{log_e, log_i, log_t, log_w};

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

struct CtlClient {
    s: UnixStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    discarding: bool,
    eof: bool,
    closed: bool,
}

impl CtlClient {
    /// What to wait for on this client's socket.
    fn events(&self) -> libc::c_short {
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

/// Bind the control socket: mode 0600, in a directory only this user can
/// enter (created 0700 when missing), never replacing a live socket.
fn bind_ctl(p: &std::path::Path) -> io::Result<UnixListener> {
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
fn peer_uid(s: &UnixStream) -> Option<u32> {
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

    fn open_transport(&mut self, c: Conn, now: Instant) {
        if let Err(e) = c.set_nonblocking() {
            log_w!("usb: set_nonblocking: {e}");
        }
        self.conn = Some(c);
        self.ever_connected = true;
        self.codec = Codec::new(Role::Host, OUR_CAPS);
        self.dev.transport_opened(now);
        self.usb_out.clear();
        if let Err(e) = self.codec.encode_hello(HELLO_VERSION, &mut self.usb_out) {
            log_e!("usb: hello: {e}");
        }
        log_i!("usb: connected; hello sent (caps {:#x})", OUR_CAPS.0);
    }

    fn close_transport(&mut self, why: &str, now: Instant) {
        if self.conn.take().is_none() {
            return;
        }
        log_i!("usb: connection closed ({why})");
        self.dev.transport_closed(now);
        self.usb_out.clear();
        match self.on_disconnect {
            OnDisconnect::Exit => self.finished = true,
            OnDisconnect::Wait => {
                self.next_connect = now + Duration::from_millis(200);
                log_i!("usb: waiting for QEMU again");
            }
        }
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

    fn try_connect(&mut self, now: Instant) -> Result<(), ServerError> {
        let UsbRole::Connect(a) = &self.role else {
            return Ok(());
        };
        if self.conn.is_some() || now < self.next_connect {
            return Ok(());
        }
        match Conn::connect(a) {
            Ok(c) => self.open_transport(c, now),
            Err(e) => {
                if !self.ever_connected && now.duration_since(self.started) > self.connect_timeout {
                    return Err(ServerError::ConnectTimeout {
                        addr: a.to_string(),
                        timeout: self.connect_timeout,
                    });
                }
                log_t!("usb: connect {a}: {e}");
                self.next_connect = now + Duration::from_millis(200);
            }
        }
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

    /// Whether the loop reads from QEMU: its output is below the
    /// high-water mark and the device has room for more transfers.
    fn takes_usb_input(&self) -> bool {
        self.usb_out.len() < USB_OUT_HIGH && self.dev.usb_room()
    }

    /// Bytes waiting to be written to QEMU.
    pub fn usb_backlog(&self) -> usize {
        self.usb_out.len()
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
        let wire_room = self.dev.rx_room() && self.usb_out.len() < USB_OUT_HIGH;
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

    fn read_usb(&mut self) {
        let mut buf = [0u8; 65536];
        for _ in 0..16 {
            if !self.takes_usb_input() {
                return;
            }
            let Some(c) = &mut self.conn else { return };
            match c.read(&mut buf) {
                Ok(0) => return self.close_transport("end of stream", self.now()),
                Ok(n) => {
                    self.codec.feed(&buf[..n]);
                    self.decode();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.close_transport(&e.to_string(), self.now()),
            }
        }
    }

    /// Hand every complete packet to the device, each at its own time.
    fn decode(&mut self) {
        while self.conn.is_some() && self.takes_usb_input() {
            let Some(r) = self.codec.next_packet() else {
                break;
            };
            let now = self.now();
            match r {
                Ok(p) => self.dev.handle(now, p),
                Err(e) => {
                    self.dev.usbredir_error();
                    log_w!("usbredir: {e}");
                    if e.is_fatal() {
                        self.close_transport("protocol error", now);
                        return;
                    }
                }
            }
            self.flush_device(now);
        }
    }

    fn read_wire(&mut self) {
        for _ in 0..256 {
            if !self.dev.rx_room() {
                break;
            }
            match self.wire.recv() {
                Ok(Some(f)) => {
                    let now = self.now();
                    self.dev.wire_frame(now, f);
                }
                Ok(None) => break,
                Err(e) => {
                    log_w!("wire: {e}");
                    break;
                }
            }
        }
    }

    /// Encode what the device produced and push frames to the wire.
    fn flush_device(&mut self, now: Instant) {
        for p in self.dev.take_usb() {
            if self.conn.is_none() {
                continue;
            }
            log_t!("usb: -> {} id {:#x}", p.msg.name(), p.id);
            if let Err(e) = self.codec.encode(&p, &mut self.usb_out) {
                log_e!("usb: cannot encode {}: {e}", p.msg.name());
            }
        }
        for f in self.dev.take_wire() {
            self.wire.send(&f);
        }
        self.write_usb(now);
    }

    fn write_usb(&mut self, now: Instant) {
        let mut done = 0;
        let mut failure = None;
        if let Some(c) = &mut self.conn {
            while done < self.usb_out.len() {
                match c.write(&self.usb_out[done..]) {
                    Ok(0) => {
                        failure = Some("write returned 0".to_string());
                        break;
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        self.usb_out.drain(..done.min(self.usb_out.len()));
        if let Some(why) = failure {
            self.close_transport(&why, now);
        }
    }

    fn accept_ctl(&mut self, now: Instant) {
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
    fn serve_ctl(&mut self, i: usize, now: Instant) {
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

    fn flush_ctl(&mut self) {
        for c in &mut self.ctl_clients {
            Self::write_ctl(c);
        }
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
mod tests {
    use super::*;
    use crate::addr::WireSpec;
    use crate::descriptors::Variant;
    use crate::device::{Counters, DeviceConfig};
    use crate::wire::mock;
    use std::sync::{Arc, Mutex};

    const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

    fn device() -> Device {
        Device::new(DeviceConfig::new(Variant::Ax88772a, MAC), Instant::now())
    }

    fn server(wire: Box<dyn Wire>, role: UsbRole, ctl: Option<PathBuf>) -> Server {
        Server::new(device(), wire, role, OnDisconnect::Exit, ctl).unwrap()
    }

    fn mock_wire() -> Box<dyn Wire> {
        Box::new(mock::pair().0)
    }

    /// A fresh private directory for sockets, removed when dropped (also
    /// when the test fails).
    struct TmpDir(PathBuf);

    impl TmpDir {
        fn new(name: &str) -> TmpDir {
            use std::os::unix::fs::DirBuilderExt;
            let d = std::env::temp_dir().join(format!("ax-server-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
            TmpDir(d)
        }

        fn join(&self, p: &str) -> PathBuf {
            self.0.join(p)
        }
    }

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Frames the device took from the wire, whatever became of them.
    fn rx_seen(c: &Counters) -> u64 {
        c.rx_frames
            + c.rx_dropped_no_link
            + c.rx_dropped_gated
            + c.rx_filtered
            + c.rx_length_errors
            + c.rx_overflow
            + c.rx_too_big_for_request
            + c.impair_dropped
    }

    /// A server with a control socket and one client accepted on it.
    fn ctl_rig(name: &str) -> (Server, UnixStream, TmpDir) {
        let dir = TmpDir::new(name);
        let path = dir.join("ctl.sock");
        let mut s = server(mock_wire(), UsbRole::Connected, Some(path.clone()));
        let c = UnixStream::connect(&path).unwrap();
        for _ in 0..1000 {
            s.step().unwrap();
            if !s.ctl_clients.is_empty() {
                break;
            }
        }
        assert_eq!(s.ctl_clients.len(), 1, "the client was accepted");
        (s, c, dir)
    }

    /// Send `req` and run the loop until a whole reply line is back.
    fn exchange(s: &mut Server, c: &mut UnixStream, req: &[u8]) -> String {
        c.set_nonblocking(false).unwrap();
        c.write_all(req).unwrap();
        c.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..10_000 {
            s.step().unwrap();
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            if got.contains(&b'\n') {
                return String::from_utf8(got).unwrap();
            }
        }
        panic!("no reply to the request");
    }

    /// `{"cmd":"ping"}` padded with spaces to `len` bytes, then a newline.
    fn ping_of_length(len: usize) -> Vec<u8> {
        let mut line = br#"{"cmd":"ping"}"#.to_vec();
        line.resize(len, b' ');
        line.push(b'\n');
        line
    }

    #[test]
    fn only_emfile_and_enfile_mean_out_of_descriptors() {
        assert!(out_of_fds(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(out_of_fds(&io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!out_of_fds(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }

    #[test]
    fn output_for_qemu_is_counted_until_written() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut s = server(mock_wire(), UsbRole::Connected, None);
        s.attach(Conn::Unix(a));
        let hello = s.usb_backlog();
        assert!(hello > 0, "the hello waits to be written");
        let now = s.now();
        s.prepare(now);
        assert_eq!(s.usb_backlog(), 0, "written out");
        b.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 65536];
        assert_eq!(b.read(&mut buf).unwrap(), hello);
    }

    #[test]
    fn connecting_retries_quietly_until_the_timeout() {
        let dir = TmpDir::new("connect");
        let addr = SockAddr::Unix(dir.join("nobody.sock"));
        let mut s = server(mock_wire(), UsbRole::Connect(addr), None);
        s.set_connect_timeout(Duration::from_secs(30));
        let clock = Arc::new(Mutex::new(s.started));
        let c = clock.clone();
        s.set_clock(Box::new(move || *c.lock().unwrap()));
        // Nobody listens yet: try again later, within the timeout.
        s.step().unwrap();
        *clock.lock().unwrap() = s.started + Duration::from_secs(29);
        s.step().unwrap();
        *clock.lock().unwrap() = s.started + Duration::from_secs(31);
        assert!(matches!(s.step(), Err(ServerError::ConnectTimeout { .. })));
    }

    #[test]
    fn the_wire_waits_while_qemu_does_not_read() {
        let dir = TmpDir::new("backpressure");
        let path = dir.join("wire.sock");
        let wire =
            crate::wire::open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
        let (a, _qemu) = UnixStream::pair().unwrap();
        let mut s = server(wire, UsbRole::Connected, None);
        // Each step below sleeps its whole idle time: nothing is due.
        s.idle = Duration::from_millis(20);
        s.attach(Conn::Unix(a));
        let mut peer = UnixStream::connect(&path).unwrap();
        // The wire takes its peer while there is room.
        s.step().unwrap();
        assert!(s.dev.rx_room());
        // QEMU stops reading, and output piles up past the high-water mark.
        s.usb_out.resize(4 * USB_OUT_HIGH, 0);
        // A frame arrives, and the peer hangs up (the socket polls as
        // POLLHUP whatever is asked for).
        let mut f = 60u32.to_be_bytes().to_vec();
        f.extend([0xffu8; 60]);
        peer.write_all(&f).unwrap();
        drop(peer);
        for _ in 0..3 {
            s.step().unwrap();
            assert!(s.usb_backlog() >= USB_OUT_HIGH);
        }
        assert_eq!(rx_seen(s.dev.counters()), 0, "the frame waits on the wire");
        // QEMU catches up: the frame is read.
        s.usb_out.clear();
        for _ in 0..100 {
            s.step().unwrap();
            if rx_seen(s.dev.counters()) > 0 {
                break;
            }
        }
        assert_eq!(rx_seen(s.dev.counters()), 1);
    }

    #[test]
    fn control_clients_are_not_read_at_eof_or_with_replies_piling_up() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut c = CtlClient {
            s: a,
            inbuf: Vec::new(),
            out: Vec::new(),
            discarding: false,
            eof: false,
            closed: false,
        };
        assert_eq!(c.events(), libc::POLLIN);
        c.out = b"{}\n".to_vec();
        assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
        c.eof = true;
        assert_eq!(c.events(), libc::POLLOUT, "nothing more to read at eof");
        c.eof = false;
        c.out = vec![b' '; CTL_OUT_HIGH];
        assert_eq!(c.events(), libc::POLLOUT, "replies pile up: read no more");
        c.out.clear();
        c.inbuf = b"{}\n".to_vec();
        assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
    }

    #[test]
    fn a_request_of_exactly_the_longest_length_is_answered() {
        let (mut s, mut c, _dir) = ctl_rig("maxline");
        let reply = exchange(&mut s, &mut c, &ping_of_length(ctl::MAX_LINE));
        assert!(reply.contains(r#""ok":true"#), "{reply}");
        let reply = exchange(&mut s, &mut c, &ping_of_length(ctl::MAX_LINE + 1));
        assert!(reply.contains("request longer than"), "{reply}");
        // The client is still served.
        let reply = exchange(&mut s, &mut c, &ping_of_length(20));
        assert!(reply.contains(r#""ok":true"#), "{reply}");
    }

    #[test]
    fn a_client_that_hangs_up_before_its_reply_is_let_go() {
        let (mut s, mut c, dir) = ctl_rig("hangup");
        c.write_all(b"{\"cmd\":\"ping\"}\n").unwrap();
        drop(c);
        // Its reply cannot be written (EPIPE): the client is dropped.
        for _ in 0..100 {
            s.step().unwrap();
            if s.ctl_clients.is_empty() {
                break;
            }
        }
        assert!(s.ctl_clients.is_empty());
        // And the loop serves others.
        let path = dir.join("ctl.sock");
        let mut c2 = UnixStream::connect(&path).unwrap();
        let reply = exchange(&mut s, &mut c2, b"{\"cmd\":\"ping\"}\n");
        assert!(reply.contains(r#""ok":true"#), "{reply}");
    }

    fn nanos(ts: libc::timespec) -> i64 {
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    }

    #[test]
    fn peer_credentials_name_our_uid() {
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(&a), Some(unsafe { libc::geteuid() }));
    }

    #[test]
    fn waits_are_not_rounded_to_milliseconds() {
        // One 1514-byte frame at 100 Mbit/s.
        let wire = crate::framing::wire_time(1514, 100_000_000);
        assert_eq!(wire, Duration::from_nanos(123_040));
        assert_eq!(nanos(poll_timeout(wire)), 124_000);
        assert_eq!(nanos(poll_timeout(Duration::from_nanos(1_500))), 2_000);
        assert_eq!(nanos(poll_timeout(Duration::ZERO)), 0);
        assert_eq!(
            nanos(poll_timeout(Duration::from_millis(2_500))),
            1_000_000_000
        );
        let ts = poll_timeout(Duration::from_micros(1_250_000));
        assert_eq!((ts.tv_sec, ts.tv_nsec), (1, 0));
    }

    /// A clock the test moves by hand, starting at the server's start.
    fn manual_clock(s: &mut Server) -> Arc<Mutex<Instant>> {
        let clock = Arc::new(Mutex::new(s.started));
        let c = clock.clone();
        s.set_clock(Box::new(move || *c.lock().unwrap()));
        clock
    }

    fn set(clock: &Arc<Mutex<Instant>>, t: Instant) {
        *clock.lock().unwrap() = t;
    }

    #[test]
    fn a_failed_connect_is_retried_200_ms_later_not_sooner() {
        let dir = TmpDir::new("retry");
        let path = dir.join("qemu.sock");
        let addr = SockAddr::Unix(path.clone());
        let mut s = server(mock_wire(), UsbRole::Connect(addr.clone()), None);
        let clock = manual_clock(&mut s);
        let t0 = s.started;
        s.step().unwrap();
        assert!(s.conn.is_none(), "nobody listens yet");
        // QEMU comes up; the next try is due 200 ms after the failed one.
        let _qemu = Listener::bind(&addr).unwrap();
        let early = t0 + Duration::from_millis(199);
        set(&clock, early);
        assert_eq!(
            s.prepare(early),
            Duration::from_millis(1),
            "the wait ends at the retry"
        );
        s.step().unwrap();
        assert!(s.conn.is_none(), "no retry before its time");
        set(&clock, t0 + Duration::from_millis(200));
        s.step().unwrap();
        assert!(s.conn.is_some(), "connected at the retry");
    }

    #[test]
    fn the_connect_timeout_is_measured_from_the_start_and_ends_with_the_first_connection() {
        let dir = TmpDir::new("timeout");
        let addr = SockAddr::Unix(dir.join("qemu.sock"));
        let mut s = server(mock_wire(), UsbRole::Connect(addr.clone()), None);
        s.set_connect_timeout(Duration::from_secs(30));
        let clock = manual_clock(&mut s);
        let t0 = s.started;
        // Exactly at the timeout it is not yet over.
        set(&clock, t0 + Duration::from_secs(30));
        s.step().unwrap();
        set(
            &clock,
            t0 + Duration::from_secs(30) + Duration::from_millis(200),
        );
        assert!(matches!(s.step(), Err(ServerError::ConnectTimeout { .. })));

        // Once QEMU was there, its going away is waited out without end.
        let mut s = Server::new(
            device(),
            mock_wire(),
            UsbRole::Connect(addr.clone()),
            OnDisconnect::Wait,
            None,
        )
        .unwrap();
        s.set_connect_timeout(Duration::from_secs(30));
        let clock = manual_clock(&mut s);
        let qemu = Listener::bind(&addr).unwrap();
        s.step().unwrap();
        assert!(s.conn.is_some());
        let peer = loop {
            if let Some(c) = qemu.accept().unwrap() {
                break c;
            }
        };
        drop(peer);
        drop(qemu);
        for _ in 0..100 {
            s.step().unwrap();
            if s.conn.is_none() {
                break;
            }
        }
        assert!(s.conn.is_none(), "QEMU's hang-up was seen");
        set(&clock, t0 + Duration::from_secs(3600));
        s.step().unwrap();
        s.step().unwrap();
    }

    #[test]
    fn qemu_hanging_up_ends_the_server_when_told_to_exit() {
        let (a, qemu) = UnixStream::pair().unwrap();
        let mut s = server(mock_wire(), UsbRole::Connected, None);
        s.attach(Conn::Unix(a));
        s.step().unwrap();
        assert_eq!(s.usb_backlog(), 0, "the hello is out");
        assert!(!s.finished);
        drop(qemu);
        for _ in 0..10 {
            s.step().unwrap();
            if s.finished {
                break;
            }
        }
        assert!(s.finished, "the hang-up was read");
        assert!(s.conn.is_none());
    }

    #[test]
    fn qemus_hello_is_read_and_the_device_announced() {
        let (a, mut qemu) = UnixStream::pair().unwrap();
        let mut s = server(mock_wire(), UsbRole::Connected, None);
        s.attach(Conn::Unix(a));
        let mut guest = Codec::new(Role::Guest, OUR_CAPS);
        let mut hello = Vec::new();
        guest.encode_hello("qemu (test)", &mut hello).unwrap();
        qemu.write_all(&hello).unwrap();
        qemu.set_nonblocking(true).unwrap();
        let mut names = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..100 {
            s.step().unwrap();
            while let Ok(n) = qemu.read(&mut buf) {
                if n == 0 {
                    break;
                }
                guest.feed(&buf[..n]);
            }
            while let Some(p) = guest.next_packet() {
                names.push(p.unwrap().msg.name());
            }
            if names.contains(&"device_connect") {
                break;
            }
        }
        assert_eq!(names.first(), Some(&"hello"), "{names:?}");
        assert!(names.contains(&"device_connect"), "{names:?}");
    }

    #[test]
    fn input_from_qemu_stops_exactly_at_the_high_water_mark() {
        let (a, _qemu) = UnixStream::pair().unwrap();
        let mut s = server(mock_wire(), UsbRole::Connected, None);
        s.attach(Conn::Unix(a));
        assert!(s.dev.usb_room());
        s.usb_out.resize(USB_OUT_HIGH - 1, 0);
        assert!(s.takes_usb_input());
        s.usb_out.resize(USB_OUT_HIGH, 0);
        assert!(!s.takes_usb_input());
    }

    #[test]
    fn the_wire_is_not_read_with_exactly_the_high_water_mark_queued() {
        let (a, _qemu) = UnixStream::pair().unwrap();
        // QEMU's side of the socket is full: nothing more can be written.
        a.set_nonblocking(true).unwrap();
        let junk = vec![0u8; 65536];
        while (&a).write(&junk).is_ok() {}
        let (wire, link) = mock::pair();
        let mut s = server(Box::new(wire), UsbRole::Connected, None);
        s.attach(Conn::Unix(a));
        s.usb_out.resize(USB_OUT_HIGH, 0);
        let mut f = vec![0xffu8; 6];
        f.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
        f.resize(60, 0);
        link.inject(f);
        for _ in 0..3 {
            s.step().unwrap();
            assert_eq!(s.usb_backlog(), USB_OUT_HIGH);
        }
        assert_eq!(rx_seen(s.dev.counters()), 0, "the frame waits on the wire");
        s.usb_out.truncate(USB_OUT_HIGH - 1);
        s.step().unwrap();
        assert_eq!(
            rx_seen(s.dev.counters()),
            1,
            "one byte below the mark, it is read"
        );
    }

    #[test]
    fn a_wire_without_a_descriptor_is_read_every_turn() {
        let (wire, link) = mock::pair();
        let mut s = server(Box::new(wire), UsbRole::Connected, None);
        let mut f = vec![0xffu8; 6];
        f.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
        f.resize(60, 0);
        link.inject(f);
        s.step().unwrap();
        assert_eq!(rx_seen(s.dev.counters()), 1);
    }

    #[test]
    fn accepting_pauses_until_its_time() {
        let dir = TmpDir::new("pause");
        let ctl = dir.join("ctl.sock");
        let usb = SockAddr::Unix(dir.join("usb.sock"));
        let mut s = Server::new(
            device(),
            Box::new(crate::wire::NoWire),
            UsbRole::Listen(usb.clone()),
            OnDisconnect::Exit,
            Some(ctl.clone()),
        )
        .unwrap();
        let clock = manual_clock(&mut s);
        let now = s.started;
        let idle = s.prepare(now);
        assert!(idle > Duration::from_millis(50), "{idle:?}");
        s.accept_after = now;
        assert_eq!(
            s.prepare(now),
            idle,
            "a pause that is over does not shorten the wait"
        );
        s.accept_after = now + Duration::from_millis(50);
        assert_eq!(s.prepare(now), Duration::from_millis(50));
        let _c = UnixStream::connect(&ctl).unwrap();
        let _q = Conn::connect(&usb).unwrap();
        s.step().unwrap();
        s.step().unwrap();
        assert!(
            s.ctl_clients.is_empty(),
            "no control client during the pause"
        );
        assert!(s.conn.is_none(), "no QEMU during the pause");
        set(&clock, now + Duration::from_millis(50));
        for _ in 0..10 {
            s.step().unwrap();
            if s.conn.is_some() && !s.ctl_clients.is_empty() {
                break;
            }
        }
        assert_eq!(s.ctl_clients.len(), 1);
        assert!(s.conn.is_some());
    }

    #[test]
    fn the_second_control_client_is_answered_on_its_own_events() {
        let (mut s, _first, dir) = ctl_rig("two");
        let mut second = UnixStream::connect(dir.join("ctl.sock")).unwrap();
        for _ in 0..100 {
            s.step().unwrap();
            if s.ctl_clients.len() == 2 {
                break;
            }
        }
        assert_eq!(s.ctl_clients.len(), 2);
        let reply = exchange(&mut s, &mut second, b"{\"cmd\":\"ping\"}\n");
        assert!(reply.contains(r#""ok":true"#), "{reply}");
    }

    #[test]
    fn a_client_a_few_replies_behind_is_still_read() {
        let (a, _b) = UnixStream::pair().unwrap();
        let c = CtlClient {
            s: a,
            inbuf: Vec::new(),
            out: vec![b' '; 64 * 1024],
            discarding: false,
            eof: false,
            closed: false,
        };
        assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
    }

    fn mode(p: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_control_socket_is_private_and_so_is_its_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TmpDir::new("private");
        // A missing directory is made, 0700; the socket is 0600.
        let p = dir.join("made/ctl.sock");
        let l = bind_ctl(&p).unwrap();
        assert_eq!(mode(&dir.join("made")), 0o700);
        assert_eq!(mode(&p), 0o600);
        drop(l);
        // A directory others may enter is refused, and named.
        let open = dir.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = bind_ctl(&open.join("ctl.sock")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("mode 755"), "{e}");
        // So is a parent that is not a directory, whatever its mode.
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = bind_ctl(&file.join("ctl.sock")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn a_stale_control_socket_is_replaced_and_a_live_one_is_not() {
        let dir = TmpDir::new("stale");
        let p = dir.join("ctl.sock");
        // A socket whose emulator is gone (the file stays behind).
        drop(UnixListener::bind(&p).unwrap());
        let s = server(mock_wire(), UsbRole::Connected, Some(p.clone()));
        UnixStream::connect(&p).expect("the new socket listens");
        // A second emulator on the same path leaves the first alone.
        match Server::new(
            device(),
            mock_wire(),
            UsbRole::Connected,
            OnDisconnect::Exit,
            Some(p.clone()),
        ) {
            Err(ServerError::Bind { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::AddrInUse, "{source}")
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("a live control socket was replaced"),
        }
        UnixStream::connect(&p).expect("the first emulator still listens");
        drop(s);
        assert!(!p.exists(), "the socket is removed with its server");
    }

    /// A connection to `path` from a child process running as uid and gid
    /// 65534: the child's exit status is 0 when the server hung up on it,
    /// 1 when it was kept (no hang-up within 10 s), above when it could not
    /// connect at all.
    fn connect_as_nobody(s: &mut Server, path: &std::path::Path) -> i32 {
        use std::os::unix::ffi::OsStrExt;
        // Everything the child needs is made before the fork: it makes
        // system calls only.
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        assert!(bytes.len() < addr.sun_path.len());
        for (d, b) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *b as libc::c_char;
        }
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: the child makes raw system calls only (no allocation, no
        // locks) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: plain system calls on values made before the fork.
            unsafe {
                let nobody = 65534 as libc::c_long;
                if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                    || libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) != 0
                    || libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) != 0
                {
                    libc::_exit(3);
                }
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    libc::_exit(4);
                }
                if libc::connect(
                    fd,
                    (&addr as *const libc::sockaddr_un).cast(),
                    std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
                ) != 0
                {
                    libc::_exit(5);
                }
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                );
                let mut b = 0u8;
                let r = libc::read(fd, (&mut b as *mut u8).cast(), 1);
                libc::_exit(if r == 0 { 0 } else { 1 });
            }
        }
        let mut status = 0;
        for _ in 0..400 {
            s.step().unwrap();
            // SAFETY: waitpid on our own child, status valid for writes.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                assert!(libc::WIFEXITED(status), "child status {status:#x}");
                return libc::WEXITSTATUS(status);
            }
        }
        // SAFETY: as above; the child is ours.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut status, 0);
        }
        panic!("the child connecting as uid 65534 did not finish");
    }

    #[test]
    fn a_control_client_of_another_uid_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a), Some(me), "a socket pair's peer is us");
        if me != 0 {
            // Only root can connect as another uid; the check above is all
            // that runs without it.
            eprintln!("not root: a connection from another uid cannot be made here");
            return;
        }
        let dir = TmpDir::new("otheruid");
        let path = dir.join("ctl.sock");
        let mut s = server(mock_wire(), UsbRole::Connected, Some(path.clone()));
        // bind_ctl made both private; open them so that uid 65534 reaches
        // the uid check behind them.
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(
            connect_as_nobody(&mut s, &path),
            0,
            "the server hung up on uid 65534"
        );
        assert!(s.ctl_clients.is_empty());
        // Our own connections are still served.
        let mut c = UnixStream::connect(&path).unwrap();
        let reply = exchange(&mut s, &mut c, b"{\"cmd\":\"ping\"}\n");
        assert!(reply.contains(r#""ok":true"#), "{reply}");
    }
}
