//! `ax88772-gadget`: a usbredir device model (ax88772-emu) as a real USB
//! device function, through Linux configfs and FunctionFS.
//!
//! It connects to the model as QEMU's `usb-redir` would, learns the model's
//! identity, interface and endpoints, creates a configfs gadget with one
//! FunctionFS function, and binds it to a USB device controller (`dummy_hcd`
//! in phyfarm's exporter guest). From then on every control request the
//! host sends on ep0, and every bulk and interrupt transfer, goes to the
//! model and back. The model's unplug unbinds the gadget; its plug binds it
//! again. Byte layouts live in `ax88772::gadget`.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ax88772::gadget::{self, Endpoint, Event, Setup};
use ax88772::splice::{Splice, Splitter};
use clap::Parser;
use usbredir::proto::{cap, ep_type};
use usbredir::{
    BulkPacket, Caps, Codec, ControlPacket, DeviceConnect, EpInfo, InterfaceInfo, Message, Packet,
    Role, SmallDataPacket,
};

const ABOUT: &str = "A usbredir device model as a USB gadget (configfs + FunctionFS).";

#[derive(Parser, Debug)]
#[command(name = "ax88772-gadget", about = ABOUT, long_about = None)]
struct Args {
    /// The model's usbredir stream: HOST:PORT (ax88772-emu --listen
    /// HOST:PORT) or port:NAME, the virtio-serial port NAME (a QEMU chardev
    /// connected to ax88772-emu --listen unix:PATH).
    #[arg(long, value_name = "HOST:PORT|port:NAME")]
    model: String,
    /// Relay the virtio-serial port NAME to a TCP server (usbredirect --as
    /// HOST:PORT) once the port's far end has spoken: QEMU's usb-redir on
    /// the host reaches usbredirect without a network. When usbredirect
    /// ends (its device went away), the next one listening at HOST:PORT is
    /// spliced into QEMU's session.
    #[arg(long, value_name = "NAME=HOST:PORT")]
    relay: Option<String>,
    /// Give up if the model cannot be reached within this many seconds
    /// (at most 3600).
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=MAX_CONNECT_TIMEOUT_S))]
    connect_timeout: u64,
    /// The USB device controller to bind to [first in /sys/class/udc].
    #[arg(long, value_name = "NAME")]
    udc: Option<String>,
    /// Where configfs is mounted.
    #[arg(long, default_value = "/sys/kernel/config", value_name = "DIR")]
    configfs: PathBuf,
    /// Where the FunctionFS instance is mounted.
    #[arg(long, default_value = "/dev/ffs-ax88772", value_name = "DIR")]
    ffs: PathBuf,
    /// Bytes asked of the model per bulk IN transfer (512 to 65536).
    #[arg(long, default_value_t = 16384, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(512..=i64::from(MAX_BULK_IN_LEN)))]
    bulk_in_len: u32,
    /// Transfers in flight per bulk endpoint (1 to 64).
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_IN_FLIGHT as u64))]
    in_flight: usize,
}

/// Longest `--connect-timeout`, in seconds.
const MAX_CONNECT_TIMEOUT_S: u64 = 3600;
/// Largest `--bulk-in-len`: the model fills at most 2048 bytes of each.
const MAX_BULK_IN_LEN: u32 = 65536;
/// Most `--in-flight` transfers per endpoint: the model holds 64 bulk OUTs
/// waiting (`ax88772::device::OUT_WAIT_MAX`).
const MAX_IN_FLIGHT: usize = 64;

const NAME: &str = "ax88772";
/// Bulk IN data gathered into one write, at most (plus one transfer).
const COALESCE: usize = 16 * 1024;
/// The size of each queued bulk OUT read: more than any transfer the host's
/// driver sends (a transfer ends with a short packet).
const OUT_READ: usize = 32 * 1024;

macro_rules! say {
    ($($a:tt)*) => { say_line(format_args!($($a)*)) };
}

/// One line on stderr (in unit tests, also kept in the thread's log).
fn say_line(a: std::fmt::Arguments) {
    #[cfg(test)]
    tests::said(&a);
    eprintln!("ax88772-gadget: {a}");
}

/// The connection to the model: one codec, one writer, ids handed out here.
struct Link {
    codec: Mutex<Codec>,
    out: Mutex<Conn>,
    next_id: AtomicU64,
}

impl Link {
    fn send(&self, msg: Message) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut buf = Vec::new();
        self.codec
            .lock()
            .unwrap()
            .encode(&Packet::new(id, msg), &mut buf)
            .context("encoding a usbredir packet")?;
        self.out
            .lock()
            .unwrap()
            .write_all(&buf)
            .context("writing to the model")?;
        Ok(id)
    }
}

