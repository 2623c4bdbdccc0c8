//! Unit tests of `ax88772-gadget` that need no FunctionFS, configfs mount
//! or USB device controller.

use super::*;
use std::cell::RefCell;
use std::net::TcpListener;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use usbredir::Status;

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

fn string_descriptor(s: &str) -> Vec<u8> {
    let mut d = vec![0, 3];
    for u in s.encode_utf16() {
        d.extend(u.to_le_bytes());
    }
    d[0] = d.len() as u8;
    d
}

#[test]
fn a_conn_polls_its_own_descriptor() {
    let (a, _b) = UnixStream::pair().unwrap();
    let fd = a.as_raw_fd();
    assert_eq!(port(a).fd(), fd);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let t = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let fd = t.as_raw_fd();
    assert_eq!(Conn::Tcp(t).fd(), fd);
}

#[test]
fn a_conn_reads_and_writes_its_stream() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let mut c = port(a);
    let mut c2 = c.try_clone().unwrap();
    c.write_all(b"to the model").unwrap();
    c.flush().unwrap();
    let mut got = [0u8; 12];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"to the model");
    b.write_all(b"back").unwrap();
    let mut got = [0u8; 4];
    c2.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"back");
}

#[test]
fn readable_says_whether_data_waits() {
    let (a, mut b) = UnixStream::pair().unwrap();
    let c = port(a);
    assert!(!readable(&c, Duration::ZERO).unwrap());
    assert!(!readable(&c, Duration::from_millis(10)).unwrap());
    b.write_all(b"x").unwrap();
    assert!(readable(&c, PATIENCE).unwrap());
}

#[test]
fn readable_reports_a_hang_up_as_readable() {
    let (a, b) = UnixStream::pair().unwrap();
    let c = port(a);
    drop(b);
    assert!(readable(&c, PATIENCE).unwrap());
}

/// `ports` (the sysfs class) with the ports `(dir, name file)`, and `dev`
/// with one regular file per port holding its directory name.
fn virtio_ports(t: &TempDir, list: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let (ports, dev) = (t.0.join("class"), t.0.join("dev"));
    std::fs::create_dir_all(&dev).unwrap();
    for (d, name) in list {
        std::fs::create_dir_all(ports.join(d)).unwrap();
        std::fs::write(ports.join(d).join("name"), name).unwrap();
        std::fs::write(dev.join(d), d).unwrap();
    }
    (ports, dev)
}

#[test]
fn open_port_opens_the_port_with_that_name() {
    let t = TempDir::new("ports");
    let (ports, dev) = virtio_ports(
        &t,
        &[("vport1p1", "other\n"), ("vport1p2", "ax88772.usb\n")],
    );
    let mut f = open_port_in(&ports, &dev, "ax88772.usb", Duration::ZERO).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "vport1p2");
    f.write_all(b"!").unwrap();
}

#[test]
fn open_port_gives_up_after_its_timeout() {
    let t = TempDir::new("noport");
    let (ports, dev) = virtio_ports(&t, &[("vport1p1", "other")]);
    let e = in_thread(move || {
        open_port_in(&ports, &dev, "missing", Duration::from_millis(100)).map(|_| ())
    })
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("no virtio-serial port named missing in"),
        "{e}"
    );
    let (ports, dev) = (t.0.join("absent"), t.0.join("dev"));
    let e = in_thread(move || open_port_in(&ports, &dev, "any", Duration::ZERO).map(|_| ()))
        .unwrap_err();
    assert!(
        e.to_string().contains("no virtio-serial port named any"),
        "{e}"
    );
}

#[test]
fn open_port_waits_for_the_port_to_appear() {
    let t = TempDir::new("lateport");
    let (ports, dev) = virtio_ports(&t, &[]);
    let (p2, d2) = (ports.clone(), dev.clone());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(open_port_in(&p2, &d2, "late", PATIENCE).map(|_| ()));
    });
    // Some scans find nothing first.
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(dev.join("vport2p1"), "").unwrap();
    std::fs::create_dir_all(ports.join("vport2p1")).unwrap();
    std::fs::write(ports.join("vport2p1").join("name"), "late").unwrap();
    rx.recv_timeout(PATIENCE * 2)
        .expect("open_port returns")
        .unwrap();
}

/// An address nothing listens on (a port just released).
fn refused_addr() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[test]
fn connect_reaches_a_listening_model() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    match connect(&l.local_addr().unwrap().to_string(), Duration::ZERO).unwrap() {
        Conn::Tcp(s) => assert!(s.nodelay().unwrap()),
        Conn::Port(_) => panic!("a TCP address gave a port"),
    }
}

#[test]
fn connect_with_no_time_left_tries_once() {
    let addr = refused_addr().to_string();
    let t0 = Instant::now();
    // The clock stands still: the deadline is now.
    let e =
        in_thread(move || connect_by(&addr, Duration::ZERO, move || t0).map(|_| ())).unwrap_err();
    assert!(
        e.to_string().contains("cannot connect to the model at"),
        "{e}"
    );
}

#[test]
fn connect_retries_until_its_deadline() {
    let addr = refused_addr().to_string();
    let t0 = Instant::now();
    let reads = Arc::new(AtomicU64::new(0));
    let r = reads.clone();
    // Each reading of the clock is 100 ms after the last.
    let clock = move || t0 + Duration::from_millis(100) * r.fetch_add(1, Ordering::SeqCst) as u32;
    let e = in_thread(move || connect_by(&addr, Duration::from_millis(250), clock).map(|_| ()))
        .unwrap_err();
    assert!(e.to_string().contains("cannot connect"), "{e}");
    // The deadline, then one reading per refused attempt: at 100 and
    // 200 ms it tries again, at 300 ms it gives up.
    assert_eq!(reads.load(Ordering::SeqCst), 4);
}

