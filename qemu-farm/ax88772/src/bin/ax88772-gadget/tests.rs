//! Unit tests of `ax88772-gadget` that need no FunctionFS, configfs mount
//! or USB device controller.
//!
//! This file holds the helpers and the tests of the arguments and `main`;
//! the tests by topic are in `tests/`.

use super::*;
use ax88772::gadget::Setup;
use ax88772::splice::Splice;
use std::cell::RefCell;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use usbredir::{BulkPacket, SmallDataPacket, Status};

use crate::configfs::*;
use crate::conn::*;
use crate::endpoints::*;
use crate::relay::*;

#[path = "tests/configfs.rs"]
mod configfs;
#[path = "tests/conn.rs"]
mod conn;
#[path = "tests/endpoints.rs"]
mod endpoints;
#[path = "tests/learn.rs"]
mod learn;
#[path = "tests/life.rs"]
mod life;
#[path = "tests/relay.rs"]
mod relay;
#[path = "tests/setup.rs"]
mod setup;

thread_local! {
    static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Every line `say!` printed, on any thread.
static ALL: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps a line `say!` printed on this thread.
pub(super) fn said(a: &std::fmt::Arguments) {
    LOG.with(|l| l.borrow_mut().push(a.to_string()));
    ALL.lock().unwrap().push(a.to_string());
}

/// Whether any thread printed a line containing `what`.
fn logged_anywhere(what: &str) -> bool {
    logged(&ALL.lock().unwrap(), what)
}

/// The lines `say!` printed on this thread since the last call.
fn log() -> Vec<String> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn logged(lines: &[String], what: &str) -> bool {
    lines.iter().any(|l| l.contains(what))
}

/// A bound for what the code under test does promptly; only reached
/// when it does not.
const PATIENCE: Duration = Duration::from_secs(10);

const INT_IN: Endpoint = Endpoint {
    address: 0x81,
    kind: ep_type::INTERRUPT,
    max_packet: 8,
    interval: 11,
};

const BULK_IN: Endpoint = Endpoint {
    address: 0x82,
    kind: ep_type::BULK,
    max_packet: 512,
    interval: 0,
};

const BULK_OUT: Endpoint = Endpoint {
    address: 0x03,
    kind: ep_type::BULK,
    max_packet: 512,
    interval: 0,
};

fn gadget_caps() -> Caps {
    Caps::XHCI_HOST.with(cap::DEVICE_DISCONNECT_ACK)
}

fn port(s: UnixStream) -> Conn {
    Conn::Port(File::from(OwnedFd::from(s)))
}

/// (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// A connected SOCK_SEQPACKET pair: each write is read back whole, alone.
fn records() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// The next record written to the other end of `f` (see [`records`]).
fn record(f: &mut File) -> Vec<u8> {
    let c = Conn::Port(f.try_clone().unwrap());
    assert!(readable(&c, PATIENCE).unwrap(), "no record came");
    let mut buf = vec![0u8; 256 * 1024];
    let n = f.read(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// `f` on another thread, failing the test if it does not return.
fn in_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PATIENCE).expect("the call did not return")
}

/// The next connection to `l`, failing the test if none comes.
fn accept_within(l: &TcpListener) -> TcpStream {
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("no connection came: {e}"),
        }
    }
}

/// A fresh directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "ax88772-gadget-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every path under `d`, sorted.
fn tree(d: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut todo = vec![d.to_path_buf()];
    while let Some(p) = todo.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let q = e.path();
            if q.is_dir() && !q.is_symlink() {
                todo.push(q.clone());
            }
            v.push(q);
        }
    }
    v.sort();
    v
}

/// A stream whose reads can time out.
trait Timed: Read + Write {
    fn read_timeout(&self, d: Duration);
}

impl Timed for UnixStream {
    fn read_timeout(&self, d: Duration) {
        self.set_read_timeout(Some(d)).unwrap();
    }
}

impl Timed for TcpStream {
    fn read_timeout(&self, d: Duration) {
        self.set_read_timeout(Some(d)).unwrap();
    }
}

/// The model's end of a usbredir connection (or, with `peer`, any end).
struct Model<S = UnixStream> {
    s: S,
    codec: Codec,
}

impl Model {
    fn new(s: UnixStream) -> Model {
        Model::peer(s, Role::Host, Caps(0xff))
    }
}

impl<S: Timed> Model<S> {
    fn peer(s: S, role: Role, caps: Caps) -> Model<S> {
        Model {
            s,
            codec: Codec::new(role, caps),
        }
    }

    fn hello(&mut self) {
        let mut out = Vec::new();
        self.codec.encode_hello("model", &mut out).unwrap();
        self.s.write_all(&out).unwrap();
    }

    fn send(&mut self, id: u64, msg: Message) {
        let mut out = Vec::new();
        self.codec.encode(&Packet::new(id, msg), &mut out).unwrap();
        self.s.write_all(&out).unwrap();
    }