/// Read packets until `done` says the list is enough (before the reader
/// thread exists).
fn read_until(
    s: &mut Conn,
    link: &Link,
    deadline: Instant,
    mut done: impl FnMut(&Packet) -> bool,
) -> Result<()> {
    let mut buf = vec![0u8; 65536];
    loop {
        loop {
            let p = link.codec.lock().unwrap().next_packet();
            match p {
                Some(Ok(p)) => {
                    if done(&p) {
                        return Ok(());
                    }
                }
                Some(Err(e)) => bail!("the model sent a bad packet: {e}"),
                None => break,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the model did not announce a device in time");
        }
        if !readable(s, left)? {
            continue;
        }
        let n = s.read(&mut buf).context("reading from the model")?;
        if n == 0 {
            bail!("the model closed the connection before announcing a device");
        }
        link.codec.lock().unwrap().feed(&buf[..n]);
    }
}

struct Identity {
    connect: DeviceConnect,
    iface: InterfaceInfo,
    eps: EpInfo,
    strings: [String; 3],
}

/// A byte stream to the model or to usbredirect: TCP or a virtio-serial port.
enum Conn {
    Tcp(TcpStream),
    Port(File),
}

impl Conn {
    fn try_clone(&self) -> std::io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Port(f) => Conn::Port(f.try_clone()?),
        })
    }
    fn fd(&self) -> i32 {
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
fn readable(c: &Conn, timeout: Duration) -> Result<bool> {
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
fn open_port(name: &str, timeout: Duration) -> Result<File> {
    open_port_in(
        Path::new("/sys/class/virtio-ports"),
        Path::new("/dev"),
        name,
        timeout,
    )
}

/// [`open_port`], with the sysfs class directory `ports` and the device
/// directory `dev` given.
fn open_port_in(ports: &Path, dev: &Path, name: &str, timeout: Duration) -> Result<File> {
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

fn connect(addr: &str, timeout: Duration) -> Result<Conn> {
    connect_by(addr, timeout, Instant::now)
}

/// [`connect`], reading the time from `now`.
fn connect_by(addr: &str, timeout: Duration, now: impl Fn() -> Instant) -> Result<Conn> {
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

/// The relay's state, shared by its two directions.
struct Relay {
    splice: Splice,
    /// The current usbredirect session, if one is up.
    to_exporter: Option<Arc<TcpStream>>,
}

/// `--relay NAME=HOST:PORT`: wait for QEMU's hello on the port (so nothing
/// usbredirect says is sent before QEMU listens), then connect to
/// HOST:PORT and pass whole messages both ways. usbredirect ends its
/// session and exits when its device goes away (an unplug); QEMU's session
/// lives on, so the relay splices the next usbredirect listening there into
/// it (`ax88772::splice`): QEMU is told the device went away, and then that
/// it is back.
fn relay(spec: &str) -> Result<()> {
    let (name, addr) = spec
        .split_once('=')
        .context("--relay wants NAME=HOST:PORT")?;
    let port = Conn::Port(open_port(name, Duration::from_secs(30))?);
    relay_on(port, addr, Duration::from_secs(60))
}

/// The relay on an open port: QEMU's side, read here; each usbredirect
/// session is read by a second thread. `first_connect` bounds the wait for
/// the first usbredirect to listen.
fn relay_on(mut port: Conn, addr: &str, first_connect: Duration) -> Result<()> {
    let sh = Arc::new(Mutex::new(Relay {
        splice: Splice::default(),
        to_exporter: None,
    }));
    let mut split = Splitter::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut sessions_started = false;
    loop {
        let n = match port.read(&mut buf) {
            // The port's host side is not connected yet.
            Ok(0) if !sessions_started => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Ok(0) => {
                say!("I: relay: QEMU closed the port");
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("relay: reading the port: {e}"),
        };
        split.feed(&buf[..n]);
        let (out, to) = {
            let mut r = sh.lock().unwrap();
            let mut out = Vec::new();
            while let Some(m) = split
                .next(r.splice.qemu_header_len())
                .context("relay: from QEMU")?
            {
                if let Some(m) = r.splice.from_qemu(m).context("relay: from QEMU")? {
                    out.extend_from_slice(&m);
                }
            }
            (out, r.to_exporter.clone())
        };
        if let (false, Some(t)) = (out.is_empty(), to) {
            // A failed write ends that session: its reader sees it too.
            let _ = (&*t).write_all(&out);
        }
        if !sessions_started && sh.lock().unwrap().splice.has_qemu_hello() {
            sessions_started = true;
            let (sh, addr, port) = (sh.clone(), addr.to_string(), port.try_clone()?);
            std::thread::spawn(move || {
                if let Err(e) = exporter_sessions(&sh, &addr, port, first_connect) {
                    say!("E: {e:#}");
                    std::process::exit(1);
                }
            });
        }
    }
}

/// Connect to usbredirect at `addr`, trying every 50 ms, for at most
/// `limit` (None: until it listens).
fn connect_exporter(addr: &str, limit: Option<Duration>) -> Result<TcpStream> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if limit.is_some_and(|l| start.elapsed() >= l) => {
                bail!("relay: cannot connect to {addr}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// usbredirect's sessions, one after another, spliced into QEMU's, until
/// the port closes (QEMU went away). An error is one the splice cannot
/// survive.
fn exporter_sessions(
    sh: &Mutex<Relay>,
    addr: &str,
    mut port: Conn,
    first_connect: Duration,
) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut limit = Some(first_connect);
    loop {
        let tcp = Arc::new(connect_exporter(addr, limit.take())?);
        let (hello, n) = {
            let mut r = sh.lock().unwrap();
            let hello = r
                .splice
                .session_start()
                .context("relay: no hello from QEMU")?;
            r.to_exporter = Some(tcp.clone());
            (hello, r.splice.sessions)
        };
        say!("I: relay: usbredirect session {n} at {addr}");
        let mut split = Splitter::default();
        let why = match (&*tcp).write_all(&hello) {
            Err(e) => e.to_string(),
            Ok(()) => loop {
                let k = match (&*tcp).read(&mut buf) {
                    Ok(0) => break "closed".to_string(),
                    Ok(k) => k,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => break e.to_string(),
                };
                split.feed(&buf[..k]);
                let mut out = Vec::new();
                {
                    let mut r = sh.lock().unwrap();
                    while let Some(m) = split
                        .next(r.splice.exporter_header_len())
                        .context("relay: from usbredirect")?
                    {
                        if let Some(m) = r.splice.from_exporter(m).context("relay")? {
                            out.extend_from_slice(&m);
                        }
                    }
                }
                if let Err(e) = port.write_all(&out) {
                    say!("I: relay: the port closed ({e})");
                    return Ok(());
                }
            },
        };
        let _ = tcp.shutdown(std::net::Shutdown::Both);
        let gone = {
            let mut r = sh.lock().unwrap();
            r.to_exporter = None;
            r.splice.session_end()
        };
        if let Some(Err(e)) = gone.as_ref().map(|d| port.write_all(d)) {
            say!("I: relay: the port closed ({e})");
            return Ok(());
        }
        say!(
            "I: relay: usbredirect session {n} ended ({why}){}",
            if gone.is_some() {
                "; QEMU was told the device went away"
            } else {
                ""
            }
        );
    }
}

fn learn(s: &mut Conn, link: &Link) -> Result<Identity> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut connect, mut iface, mut eps) = (None, None, None);
    read_until(s, link, deadline, |p| {
        match &p.msg {
            Message::DeviceConnect(c) => connect = Some(*c),
            Message::InterfaceInfo(i) => iface = Some((**i).clone()),
            Message::EpInfo(e) => eps = Some((**e).clone()),
            _ => {}
        }
        connect.is_some() && iface.is_some() && eps.is_some()
    })?;
    let mut strings: [String; 3] = Default::default();
    for (i, slot) in strings.iter_mut().enumerate() {
        let id = link.send(Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            request: 6,
            requesttype: 0x80,
            value: 0x0300 | (i as u16 + 1),
            index: 0x0409,
            length: 255,
            ..Default::default()
        }))?;
        let mut got = None;
        read_until(s, link, deadline, |p| {
            if let (true, Message::ControlPacket(c)) = (p.id == id, &p.msg) {
                got = Some(c.clone());
                true
            } else {
                false
            }
        })?;
        if let Some(c) = got.filter(|c| c.status.is_success()) {
            *slot = gadget::configfs_text(&gadget::string_text(&c.data).unwrap_or_default());
        }
    }
    Ok(Identity {
        connect: connect.unwrap(),
        iface: iface.unwrap(),
        eps: eps.unwrap(),
        strings,
    })
}

fn write_attr(dir: &Path, name: &str, value: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

/// One thing the gadget's set-up made, and how it is taken back.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A directory it created (rmdir; in configfs that removes the
    /// attributes and default groups inside with it).
    Dir(PathBuf),
    /// A file a write created (a plain directory in configfs' place; real
    /// configfs attributes exist with their directory and are not this).
    File(PathBuf),
    /// The function's link into its configuration.
    Link(PathBuf),
    /// The FunctionFS mount.
    Mount(PathBuf),
    /// The gadget bound to a controller (its `UDC` attribute).
    Bound(PathBuf),
}

/// What the set-up has made so far: on a failure it is taken back, last
/// first, so that a failed start leaves no half-built gadget behind.
struct Made {
    steps: Vec<Step>,
    unmount: fn(&Path) -> std::io::Result<()>,
}

impl Default for Made {
    fn default() -> Self {
        Made {
            steps: Vec::new(),
            unmount: umount,
        }
    }
}

fn umount(p: &Path) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path. MNT_DETACH: the endpoint files
    // still open go with the process.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Made {
    /// Create `p` and whichever of its parents are missing, each recorded.
    fn mkdir(&mut self, p: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut q = Some(p);
        while let Some(d) = q.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            missing.push(d.to_path_buf());
            q = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d).with_context(|| format!("creating {}", d.display()))?;
            self.steps.push(Step::Dir(d));
        }
        Ok(())
    }

    /// [`write_attr`], recording the file when the write created it.
    fn write_attr(&mut self, dir: &Path, name: &str, value: &str) -> Result<()> {
        let p = dir.join(name);
        let existed = p.exists();
        write_attr(dir, name, value)?;
        if !existed {
            self.steps.push(Step::File(p));
        }
        Ok(())
    }

    /// Take back everything, last first. Each failure is logged; the
    /// caller reports the error that made it give up.
    fn undo(&mut self) {
        while let Some(step) = self.steps.pop() {
            let (what, r) = match &step {
                Step::Bound(g) => (
                    "unbinding",
                    write_attr(g, "UDC", "\n").map_err(|e| std::io::Error::other(format!("{e:#}"))),
                ),
                Step::Link(p) | Step::File(p) => ("removing", std::fs::remove_file(p)),
                Step::Mount(p) => ("unmounting", (self.unmount)(p)),
                Step::Dir(p) => ("removing", std::fs::remove_dir(p)),
            };
            if let Err(e) = r {
                let p = match &step {
                    Step::Bound(p)
                    | Step::Link(p)
                    | Step::File(p)
                    | Step::Mount(p)
                    | Step::Dir(p) => p,
                };
                say!("W: cleaning up: {what} {}: {e}", p.display());
            }
        }
    }
}