#[test]
fn connect_retries_until_the_model_listens() {
    let addr = refused_addr();
    let reads = Arc::new(AtomicU64::new(0));
    let listener = Arc::new(Mutex::new(None));
    let (r, l) = (reads.clone(), listener.clone());
    let t0 = Instant::now();
    // The clock is read for the deadline, then after each refused
    // attempt: the model starts listening after the first one.
    let clock = move || {
        if r.fetch_add(1, Ordering::SeqCst) == 1 {
            *l.lock().unwrap() = Some(TcpListener::bind(addr).unwrap());
        }
        t0
    };
    let a = addr.to_string();
    let c = in_thread(move || connect_by(&a, PATIENCE, clock)).unwrap();
    assert!(matches!(c, Conn::Tcp(_)));
    assert_eq!(reads.load(Ordering::SeqCst), 2);
    assert!(listener.lock().unwrap().is_some());
}

#[test]
fn connect_to_port_looks_for_a_virtio_serial_port() {
    let e = in_thread(|| connect("port:phyfarm-test-no-such-port", Duration::ZERO).map(|_| ()))
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "no virtio-serial port named phyfarm-test-no-such-port in /sys/class/virtio-ports"
        ),
        "{e}"
    );
}

fn next_msg<S: Timed>(m: &mut Model<S>) -> Message {
    m.next().msg
}

/// What an exporter session (usbredirect) reads first: QEMU's hello.
fn qemu_hello_read_by<S: Timed>(m: &mut Model<S>) -> usbredir::Hello {
    match next_msg(m) {
        Message::Hello(h) => h,
        other => panic!("expected QEMU's hello, got {other:?}"),
    }
}

fn device_connect() -> Message {
    Message::DeviceConnect(sample_identity().0)
}

#[test]
fn the_relay_splices_each_usbredirect_session_into_qemus_one() {
    let (qemu_end, relay_end) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let caps = gadget_caps();
    let mut qemu = Model::peer(qemu_end, Role::Guest, caps);
    let relay_addr = addr.clone();
    let (ended, relay) = mpsc::channel();
    std::thread::spawn(move || ended.send(relay_on(port(relay_end), &relay_addr, PATIENCE)));
    qemu.hello();

    // The first session: both hellos pass, and everything after them.
    let s1 = accept_within(&listener);
    let mut one = Model::peer(s1, Role::Host, caps);
    assert_eq!(qemu_hello_read_by(&mut one).caps, caps);
    one.hello();
    one.send(0, device_connect());
    assert!(matches!(next_msg(&mut qemu), Message::Hello(h) if h.caps == caps));
    assert_eq!(next_msg(&mut qemu), device_connect());
    qemu.send(5, Message::SetConfiguration { configuration: 1 });
    let p = one.next();
    assert_eq!(
        (p.id, p.msg),
        (5, Message::SetConfiguration { configuration: 1 })
    );

    // usbredirect ends (its device went away): QEMU hears of it, and its
    // acknowledgement goes nowhere.
    drop(one);
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    qemu.send(0, Message::DeviceDisconnectAck);

    // The next usbredirect gets QEMU's hello; its own goes no further.
    let s2 = accept_within(&listener);
    let mut two = Model::peer(s2, Role::Host, caps);
    assert_eq!(qemu_hello_read_by(&mut two).caps, caps);
    two.hello();
    two.send(0, device_connect());
    assert_eq!(next_msg(&mut qemu), device_connect());
    qemu.send(9, Message::Reset);
    let p = two.next();
    assert_eq!(
        (p.id, p.msg),
        (9, Message::Reset),
        "the ack was not passed on"
    );
    assert!(logged_anywhere(
        "usbredirect session 1 ended (closed); QEMU was told the device went away"
    ));
    assert!(logged_anywhere("usbredirect session 2 at"));

    // QEMU going away ends the relay.
    drop(qemu);
    let r = relay.recv_timeout(PATIENCE).expect("the relay ended");
    assert!(r.is_ok(), "{r:?}");
    assert!(logged_anywhere("QEMU closed the port"));
}

/// What `exporter_sessions` starts from: QEMU's end of the port (its
/// hello already read by the relay), the relay's end, the relay's state,
/// and a listener standing in for usbredirect, with its address.
fn relay_after_qemus_hello() -> (Model, UnixStream, Mutex<Relay>, TcpListener, String) {
    let (qemu_end, relay_end) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let qemu = Model::peer(qemu_end, Role::Guest, gadget_caps());
    let sh = Mutex::new(Relay {
        splice: Splice::default(),
        to_exporter: None,
    });
    let mut hello = Vec::new();
    Codec::new(Role::Guest, gadget_caps())
        .encode_hello("qemu", &mut hello)
        .unwrap();
    sh.lock().unwrap().splice.from_qemu(hello).unwrap();
    (qemu, relay_end, sh, listener, addr)
}