    /// The gadget's next packet, if one comes within `wait`.
    fn try_next(&mut self, wait: Duration) -> Option<Packet> {
        let deadline = Instant::now() + wait;
        let mut buf = vec![0u8; 65536];
        loop {
            if let Some(p) = self.codec.next_packet() {
                return Some(p.expect("the gadget sent a valid packet"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.s.read_timeout(left);
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.codec.feed(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("reading the gadget's packets: {e}"),
            }
        }
    }

    fn next(&mut self) -> Packet {
        self.try_next(PATIENCE).expect("a packet from the gadget")
    }

    fn next_bulk(&mut self) -> BulkPacket {
        match self.next().msg {
            Message::BulkPacket(b) => b,
            m => panic!("expected a bulk packet, got {m:?}"),
        }
    }
}

/// A link whose hellos have been exchanged, the gadget's end of its
/// connection, and the model at the other end.
fn link_pair() -> (Link, Conn, Model) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut g = Codec::new(Role::Guest, gadget_caps());
    let mut m = Model::new(b);
    let (mut gh, mut mh) = (Vec::new(), Vec::new());
    g.encode_hello("gadget", &mut gh).unwrap();
    m.codec.encode_hello("model", &mut mh).unwrap();
    g.feed(&mh);
    m.codec.feed(&gh);
    for c in [&mut g, &mut m.codec] {
        match c.next_packet() {
            Some(Ok(Packet {
                msg: Message::Hello(_),
                ..
            })) => {}
            p => panic!("expected a hello, got {p:?}"),
        }
    }
    let conn = port(a);
    let link = Link {
        codec: Mutex::new(g),
        out: Mutex::new(conn.try_clone().unwrap()),
        next_id: AtomicU64::new(1),
    };
    (link, conn, m)
}

fn shared(link: Link, gadget: &Path) -> Arc<Shared> {
    Arc::new(Shared {
        link,
        epoch: AtomicU64::new(0),
        enabled: AtomicBool::new(true),
        plugged: AtomicBool::new(true),
        gadget: gadget.to_path_buf(),
        udc: "dummy_udc.0".into(),
        ended: Mutex::new(false),
    })
}

fn bulk(ep: u8, status: Status, data: &[u8]) -> ToPump {
    ToPump::Bulk(BulkPacket {
        endpoint: ep,
        status,
        length: data.len() as u32,
        data: data.to_vec(),
        ..Default::default()
    })
}

fn interrupt(status: Status, data: &[u8]) -> ToPump {
    ToPump::Interrupt(SmallDataPacket {
        endpoint: INT_IN.address,
        status,
        length: data.len() as u16,
        data: data.to_vec(),
    })
}

/// An address nothing listens on (a port just released).
fn refused_addr() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn sample_identity() -> (DeviceConnect, InterfaceInfo, EpInfo) {
    let connect = DeviceConnect {
        speed: usbredir::proto::speed::HIGH,
        device_class: 0xff,
        device_subclass: 0xff,
        device_protocol: 0,
        vendor_id: 0x0b95,
        product_id: 0x772a,
        device_version_bcd: 0x0001,
    };
    let mut iface = InterfaceInfo {
        interface_count: 1,
        ..Default::default()
    };
    iface.interface_class[0] = 0xff;
    let mut eps = EpInfo::default();
    for (a, kind, mps) in [
        (0x81u8, ep_type::INTERRUPT, 8u16),
        (0x82, ep_type::BULK, 512),
        (0x03, ep_type::BULK, 512),
    ] {
        let i = usbredir::ep_index(a);
        eps.ep_type[i] = kind;
        eps.max_packet_size[i] = mps;
    }
    (connect, iface, eps)
}

fn args(extra: &[&str]) -> Args {
    let mut v = vec!["ax88772-gadget", "--model", "127.0.0.1:1"];
    v.extend(extra);
    Args::try_parse_from(v).unwrap()
}

#[test]
fn numeric_options_are_bounded_and_named_when_refused() {
    for (opt, max) in [
        ("--connect-timeout", MAX_CONNECT_TIMEOUT_S),
        ("--bulk-in-len", u64::from(MAX_BULK_IN_LEN)),
        ("--in-flight", MAX_IN_FLIGHT as u64),
    ] {
        let ok = max.to_string();
        let parse = |v: &str| {
            Args::try_parse_from(["ax88772-gadget", "--model", "h:1", opt, v])
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(parse(&ok).is_ok(), "{opt} {ok}");
        for bad in [(max + 1).to_string(), u64::MAX.to_string(), "0x10".into()] {
            let e = parse(&bad).unwrap_err();
            assert!(e.contains(opt), "{e}");
        }
        assert!(parse(&(max + 1).to_string())
            .unwrap_err()
            .contains(&format!("..={max}")));
    }
    assert!(
        Args::try_parse_from(["ax88772-gadget", "--model", "h:1", "--in-flight", "0"]).is_err()
    );
}

/// Set for the child process `main_reports_bad_arguments` starts.
const RUN_MAIN: &str = "AX88772_GADGET_TEST_RUN_MAIN";

#[test]
fn main_in_a_child() {
    if std::env::var_os(RUN_MAIN).is_none() {
        return;
    }
    // The arguments are the test harness's: main exits with a usage error.
    let code = main();
    panic!("main returned {code:?}");
}

#[test]
fn main_reports_bad_arguments() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "tests::main_in_a_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RUN_MAIN, "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--model <HOST:PORT|port:NAME>"), "{err}");
}