/// The configfs gadget with its one FunctionFS function (not yet bound).
fn make_gadget(args: &Args, id: &Identity, made: &mut Made) -> Result<PathBuf> {
    let g = args.configfs.join("usb_gadget").join(NAME);
    if g.exists() {
        bail!("{} exists already: another gadget runs here", g.display());
    }
    made.mkdir(&g)?;
    let c = &id.connect;
    made.write_attr(&g, "idVendor", &format!("{:#06x}", c.vendor_id))?;
    made.write_attr(&g, "idProduct", &format!("{:#06x}", c.product_id))?;
    made.write_attr(&g, "bcdDevice", &format!("{:#06x}", c.device_version_bcd))?;
    made.write_attr(&g, "bcdUSB", "0x0200")?;
    made.write_attr(&g, "bDeviceClass", &format!("{:#04x}", c.device_class))?;
    made.write_attr(
        &g,
        "bDeviceSubClass",
        &format!("{:#04x}", c.device_subclass),
    )?;
    made.write_attr(
        &g,
        "bDeviceProtocol",
        &format!("{:#04x}", c.device_protocol),
    )?;
    let st = g.join("strings/0x409");
    made.mkdir(&st)?;
    for (name, v) in ["manufacturer", "product", "serialnumber"]
        .iter()
        .zip(&id.strings)
    {
        made.write_attr(&st, name, v)?;
    }
    let cfg = g.join("configs/c.1");
    made.mkdir(&cfg)?;
    made.write_attr(&cfg, "MaxPower", "250")?;
    let f = g.join("functions").join(format!("ffs.{NAME}"));
    made.mkdir(&f)?;
    Ok(g)
}