#[test]
fn the_relay_refuses_a_usbredirect_with_other_capabilities() {
    let (mut qemu, relay_end, sh, listener, addr) = relay_after_qemus_hello();
    let exporter = std::thread::spawn(move || {
        for caps in [gadget_caps(), Caps::XHCI_HOST] {
            let s = accept_within(&listener);
            let mut e = Model::peer(s, Role::Host, caps);
            qemu_hello_read_by(&mut e);
            e.hello();
            e.send(0, device_connect());
            if caps != gadget_caps() {
                // Kept open: the relay must end it, not wait.
                return e;
            }
        }
        unreachable!()
    });
    let err = exporter_sessions(&sh, &addr, port(relay_end), PATIENCE).unwrap_err();
    assert!(
        format!("{err:#}").contains("new session offers capabilities"),
        "{err:#}"
    );
    // What QEMU heard: the first hello, the device, its going away, and
    // nothing of the second session.
    assert!(matches!(next_msg(&mut qemu), Message::Hello(_)));
    assert_eq!(next_msg(&mut qemu), device_connect());
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    assert!(qemu.try_next(Duration::from_millis(200)).is_none());
    drop(exporter.join().unwrap());
}

#[test]
fn the_relay_ends_on_a_port_that_fails_to_read() {
    let t = TempDir::new("relayport");
    // A directory: every read fails (EISDIR), again and again.
    let port = Conn::Port(File::open(&t.0).unwrap());
    let r = in_thread(move || relay_on(port, "127.0.0.1:1", Duration::from_millis(100)));
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("relay: reading the port"), "{e}");
}

