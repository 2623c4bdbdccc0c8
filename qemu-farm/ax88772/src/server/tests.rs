//! Tests of the event loop: connecting and accepting, back-pressure
//! between QEMU and the wire, and the loop's wait; the control socket's
//! in `tests/control.rs`. The helpers here serve both.

use super::*;
use crate::addr::WireSpec;
use crate::descriptors::Variant;
use crate::device::{Counters, DeviceConfig};
use crate::wire::mock;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

mod control;

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
    let wire = crate::wire::open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
    let (a, _qemu) = UnixStream::pair().unwrap();
    let mut s = server(wire, UsbRole::Connected, None);
    // Each step below sleeps its whole idle time: nothing is due.
    s.idle = Duration::from_millis(20);
    s.attach(Conn::Unix(a));
    let mut peer = UnixStream::connect(&path).unwrap();
    // The wire takes its peer while there is room.
    s.step().unwrap();
    assert!(s.dev.partner_may_send());
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

fn nanos(ts: libc::timespec) -> i64 {
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
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