/// The gadget built up to binding: configfs tree, FunctionFS mounted
/// with `mount` on `args.ffs`, the function's descriptors written to its
/// `ep0` (returned) and the function linked into its configuration.
fn build(
    args: &Args,
    id: &Identity,
    descriptors: &[u8],
    made: &mut Made,
    mount: impl FnOnce(&Path) -> Result<()>,
) -> Result<(PathBuf, File)> {
    let g = make_gadget(args, id, made)?;
    made.mkdir(&args.ffs)?;
    mount(&args.ffs)?;
    made.steps.push(Step::Mount(args.ffs.clone()));
    let mut ep0 = OpenOptions::new()
        .read(true)
        .write(true)
        .open(args.ffs.join("ep0"))
        .context("opening ep0")?;
    ep0.write_all(descriptors)
        .context("writing the function's descriptors to ep0")?;
    ep0.write_all(&gadget::strings())
        .context("writing the function's strings to ep0")?;
    let link_name = g.join("configs/c.1").join(format!("ffs.{NAME}"));
    std::os::unix::fs::symlink(g.join("functions").join(format!("ffs.{NAME}")), &link_name)
        .with_context(|| format!("linking {}", link_name.display()))?;
    made.steps.push(Step::Link(link_name));
    Ok((g, ep0))
}