#[test]
fn a_usbredirect_session_reset_by_its_peer_ends_with_that_reason() {
    let (mut qemu, relay_end, sh, listener, addr) = relay_after_qemus_hello();
    let (up, device_up) = mpsc::channel();
    let exporter = std::thread::spawn(move || {
        // The first session is reset (RST, not FIN) once QEMU has the device.
        let s = accept_within(&listener);
        let mut e = Model::peer(s, Role::Host, gadget_caps());
        qemu_hello_read_by(&mut e);
        e.hello();
        e.send(0, device_connect());
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a linger of the size given.
        let rc = unsafe {
            libc::setsockopt(
                e.s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        device_up.recv_timeout(PATIENCE).unwrap();
        drop(e);
        // The second offers other capabilities: the relay ends there.
        let s = accept_within(&listener);
        let mut e = Model::peer(s, Role::Host, Caps::XHCI_HOST);
        qemu_hello_read_by(&mut e);
        e.hello();
        e.send(0, device_connect());
        e
    });
    let relay =
        std::thread::spawn(move || exporter_sessions(&sh, &addr, port(relay_end), PATIENCE));
    assert!(matches!(next_msg(&mut qemu), Message::Hello(_)));
    assert_eq!(next_msg(&mut qemu), device_connect());
    up.send(()).unwrap();
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    let err = in_thread(move || relay.join().unwrap()).unwrap_err();
    assert!(
        format!("{err:#}").contains("new session offers capabilities"),
        "{err:#}"
    );
    assert!(logged_anywhere(
        "usbredirect session 1 ended (Connection reset by peer"
    ));
    drop(exporter.join().unwrap());
}

#[test]
fn the_first_usbredirect_is_waited_for_within_its_limit_only() {
    let addr = refused_addr().to_string();
    let t = Instant::now();
    let a = addr.clone();
    let e = in_thread(move || connect_exporter(&a, Some(Duration::from_millis(200)))).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(
        format!("{e:#}").contains(&format!("cannot connect to {addr}")),
        "{e:#}"
    );
    // Without a limit it waits for the listener.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let waiter = std::thread::spawn(move || connect_exporter(&addr.to_string(), None));
    std::thread::sleep(Duration::from_millis(300));
    let l = TcpListener::bind(addr).unwrap();
    let _s = accept_within(&l);
    assert!(waiter.join().unwrap().is_ok());
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

/// The gadget's side before `learn`: hello sent, as `run` does.
fn gadget_side(a: UnixStream) -> (Conn, Link) {
    let mut s = port(a);
    let link = Link {
        codec: Mutex::new(Codec::new(Role::Guest, gadget_caps())),
        out: Mutex::new(s.try_clone().unwrap()),
        next_id: AtomicU64::new(1),
    };
    let mut hello = Vec::new();
    link.codec
        .lock()
        .unwrap()
        .encode_hello("ax88772-gadget", &mut hello)
        .unwrap();
    s.write_all(&hello).unwrap();
    (s, link)
}

#[test]
fn learn_gathers_the_models_identity_and_strings() {
    let (a, b) = UnixStream::pair().unwrap();
    let (connect, iface, eps) = sample_identity();
    let (i2, e2) = (iface.clone(), eps.clone());
    let model = std::thread::spawn(move || {
        let mut m = Model::new(b);
        assert!(matches!(m.next().msg, Message::Hello(_)));
        m.hello();
        m.send(
            0,
            Message::ConfigurationStatus {
                status: Status::SUCCESS,
                configuration: 0,
            },
        );
        m.send(0, Message::EpInfo(Box::new(e2)));
        m.send(0, Message::InterfaceInfo(Box::new(i2)));
        m.send(0, Message::DeviceConnect(connect));
        let mut asked = Vec::new();
        for _ in 0..3 {
            let p = m.next();
            let Message::ControlPacket(c) = p.msg else {
                panic!("expected a control packet, got {:?}", p.msg);
            };
            asked.push((c.endpoint, c.request, c.requesttype, c.value, c.index));
            assert_eq!((c.length, c.data.len()), (255, 0));
            // An answer to another request first.
            let decoy = string_descriptor("decoy");
            m.send(
                p.id + 1000,
                Message::ControlPacket(ControlPacket {
                    length: decoy.len() as u16,
                    data: decoy,
                    ..c.clone()
                }),
            );
            let text = match c.value {
                0x0301 => Some("ASIX Elec. Corp.\n"),
                0x0302 => Some("AX88772A"),
                _ => None,
            };
            let reply = match text {
                Some(t) => {
                    let d = string_descriptor(t);
                    ControlPacket {
                        length: d.len() as u16,
                        data: d,
                        ..c
                    }
                }
                None => ControlPacket {
                    status: Status::STALL,
                    length: 0,
                    ..c
                },
            };
            m.send(p.id, Message::ControlPacket(reply));
        }
        asked
    });
    let (mut s, link) = gadget_side(a);
    let id = learn(&mut s, &link).unwrap();
    assert_eq!(id.connect, connect);
    assert_eq!(id.iface, iface);
    assert_eq!(id.eps, eps);
    assert_eq!(
        id.strings,
        [
            "ASIX Elec. Corp.".to_string(),
            "AX88772A".into(),
            String::new()
        ]
    );
    let asked = model.join().unwrap();
    assert_eq!(
        asked,
        [
            (0x80, 6, 0x80, 0x0301, 0x0409),
            (0x80, 6, 0x80, 0x0302, 0x0409),
            (0x80, 6, 0x80, 0x0303, 0x0409),
        ]
    );
}

#[test]
fn learn_fails_when_the_model_hangs_up_early() {
    let (a, b) = UnixStream::pair().unwrap();
    let model = std::thread::spawn(move || {
        let mut m = Model::new(b);
        m.next();
        m.hello();
        m.send(0, Message::DeviceConnect(sample_identity().0));
    });
    let (mut s, link) = gadget_side(a);
    let e = learn(&mut s, &link).err().unwrap();
    assert!(
        e.to_string()
            .contains("closed the connection before announcing"),
        "{e}"
    );
    model.join().unwrap();
}

#[test]
fn learn_fails_on_a_bad_packet() {
    let (a, mut b) = UnixStream::pair().unwrap();
    // A device_connect header before any hello.
    b.write_all(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let (mut s, link) = gadget_side(a);
    let e = learn(&mut s, &link).err().unwrap();
    assert!(e.to_string().contains("bad packet"), "{e}");
}

#[test]
fn read_until_gives_up_at_its_deadline() {
    let (link, mut s, m) = link_pair();
    let e = in_thread(move || {
        let _m = m;
        let deadline = Instant::now() + Duration::from_millis(20);
        read_until(&mut s, &link, deadline, |_| false).map_err(|e| e.to_string())
    })
    .unwrap_err();
    assert!(e.to_string().contains("in time"), "{e}");
}

#[test]
fn learn_reads_the_ax88772_models_identity() {
    use ax88772::descriptors::{Variant, VENDOR_ASIX};
    use ax88772::device::{Device, DeviceConfig};
    use ax88772::server::{OnDisconnect, Server, UsbRole};

    let (a, b) = UnixStream::pair().unwrap();
    let (wire, handle) = ax88772::wire::mock::pair();
    let cfg = DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0xaa, 0xbb, 0xcc]);
    let mut server = Server::new(
        Device::new(cfg, Instant::now()),
        Box::new(wire),
        UsbRole::Connected,
        OnDisconnect::Exit,
        None,
    )
    .unwrap();
    server.attach(ax88772::net::Conn::Unix(b));
    let model = std::thread::spawn(move || server.run().map_err(|e| e.to_string()));
    let (mut s, link) = gadget_side(a);
    let id = learn(&mut s, &link).unwrap();
    assert_eq!(id.connect.vendor_id, VENDOR_ASIX);
    assert_eq!(id.iface.interface_count, 1);
    let eps = gadget::endpoints(&id.eps).unwrap();
    assert_eq!(
        eps.iter().map(|e| e.address).collect::<Vec<_>>(),
        [0x81, 0x82, 0x03]
    );
    assert!(gadget::descriptors(&id.iface, &eps).is_ok());
    assert!(!id.strings[0].is_empty() && !id.strings[1].is_empty());
    drop((s, link));
    in_thread(move || model.join().unwrap()).unwrap();
    drop(handle);
}

fn args(extra: &[&str]) -> Args {
    let mut v = vec!["ax88772-gadget", "--model", "127.0.0.1:1"];
    v.extend(extra);
    Args::try_parse_from(v).unwrap()
}

#[test]
fn make_gadget_writes_the_models_identity_to_configfs() {
    let t = TempDir::new("configfs");
    let a = args(&["--configfs", t.0.to_str().unwrap()]);
    let (connect, iface, eps) = sample_identity();
    let id = Identity {
        connect,
        iface,
        eps,
        strings: ["ASIX".into(), "AX88772A".into(), "0001".into()],
    };
    let mut made = Made::default();
    let g = make_gadget(&a, &id, &mut made).unwrap();
    assert_eq!(g, t.0.join("usb_gadget/ax88772"));
    let attr = |p: &str| std::fs::read_to_string(g.join(p)).unwrap();
    assert_eq!(attr("idVendor"), "0x0b95");
    assert_eq!(attr("idProduct"), "0x772a");
    assert_eq!(attr("bcdDevice"), "0x0001");
    assert_eq!(attr("bcdUSB"), "0x0200");
    assert_eq!(attr("bDeviceClass"), "0xff");
    assert_eq!(attr("bDeviceSubClass"), "0xff");
    assert_eq!(attr("bDeviceProtocol"), "0x00");
    assert_eq!(attr("strings/0x409/manufacturer"), "ASIX");
    assert_eq!(attr("strings/0x409/product"), "AX88772A");
    assert_eq!(attr("strings/0x409/serialnumber"), "0001");
    assert_eq!(attr("configs/c.1/MaxPower"), "250");
    assert!(g.join("functions/ffs.ax88772").is_dir());
    let e = make_gadget(&a, &id, &mut Made::default()).unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    assert!(g.is_dir(), "a refused start takes nothing of another's");
}

fn sample() -> Identity {
    let (connect, iface, eps) = sample_identity();
    Identity {
        connect,
        iface,
        eps,
        strings: ["ASIX".into(), "AX88772A".into(), "0001".into()],
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

#[test]
fn a_failed_functionfs_mount_takes_back_the_gadget_tree_and_reports_the_mount() {
    let t = TempDir::new("cleanup-mount");
    // configfs has usb_gadget of its own: it stays.
    std::fs::create_dir(t.0.join("usb_gadget")).unwrap();
    std::fs::write(t.0.join("keep"), "x").unwrap();
    let before = tree(&t.0);
    let ffs = t.0.join("dev/ffs-ax88772");
    let a = args(&[
        "--configfs",
        t.0.to_str().unwrap(),
        "--ffs",
        ffs.to_str().unwrap(),
    ]);
    let d =
        gadget::descriptors(&sample().iface, &gadget::endpoints(&sample().eps).unwrap()).unwrap();
    let mut made = Made::default();
    let e = build(&a, &sample(), &d, &mut made, |p| {
        assert!(p.is_dir(), "the mount point is made first");
        bail!(
            "mounting functionfs {NAME} on {}: no such device",
            p.display()
        )
    })
    .unwrap_err();
    assert!(
        !made.steps.is_empty(),
        "the tree was built before the mount"
    );
    made.undo();
    assert!(e.to_string().starts_with("mounting functionfs"), "{e}");
    assert_eq!(tree(&t.0), before, "everything made is gone, nothing else");
    assert!(made.steps.is_empty());
}

#[test]
fn a_failure_after_the_mount_also_unmounts_last_first() {
    let t = TempDir::new("cleanup-ep0");
    let before = tree(&t.0);
    let ffs = t.0.join("ffs");
    let a = args(&[
        "--configfs",
        t.0.to_str().unwrap(),
        "--ffs",
        ffs.to_str().unwrap(),
    ]);
    static UNMOUNTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut made = Made {
        unmount: |p| {
            // The function's tree still exists when FunctionFS goes.
            assert!(p.parent().unwrap().join("usb_gadget/ax88772").is_dir());
            UNMOUNTED.lock().unwrap().push(p.to_path_buf());
            Ok(())
        },
        ..Made::default()
    };
    // The "mount" leaves no ep0 behind: opening it fails.
    let e = build(&a, &sample(), &[], &mut made, |_| Ok(())).unwrap_err();
    assert_eq!(e.to_string(), "opening ep0");
    assert_eq!(made.steps.last(), Some(&Step::Mount(ffs.clone())));
    made.undo();
    assert_eq!(*UNMOUNTED.lock().unwrap(), [ffs]);
    assert_eq!(tree(&t.0), before);
}

#[test]
fn undo_keeps_going_past_what_it_cannot_remove() {
    let t = TempDir::new("cleanup-partial");
    let d = t.0.join("a");
    let mut made = Made::default();
    made.mkdir(&d.join("b")).unwrap();
    made.write_attr(&d, "attr", "1").unwrap();
    // Something the gadget did not make keeps `b` from going.
    std::fs::write(d.join("b/foreign"), "x").unwrap();
    made.undo();
    assert!(!d.join("attr").exists(), "later steps were taken back");
    assert!(d.join("b/foreign").exists(), "nothing foreign is removed");
    assert!(logged(&log(), "W: cleaning up: removing"));
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

#[test]
fn first_udc_is_the_first_controller_by_name() {
    let t = TempDir::new("udc");
    for n in ["musb-hdrc.1", "dummy_udc.1", "dummy_udc.0"] {
        std::fs::create_dir(t.0.join(n)).unwrap();
    }
    assert_eq!(first_udc(&t.0).unwrap(), "dummy_udc.0");
}

#[test]
fn first_udc_fails_without_a_controller() {
    let t = TempDir::new("noudc");
    let e = first_udc(&t.0).unwrap_err();
    assert!(e.to_string().contains("no USB device controller in"), "{e}");
    let e = first_udc(&t.0.join("absent")).unwrap_err();
    assert!(e.to_string().contains("(no USB device controller?)"), "{e}");
}

#[test]
fn route_hands_each_packet_to_its_taker() {
    let (link, _s, _m) = link_pair();
    let t = TempDir::new("route");
    let sh = shared(link, &t.0);
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let (bulk_tx, bulk_rx) = mpsc::sync_channel(4);
    let (int_tx, int_rx) = mpsc::sync_channel(1);
    let pumps = HashMap::from([(0x82, bulk_tx), (0x81, int_tx)]);
    let control = Message::ControlPacket(ControlPacket {
        request: 9,
        ..Default::default()
    });
    route(&sh, &ctrl_tx, &pumps, Packet::new(5, control));
    assert_eq!(ctrl_rx.try_recv().unwrap().id, 5);
    for ep in [0x82, 0x83] {
        let b = BulkPacket {
            endpoint: ep,
            data: vec![ep],
            ..Default::default()
        };
        route(
            &sh,
            &ctrl_tx,
            &pumps,
            Packet::new(6, Message::BulkPacket(b)),
        );
    }
    match bulk_rx.try_recv().unwrap() {
        ToPump::Bulk(b) => assert_eq!(b.data, [0x82]),
        ToPump::Interrupt(_) => panic!("a bulk packet became an interrupt one"),
    }
    assert!(bulk_rx.try_recv().is_err());
    // The interrupt pump holds one: a second is dropped, not waited on.
    for d in [1, 2] {
        let i = SmallDataPacket {
            endpoint: 0x81,
            data: vec![d],
            ..Default::default()
        };
        route(
            &sh,
            &ctrl_tx,
            &pumps,
            Packet::new(7, Message::InterruptPacket(i)),
        );
    }
    match int_rx.try_recv().unwrap() {
        ToPump::Interrupt(i) => assert_eq!(i.data, [1]),
        ToPump::Bulk(_) => panic!("an interrupt packet became a bulk one"),
    }
    assert!(int_rx.try_recv().is_err());
    assert!(ctrl_rx.try_recv().is_err());
    assert!(!t.0.join("UDC").exists());
}

#[test]
fn the_models_unplug_and_plug_unbind_and_bind_the_gadget() {
    let (link, _s, mut m) = link_pair();
    let t = TempDir::new("bind");
    let sh = shared(link, &t.0);
    let (ctrl_tx, _ctrl_rx) = mpsc::channel();
    let pumps = HashMap::new();
    let udc = t.0.join("UDC");
    let connect = || Packet::new(0, Message::DeviceConnect(sample_identity().0));
    // Plugged already: nothing to do.
    route(&sh, &ctrl_tx, &pumps, connect());
    assert!(!udc.exists());
    assert!(sh.plugged.load(Ordering::SeqCst));

    route(
        &sh,
        &ctrl_tx,
        &pumps,
        Packet::new(0, Message::DeviceDisconnect),
    );
    assert!(!sh.plugged.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&udc).unwrap(), "\n");
    assert!(matches!(m.next().msg, Message::DeviceDisconnectAck));
    assert!(logged(&log(), "I: gadget unbound"));

    route(&sh, &ctrl_tx, &pumps, connect());
    assert!(sh.plugged.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&udc).unwrap(), "dummy_udc.0");
    assert!(logged(&log(), "I: gadget bound"));
}

#[test]
fn a_failed_bind_is_reported() {
    let (link, _s, _m) = link_pair();
    let t = TempDir::new("nobind");
    let sh = shared(link, &t.0.join("absent"));
    log();
    sh.bind(true);
    let l = log();
    assert!(logged(&l, "W: writing \"dummy_udc.0\" to"), "{l:?}");
}

#[test]
fn reader_decodes_the_models_stream() {
    let (link, s, mut m) = link_pair();
    let t = TempDir::new("reader");
    let sh = shared(link, &t.0);
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let (bulk_tx, bulk_rx) = mpsc::sync_channel(4);
    let pumps = HashMap::from([(0x82, bulk_tx)]);
    {
        let sh = sh.clone();
        std::thread::spawn(move || reader(s, sh, ctrl_tx, pumps));
    }
    let control = ControlPacket {
        endpoint: 0x80,
        requesttype: 0xc0,
        request: 7,
        length: 2,
        data: vec![1, 2],
        ..Default::default()
    };
    m.send(42, Message::ControlPacket(control.clone()));
    let data = vec![0x55; 3000];
    m.send(
        43,
        Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: data.len() as u32,
            data: data.clone(),
            ..Default::default()
        }),
    );
    m.send(44, Message::DeviceDisconnect);
    let p = ctrl_rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!(p, Packet::new(42, Message::ControlPacket(control)));
    match bulk_rx.recv_timeout(PATIENCE).unwrap() {
        ToPump::Bulk(b) => assert_eq!(b.data, data),
        ToPump::Interrupt(_) => panic!("a bulk packet became an interrupt one"),
    }
    assert!(matches!(m.next().msg, Message::DeviceDisconnectAck));
    assert!(!sh.plugged.load(Ordering::SeqCst));
    // The unbind follows the acknowledgement.
    let deadline = Instant::now() + PATIENCE;
    while std::fs::read_to_string(t.0.join("UDC")).ok().as_deref() != Some("\n") {
        assert!(Instant::now() < deadline, "the gadget was not unbound");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The reader ends the process when the model hangs up: the model's
    // end stays open for the rest of the test run.
    std::mem::forget(m);
}

#[test]
fn bulk_in_writes_what_the_model_returned_in_one_go() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    tx.send(bulk(0x82, Status::SUCCESS, &[b'a'; 1000])).unwrap();
    tx.send(bulk(0x82, Status::STALL, &[b'x'; 10])).unwrap();
    tx.send(bulk(0x82, Status::SUCCESS, &[b'b'; 1000])).unwrap();
    tx.send(bulk(0x82, Status::SUCCESS, &[b'c'; 1000])).unwrap();
    let (mut host, file) = records();
    let pump = std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (2048, 2)));
    for _ in 0..2 {
        let b = m.next_bulk();
        assert_eq!((b.endpoint, b.length, b.data.len()), (0x82, 2048, 0));
    }
    let got = record(&mut host);
    assert_eq!(got, [[b'a'; 1000], [b'b'; 1000], [b'c'; 1000]].concat());
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_writes_at_most_coalesce_and_one_transfer_at_once() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    for b in [1u8, 2, 3] {
        tx.send(bulk(0x82, Status::SUCCESS, &vec![b; COALESCE / 2]))
            .unwrap();
    }
    let (mut host, file) = records();
    let pump = std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (16384, 4)));
    assert_eq!(
        record(&mut host),
        [vec![1u8; COALESCE / 2], vec![2u8; COALESCE / 2]].concat()
    );
    assert_eq!(record(&mut host), vec![3u8; COALESCE / 2]);
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_asks_again_when_the_host_enables_anew() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    sh.enabled.store(false, Ordering::SeqCst);
    let (tx, rx) = mpsc::sync_channel(64);
    let (_host, file) = records();
    let pump = {
        let sh = sh.clone();
        std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (512, 2)))
    };
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    sh.enabled.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(m.next_bulk().length, 512);
    }
    // Two in flight, none answered: nothing more is asked.
    assert!(m.try_next(Duration::from_millis(300)).is_none());
    // Enabled again (a reset): what was asked before is forgotten.
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(m.next_bulk().length, 512);
    }
    assert!(m.try_next(Duration::from_millis(300)).is_none());
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_reports_a_failed_write() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    tx.send(bulk(0x82, Status::SUCCESS, &[1])).unwrap();
    drop(tx);
    let (host, file) = records();
    drop(host);
    // On a thread of its own, which gives back what it logged.
    let l = in_thread(move || {
        bulk_in(sh, BULK_IN, file, rx, (512, 1));
        log()
    });
    assert!(logged(&l, "W: ep 0x82:"), "{l:?}");
}

