//! Tests of the byte streams to the model: polling, reading and writing,
//! finding a virtio-serial port, connecting within a deadline.

use super::*;

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