fn mount_ffs(dir: &Path) -> Result<()> {
    let src = CString::new(NAME).unwrap();
    let target = CString::new(dir.as_os_str().as_encoded_bytes()).context("mount point")?;
    let fstype = CString::new("functionfs").unwrap();
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call; data may be null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mounting functionfs {NAME} on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// The first USB device controller (by name) in `class`, /sys/class/udc.
fn first_udc(class: &Path) -> Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(class)
        .with_context(|| format!("reading {} (no USB device controller?)", class.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .with_context(|| format!("no USB device controller in {}", class.display()))
}

/// What the reader thread hands each endpoint's pump.
enum ToPump {
    Bulk(BulkPacket),
    Interrupt(SmallDataPacket),
}

struct Shared {
    link: Link,
    /// Counts Enable events: pumps drop what they had in flight when it moves.
    epoch: AtomicU64,
    enabled: AtomicBool,
    plugged: AtomicBool,
    gadget: PathBuf,
    udc: String,
}

impl Shared {
    fn bind(&self, on: bool) {
        let v = if on { self.udc.as_str() } else { "\n" };
        match write_attr(&self.gadget, "UDC", v) {
            Ok(()) => say!("I: gadget {}", if on { "bound" } else { "unbound" }),
            Err(e) => say!("W: {e:#}"),
        }
    }
}

fn reader(
    mut s: Conn,
    sh: Arc<Shared>,
    ctrl: Sender<Packet>,
    pumps: HashMap<u8, SyncSender<ToPump>>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => {
                say!("E: the model closed the connection");
                std::process::exit(1);
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                say!("E: reading from the model: {e}");
                std::process::exit(1);
            }
        };
        let mut packets = Vec::new();
        {
            let mut c = sh.link.codec.lock().unwrap();
            c.feed(&buf[..n]);
            while let Some(p) = c.next_packet() {
                match p {
                    Ok(p) => packets.push(p),
                    Err(e) => {
                        say!("E: the model sent a bad packet: {e}");
                        std::process::exit(1);
                    }
                }
            }
        }
        for p in packets {
            route(&sh, &ctrl, &pumps, p);
        }
    }
}

/// Hand one packet from the model to whoever waits for it.
fn route(sh: &Shared, ctrl: &Sender<Packet>, pumps: &HashMap<u8, SyncSender<ToPump>>, p: Packet) {
    match p.msg {
        Message::ControlPacket(_) => {
            let _ = ctrl.send(p);
        }
        Message::BulkPacket(b) => {
            if let Some(t) = pumps.get(&b.endpoint) {
                let _ = t.send(ToPump::Bulk(b));
            }
        }
        Message::InterruptPacket(i) => {
            // A host that does not poll loses status, as with the chip.
            if let Some(t) = pumps.get(&i.endpoint) {
                let _ = t.try_send(ToPump::Interrupt(i));
            }
        }
        Message::DeviceDisconnect => {
            say!("I: the model unplugged the device");
            sh.plugged.store(false, Ordering::SeqCst);
            let _ = sh.link.send(Message::DeviceDisconnectAck);
            sh.bind(false);
        }
        Message::DeviceConnect(_) if !sh.plugged.swap(true, Ordering::SeqCst) => {
            say!("I: the model plugged the device in");
            sh.bind(true);
        }
        _ => {}
    }
}

fn is_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ESHUTDOWN) | Some(libc::EIO) | Some(libc::ENODEV) | Some(libc::EINTR)
    )
}

/// Wait until the host has enabled the function; the epoch it did so in.
fn wait_enabled(sh: &Shared) -> u64 {
    while !sh.enabled.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    sh.epoch.load(Ordering::SeqCst)
}

/// Bulk IN: keep `in_flight` requests at the model; write what it returns.
fn bulk_in(sh: Arc<Shared>, ep: Endpoint, mut file: File, rx: Receiver<ToPump>, a: (u32, usize)) {
    let (len, in_flight) = a;
    let mut outstanding = 0usize;
    let mut epoch = wait_enabled(&sh);
    loop {
        let now = sh.epoch.load(Ordering::SeqCst);
        if !sh.enabled.load(Ordering::SeqCst) || now != epoch {
            epoch = wait_enabled(&sh);
            outstanding = 0;
        }
        while outstanding < in_flight {
            let m = Message::BulkPacket(BulkPacket {
                endpoint: ep.address,
                length: len,
                ..Default::default()
            });
            if sh.link.send(m).is_err() {
                return;
            }
            outstanding += 1;
        }
        let first = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // What the model has returned so far goes out in one write, as the
        // chip streams its RX FIFO: the host's driver splits frames across
        // its transfers itself. One write is one controller request.
        let mut data = Vec::new();
        let mut next = Some(first);
        while let Some(m) = next.take() {
            if let ToPump::Bulk(b) = m {
                outstanding = outstanding.saturating_sub(1);
                if b.status.is_success() {
                    data.extend_from_slice(&b.data);
                }
            }
            if data.len() < COALESCE {
                next = rx.try_recv().ok();
            }
        }
        if !data.is_empty() {
            if let Err(e) = file.write_all(&data) {
                if !is_gone(&e) {
                    say!("W: ep {:#04x}: {e}", ep.address);
                }
            }
        }
    }
}