#[test]
fn is_gone_knows_the_errors_of_a_disabled_or_gone_function() {
    for e in [libc::ESHUTDOWN, libc::EIO, libc::ENODEV, libc::EINTR] {
        assert!(is_gone(&std::io::Error::from_raw_os_error(e)), "{e}");
    }
    for e in [libc::EPIPE, libc::EBADF, libc::EAGAIN] {
        assert!(!is_gone(&std::io::Error::from_raw_os_error(e)), "{e}");
    }
}

#[test]
fn interrupt_in_writes_only_successful_data() {
    let (mut host, file) = pipe();
    let (tx, rx) = mpsc::sync_channel(8);
    tx.send(interrupt(Status::STALL, &[1, 2])).unwrap();
    tx.send(interrupt(Status::SUCCESS, &[])).unwrap();
    tx.send(bulk(0x81, Status::SUCCESS, &[3])).unwrap();
    tx.send(interrupt(Status::SUCCESS, &[0xa1, 0x00, 0x01]))
        .unwrap();
    drop(tx);
    interrupt_in(INT_IN, file, rx);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, [0xa1, 0x00, 0x01]);
}

#[test]
fn interrupt_in_reports_a_failed_write() {
    let (host, file) = pipe();
    drop(host);
    let (tx, rx) = mpsc::sync_channel(8);
    tx.send(interrupt(Status::SUCCESS, &[1])).unwrap();
    drop(tx);
    log();
    interrupt_in(INT_IN, file, rx);
    assert!(logged(&log(), "W: ep 0x81:"));
}

fn control_reply(id: u64, status: Status, data: &[u8]) -> Packet {
    Packet::new(
        id,
        Message::ControlPacket(ControlPacket {
            status,
            length: data.len() as u16,
            data: data.to_vec(),
            ..Default::default()
        }),
    )
}

fn sent_control(m: &mut Model) -> (u64, ControlPacket) {
    let p = m.next();
    match p.msg {
        Message::ControlPacket(c) => (p.id, c),
        msg => panic!("expected a control packet, got {msg:?}"),
    }
}

const VENDOR_IN: Setup = Setup {
    request_type: 0xc0,
    request: 0x1b,
    value: 0x0102,
    index: 0x0304,
    length: 4,
};
const VENDOR_OUT: Setup = Setup {
    request_type: 0x40,
    request: 0x10,
    value: 0x0005,
    index: 0,
    length: 3,
};

#[test]
fn setup_answers_an_in_request_with_the_models_reply() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    // A reply to another request first: setup waits for its own.
    ctrl_tx
        .send(control_reply(id + 7, Status::SUCCESS, b"late"))
        .unwrap();
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b"abcdef"))
        .unwrap();
    let (mut host, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    drop(ep0);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"abcd");
    let (sent, c) = sent_control(&mut m);
    assert_eq!(sent, id);
    assert_eq!(
        c,
        ControlPacket {
            endpoint: 0x80,
            request: 0x1b,
            requesttype: 0xc0,
            status: Status::SUCCESS,
            value: 0x0102,
            index: 0x0304,
            length: 4,
            data: vec![],
        }
    );
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_waits_for_the_models_answer() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    // The answer comes only once the model has the request.
    let model = std::thread::spawn(move || {
        let (id, _) = sent_control(&mut m);
        ctrl_tx
            .send(control_reply(id, Status::SUCCESS, b"wxyz"))
            .unwrap();
        (m, ctrl_tx)
    });
    let (mut host, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    drop(ep0);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"wxyz");
    assert_eq!(log(), Vec::<String>::new());
    drop(model.join().unwrap());
}