/// Bulk OUT: keep `in_flight` reads queued on the endpoint (Linux AIO, so
/// that the controller can complete several of the host's transfers at
/// once), and pass each transfer to the model, at most `in_flight`
/// unanswered there.
fn bulk_out(sh: Arc<Shared>, ep: Endpoint, file: File, rx: Receiver<ToPump>, in_flight: usize) {
    let ctx = match aio::Ctx::new(in_flight as u32) {
        Ok(c) => c,
        Err(e) => {
            say!("E: ep {:#04x}: io_setup: {e}", ep.address);
            std::process::exit(1);
        }
    };
    let fd = file.as_raw_fd();
    let mut slots: Vec<aio::Read> = (0..in_flight)
        .map(|i| aio::Read::new(fd, i as u64, OUT_READ))
        .collect();
    for s in &mut slots {
        if let Err(e) = ctx.submit(s) {
            say!("E: ep {:#04x}: io_submit: {e}", ep.address);
            std::process::exit(1);
        }
    }
    let mut events = vec![aio::Event::default(); in_flight];
    let mut outstanding = 0usize;
    let mut epoch = sh.epoch.load(Ordering::SeqCst);
    loop {
        let n = match ctx.wait(&mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                say!("E: ep {:#04x}: io_getevents: {e}", ep.address);
                std::process::exit(1);
            }
        };
        for ev in &events[..n] {
            let slot = &mut slots[ev.data as usize];
            if ev.res > 0 {
                let now = sh.epoch.load(Ordering::SeqCst);
                if now != epoch {
                    epoch = now;
                    outstanding = 0;
                }
                while let Ok(ToPump::Bulk(_)) = rx.try_recv() {
                    outstanding = outstanding.saturating_sub(1);
                }
                while outstanding >= in_flight {
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(_) => outstanding -= 1,
                        Err(RecvTimeoutError::Timeout) => {
                            if sh.epoch.load(Ordering::SeqCst) != epoch {
                                outstanding = 0;
                            }
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                let data = slot.buf[..ev.res as usize].to_vec();
                let m = Message::BulkPacket(BulkPacket {
                    endpoint: ep.address,
                    length: data.len() as u32,
                    data,
                    ..Default::default()
                });
                if sh.link.send(m).is_err() {
                    return;
                }
                outstanding += 1;
            } else if ev.res < 0 {
                let e = std::io::Error::from_raw_os_error(-ev.res as i32);
                if !is_gone(&e) {
                    say!("W: ep {:#04x}: {e}", ep.address);
                }
                // Disabled: the next read waits in io_submit until enabled.
                std::thread::sleep(Duration::from_millis(5));
            }
            if let Err(e) = ctx.submit(slot) {
                say!("E: ep {:#04x}: io_submit: {e}", ep.address);
                std::process::exit(1);
            }
        }
    }
}

/// Linux native AIO (io_setup/io_submit/io_getevents), which FunctionFS
/// endpoint files support, for the few calls `bulk_out` makes.
mod aio {
    use std::io;
    use std::os::fd::RawFd;

    const IOCB_CMD_PREAD: u16 = 0;

    /// `struct iocb` (include/uapi/linux/aio_abi.h), little-endian layout.
    #[repr(C)]
    #[derive(Default)]
    struct Iocb {
        data: u64,
        key: u32,
        rw_flags: u32,
        opcode: u16,
        reqprio: i16,
        fildes: u32,
        buf: u64,
        nbytes: u64,
        offset: i64,
        reserved2: u64,
        flags: u32,
        resfd: u32,
    }

    /// `struct io_event`.
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    pub struct Event {
        pub data: u64,
        obj: u64,
        pub res: i64,
        res2: i64,
    }

    /// One read with its own buffer; both stay put while it is queued.
    pub struct Read {
        iocb: Box<Iocb>,
        pub buf: Box<[u8]>,
    }

    impl Read {
        pub fn new(fd: RawFd, data: u64, len: usize) -> Read {
            let mut buf = vec![0u8; len].into_boxed_slice();
            let iocb = Box::new(Iocb {
                data,
                opcode: IOCB_CMD_PREAD,
                fildes: fd as u32,
                buf: buf.as_mut_ptr() as u64,
                nbytes: len as u64,
                ..Default::default()
            });
            Read { iocb, buf }
        }
    }

    pub struct Ctx(libc::c_ulong);

    pub(super) fn check(r: libc::c_long) -> io::Result<usize> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    impl Ctx {
        pub fn new(n: u32) -> io::Result<Ctx> {
            let mut ctx: libc::c_ulong = 0;
            // SAFETY: io_setup writes the context id into `ctx`.
            check(unsafe { libc::syscall(libc::SYS_io_setup, n as libc::c_long, &mut ctx) })?;
            Ok(Ctx(ctx))
        }

        /// Queue `r`; it must not be queued already.
        pub fn submit(&self, r: &mut Read) -> io::Result<()> {
            let mut p: *mut Iocb = &mut *r.iocb;
            loop {
                // SAFETY: one valid iocb whose buffer outlives the request
                // (the Read is kept by the caller until its event is taken).
                let rc = unsafe {
                    libc::syscall(libc::SYS_io_submit, self.0, 1 as libc::c_long, &mut p)
                };
                match check(rc) {
                    Ok(_) => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
        }

        /// Wait for at least one completion; how many landed in `events`.
        pub fn wait(&self, events: &mut [Event]) -> io::Result<usize> {
            // SAFETY: `events` has room for events.len() io_events.
            check(unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.0,
                    1 as libc::c_long,
                    events.len() as libc::c_long,
                    events.as_mut_ptr(),
                    std::ptr::null_mut::<libc::timespec>(),
                )
            })
        }
    }

    impl Drop for Ctx {
        fn drop(&mut self) {
            // SAFETY: destroys the context this value owns.
            unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
        }
    }
}

fn interrupt_in(ep: Endpoint, mut file: File, rx: Receiver<ToPump>) {
    while let Ok(m) = rx.recv() {
        if let ToPump::Interrupt(i) = m {
            if i.status.is_success() && !i.data.is_empty() {
                if let Err(e) = file.write_all(&i.data) {
                    if !is_gone(&e) {
                        say!("W: ep {:#04x}: {e}", ep.address);
                    }
                }
            }
        }
    }
}

/// Answer one setup request through the model.
fn setup(sh: &Shared, ep0: &mut File, ctrl: &Receiver<Packet>, s: Setup) -> Result<()> {
    let mut data = Vec::new();
    if !s.is_in() && s.length > 0 {
        data = vec![0u8; s.length as usize];
        let n = ep0
            .read(&mut data)
            .context("reading a control request's data")?;
        data.truncate(n);
    }
    let id = sh.link.send(Message::ControlPacket(ControlPacket {
        endpoint: s.request_type & 0x80,
        request: s.request,
        requesttype: s.request_type,
        value: s.value,
        index: s.index,
        length: s.length,
        data,
        ..Default::default()
    }))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let reply = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctrl.recv_timeout(left) {
            Ok(p) if p.id == id => match p.msg {
                Message::ControlPacket(c) => break Some(c),
                _ => unreachable!("only control packets are routed here"),
            },
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    let ok = reply.as_ref().is_some_and(|c| c.status.is_success());
    let r = match (s.is_in(), ok) {
        (true, true) => {
            let c = reply.as_ref().unwrap();
            let n = c.data.len().min(s.length as usize);
            ep0.write(&c.data[..n]).map(|_| ())
        }
        // Stall: a read on an IN request, a write on an OUT one.
        (true, false) => ep0.read(&mut []).map(|_| ()),
        (false, true) if s.length == 0 => ep0.read(&mut []).map(|_| ()),
        (false, true) => Ok(()),
        (false, false) if s.length == 0 => ep0.write(&[]).map(|_| ()),
        (false, false) => {
            // FunctionFS acknowledged the data stage when it handed over the
            // data: a refusal the model decides on after seeing it (an
            // injected MII write fault) cannot reach the host as a STALL.
            say!(
                "W: the model refused OUT request {:#04x}/{:#04x} after its data stage; \
                 FunctionFS had acknowledged it already",
                s.request_type,
                s.request
            );
            Ok(())
        }
    };
    match r {
        Ok(()) => {}
        // A stall is reported as an error; so is a request the host gave up on.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EL2HLT) | Some(libc::EIDRM)) => {}
        Err(e) => say!("W: ep0: {e}"),
    }
    if reply.is_none() {
        say!(
            "W: the model did not answer request {:#04x}/{:#04x} in 5 s",
            s.request_type,
            s.request
        );
    }
    Ok(())
}

fn run(args: Args) -> Result<()> {
    let mut s = connect(&args.model, Duration::from_secs(args.connect_timeout))?;
    let caps = Caps::XHCI_HOST.with(cap::DEVICE_DISCONNECT_ACK);
    let link = Link {
        codec: Mutex::new(Codec::new(Role::Guest, caps)),
        out: Mutex::new(s.try_clone()?),
        next_id: AtomicU64::new(1),
    };
    {
        let mut hello = Vec::new();
        link.codec
            .lock()
            .unwrap()
            .encode_hello("ax88772-gadget", &mut hello)?;
        s.write_all(&hello)?;
    }
    let id = learn(&mut s, &link)?;
    let eps = gadget::endpoints(&id.eps)?;
    say!(
        "I: model {:04x}:{:04x} ({}, {}), endpoints {}",
        id.connect.vendor_id,
        id.connect.product_id,
        id.strings[0],
        id.strings[1],
        eps.iter()
            .map(|e| format!("{:#04x}", e.address))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let descriptors = gadget::descriptors(&id.iface, &eps)?;
    let udc = match &args.udc {
        Some(u) => u.clone(),
        None => first_udc(Path::new("/sys/class/udc"))?,
    };
    let mut made = Made::default();
    let r = build(&args, &id, &descriptors, &mut made, mount_ffs)
        .and_then(|(g, ep0)| serve(&args, &eps, link, s, g, udc, ep0, &mut made));
    if r.is_err() {
        made.undo();
    }
    r
}

/// The bound gadget's life: endpoint pumps, the model's reader, ep0's
/// events. `made` gets the binding.
#[allow(clippy::too_many_arguments)]
fn serve(
    args: &Args,
    eps: &[Endpoint],
    link: Link,
    s: Conn,
    g: PathBuf,
    udc: String,
    mut ep0: File,
    made: &mut Made,
) -> Result<()> {
    let sh = Arc::new(Shared {
        link,
        epoch: AtomicU64::new(0),
        enabled: AtomicBool::new(false),
        plugged: AtomicBool::new(true),
        gadget: g,
        udc,
    });
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let mut pumps = HashMap::new();
    for (i, ep) in eps.iter().enumerate() {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(args.ffs.join(format!("ep{}", i + 1)))
            .with_context(|| format!("opening ep{}", i + 1))?;
        let (tx, rx) = mpsc::sync_channel(64);
        pumps.insert(ep.address, tx);
        let (sh, ep) = (sh.clone(), *ep);
        let (len, fl) = (args.bulk_in_len, args.in_flight.max(1));
        std::thread::spawn(move || match (ep.kind, ep.is_in()) {
            (ep_type::BULK, true) => bulk_in(sh, ep, file, rx, (len, fl)),
            (ep_type::BULK, false) => bulk_out(sh, ep, file, rx, fl),
            (_, true) => interrupt_in(ep, file, rx),
            // An interrupt OUT endpoint: nothing of the AX88772A's.
            (_, false) => drop((file, rx)),
        });
    }
    {
        let (sh, s) = (sh.clone(), s.try_clone()?);
        std::thread::spawn(move || reader(s, sh, ctrl_tx, pumps));
    }
    sh.bind(true);
    made.steps.push(Step::Bound(sh.gadget.clone()));
    if let Some(spec) = args.relay.clone() {
        std::thread::spawn(move || {
            if let Err(e) = relay(&spec) {
                say!("E: {e:#}");
                std::process::exit(1);
            }
        });
    }
    let int_ep = eps
        .iter()
        .find(|e| e.kind == ep_type::INTERRUPT && e.is_in())
        .map(|e| e.address);
    let mut buf = [0u8; gadget::EVENT_LEN * 4];
    loop {
        let n = match ep0.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("reading ep0 events: {e}"),
        };
        for ev in gadget::parse_events(&buf[..n]) {
            match ev {
                Event::Setup(s) => setup(&sh, &mut ep0, &ctrl_rx, s)?,
                Event::Enable => {
                    say!("I: the host enabled the function");
                    sh.link
                        .send(Message::SetConfiguration { configuration: 1 })?;
                    if let Some(ep) = int_ep {
                        sh.link
                            .send(Message::StartInterruptReceiving { endpoint: ep })?;
                    }
                    sh.epoch.fetch_add(1, Ordering::SeqCst);
                    sh.enabled.store(true, Ordering::SeqCst);
                }
                Event::Disable => {
                    say!("I: the host disabled the function (reset or unplug)");
                    sh.enabled.store(false, Ordering::SeqCst);
                    if sh.plugged.load(Ordering::SeqCst) {
                        sh.link.send(Message::Reset)?;
                    }
                }
                Event::Bind | Event::Unbind | Event::Suspend | Event::Resume => {}
                Event::Unknown(t) => say!("W: unknown FunctionFS event {t}"),
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("E: {e:#}");
            ExitCode::from(2)
        }
    }
}

// The tests drive the gadget's transport with socketpairs, pipes, files
// and a temporary configfs tree in place of FunctionFS and /sys.
#[cfg(test)]
#[path = "ax88772-gadget/tests.rs"]
mod tests;