#[test]
fn setup_stalls_an_in_request_the_model_refused() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    // ep0 reads to stall an IN request: a read end takes that quietly.
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_reports_an_ep0_error_other_than_a_stall() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    // A write end cannot be read: the stall fails with EBADF.
    let (_r, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    let l = log();
    assert!(logged(&l, "W: ep0:"), "{l:?}");
}

#[test]
fn setup_passes_an_out_requests_data_to_the_model() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b""))
        .unwrap();
    let (mut ep0, mut w) = pipe();
    w.write_all(&[7, 8, 9]).unwrap();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_OUT).unwrap();
    let (_, c) = sent_control(&mut m);
    assert_eq!(
        (
            c.endpoint,
            c.request,
            c.requesttype,
            c.value,
            c.length,
            c.data
        ),
        (0x00, 0x10, 0x40, 0x0005, 3, vec![7, 8, 9])
    );
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_warns_of_an_out_request_refused_after_its_data() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    let (mut ep0, mut w) = pipe();
    w.write_all(&[7, 8, 9]).unwrap();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_OUT).unwrap();
    let l = log();
    assert!(logged(&l, "refused OUT request 0x40/0x10"), "{l:?}");
}

#[test]
fn setup_finishes_a_zero_length_out_request_either_way() {
    let no_data = Setup {
        length: 0,
        ..VENDOR_OUT
    };
    // Accepted: a read of nothing (a read end takes it quietly).
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b""))
        .unwrap();
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
    assert_eq!(sent_control(&mut m).1.length, 0);
    assert_eq!(log(), Vec::<String>::new());
    // Refused: a write of nothing (a write end takes it quietly).
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    let (_r, mut ep0) = pipe();
    setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_ends_a_zero_length_out_request_with_a_read_or_a_write() {
    let no_data = Setup {
        length: 0,
        ..VENDOR_OUT
    };
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    // Each case gets the end of a pipe that cannot do what it should:
    // the error it reports shows which it did.
    for (status, read_end) in [(Status::SUCCESS, false), (Status::STALL, true)] {
        let id = sh.link.next_id.load(Ordering::SeqCst);
        ctrl_tx.send(control_reply(id, status, b"")).unwrap();
        let (r, w) = pipe();
        let mut ep0 = if read_end { r } else { w };
        log();
        setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
        let l = log();
        assert!(
            logged(&l, "W: ep0: Bad file descriptor"),
            "{status:?}: {l:?}"
        );
    }
}

#[test]
fn setup_without_an_answer_stalls_and_says_so() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    drop(ctrl_tx);
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    let l = log();
    assert!(logged(&l, "did not answer request 0xc0/0x1b"), "{l:?}");
    assert!(!logged(&l, "W: ep0:"), "{l:?}");
}

#[test]
fn setup_fails_when_the_model_is_gone() {
    let (link, _s, m) = link_pair();
    drop(m);
    let sh = shared(link, Path::new(""));
    let (_ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    let (mut ep0, _w) = pipe();
    let e = setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap_err();
    assert!(e.to_string().contains("writing to the model"), "{e}");
}

#[test]
fn aio_check_passes_counts_and_turns_failures_into_errno() {
    assert_eq!(aio::check(0).unwrap(), 0);
    assert_eq!(aio::check(7).unwrap(), 7);
    // SAFETY: errno is this thread's own.
    unsafe { *libc::__errno_location() = libc::EBADF };
    assert_eq!(
        aio::check(-1).unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
}

#[test]
fn aio_reads_a_file() {
    let t = TempDir::new("aio");
    let p = t.0.join("f");
    std::fs::write(&p, "hello aio").unwrap();
    let f = File::open(&p).unwrap();
    let ctx = aio::Ctx::new(2).unwrap();
    let mut r = aio::Read::new(f.as_raw_fd(), 7, 64);
    ctx.submit(&mut r).unwrap();
    let mut ev = [aio::Event::default(); 2];
    assert_eq!(ctx.wait(&mut ev).unwrap(), 1);
    assert_eq!((ev[0].data, ev[0].res), (7, 9));
    assert_eq!(&r.buf[..9], b"hello aio");
}

#[test]
fn bulk_out_passes_transfers_on_at_most_in_flight_unanswered() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let t = TempDir::new("bulkout");
    let p = t.0.join("ep3");
    // A regular file: every read (at offset 0) completes at once with
    // the same transfer, here one larger than any Ethernet frame.
    let content: Vec<u8> = (0..2000).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &content).unwrap();
    let file = File::open(&p).unwrap();
    let (tx, rx) = mpsc::sync_channel(64);
    let (done_tx, done_rx) = mpsc::channel();
    {
        let sh = sh.clone();
        std::thread::spawn(move || {
            bulk_out(sh, BULK_OUT, file, rx, 1);
            let _ = done_tx.send(());
        });
    }
    let frame = |b: BulkPacket| (b.endpoint, b.length, b.data);
    let want = (0x03, 2000, content);
    assert_eq!(frame(m.next_bulk()), want);
    // One in flight: the next waits for the model's answer.
    assert!(m.try_next(Duration::from_millis(100)).is_none());
    tx.send(bulk(0x03, Status::SUCCESS, &[])).unwrap();
    assert_eq!(frame(m.next_bulk()), want);
    // Enabled again: the unanswered one is forgotten.
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    assert_eq!(frame(m.next_bulk()), want);
    drop(tx);
    done_rx
        .recv_timeout(PATIENCE)
        .expect("bulk_out returns once nothing feeds it");
}

#[test]
fn bulk_out_reports_a_failed_read_and_reads_again() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    // A non-blocking socket: a read with nothing there completes with
    // EAGAIN.
    let (mut host, ep) = UnixStream::pair().unwrap();
    ep.set_nonblocking(true).unwrap();
    let file = File::from(OwnedFd::from(ep));
    let (tx, rx) = mpsc::sync_channel(64);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        bulk_out(sh, BULK_OUT, file, rx, 1);
        let _ = done_tx.send(());
    });
    let deadline = Instant::now() + PATIENCE;
    while !logged_anywhere("W: ep 0x03: Resource temporarily unavailable") {
        assert!(
            Instant::now() < deadline,
            "the failed read was not reported"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    host.write_all(b"late").unwrap();
    assert_eq!(m.next_bulk().data, b"late");
    drop(tx);
    // One more transfer finds the model's answers gone.
    host.write_all(b"last").unwrap();
    done_rx
        .recv_timeout(PATIENCE)
        .expect("bulk_out returns once nothing feeds it");
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
