//! The wire: Ethernet frames to and from the link partner over a QEMU
//! `-netdev stream` (4-byte big-endian length, then the frame) or
//! `-netdev dgram` (one frame per datagram) socket, or a tap interface
//! (`tap.rs`).

use std::io::{self, Read, Write};
use std::net::UdpSocket;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use crate::addr::{SockAddr, WireSpec};
use crate::framing::MAX_FRAME;
use crate::net::{Conn, Listener};
use crate::{log_i, log_w};

/// A frame transport. Calls never block.
pub trait Wire: Send {
    /// Descriptor to poll for input, if there is one; transports without
    /// one are polled by calling [`Wire::recv`] periodically.
    fn fd(&self) -> Option<RawFd>;
    /// The next received frame, if one is ready.
    fn recv(&mut self) -> io::Result<Option<Vec<u8>>>;
    /// Queue a frame for sending. Frames that cannot be sent are dropped.
    fn send(&mut self, frame: &[u8]);
    /// Output is waiting for the descriptor to become writable.
    fn wants_write(&self) -> bool {
        false
    }
    /// Push queued output.
    fn flush(&mut self) {}
    /// How often to call [`Wire::recv`] when there is no descriptor to
    /// wait on (or a connect to retry); `None` when never needed, as for a
    /// wire that always has a descriptor.
    fn tick(&self) -> Option<Duration> {
        None
    }
    fn describe(&self) -> String;
}

/// Build the transport a spec names.
pub fn open(spec: &WireSpec) -> io::Result<Box<dyn Wire>> {
    Ok(match spec {
        WireSpec::None => Box::new(NoWire),
        WireSpec::StreamConnect(a) => Box::new(StreamWire::new(Some(a.clone()), None)),
        WireSpec::StreamListen(a) => Box::new(StreamWire::new(None, Some(Listener::bind(a)?))),
        WireSpec::Dgram { local, remote } => Box::new(DgramWire::bind(local, remote)?),
        WireSpec::Tap(name) => Box::new(crate::tap::TapWire::attach(name)?),
    })
}

/// No cable: transmitted frames vanish, nothing arrives.
pub struct NoWire;

impl Wire for NoWire {
    fn fd(&self) -> Option<RawFd> {
        None
    }
    fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        Ok(None)
    }
    fn send(&mut self, _frame: &[u8]) {}
    fn describe(&self) -> String {
        "none".into()
    }
}

/// Upper bound on bytes queued towards a slow stream peer.
const STREAM_OUT_LIMIT: usize = 4 * 1024 * 1024;

pub struct StreamWire {
    connect_to: Option<SockAddr>,
    listener: Option<Listener>,
    conn: Option<Conn>,
    next_try: Instant,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    pub dropped: u64,
}

impl StreamWire {
    fn new(connect_to: Option<SockAddr>, listener: Option<Listener>) -> StreamWire {
        StreamWire {
            connect_to,
            listener,
            conn: None,
            next_try: Instant::now(),
            inbuf: Vec::new(),
            out: Vec::new(),
            dropped: 0,
        }
    }

    fn lost(&mut self, why: &str) {
        log_w!("wire: stream closed ({why}); waiting for the peer again");
        self.conn = None;
        self.inbuf.clear();
        self.out.clear();
        self.next_try = Instant::now() + Duration::from_millis(200);
    }

    fn try_connect(&mut self) {
        if self.conn.is_some() {
            return;
        }
        if let Some(l) = &self.listener {
            match l.accept() {
                Ok(Some(c)) => {
                    log_i!("wire: peer connected");
                    self.conn = Some(c);
                }
                Ok(None) => {}
                Err(e) => log_w!("wire: accept: {e}"),
            }
        } else if let Some(a) = &self.connect_to {
            if Instant::now() < self.next_try {
                return;
            }
            match Conn::connect(a) {
                Ok(c) => {
                    log_i!("wire: connected to {a}");
                    self.conn = Some(c);
                }
                Err(_) => self.next_try = Instant::now() + Duration::from_millis(500),
            }
        }
    }

    /// One frame from the input buffer, if complete.
    fn take_frame(&mut self) -> Option<io::Result<Vec<u8>>> {
        if self.inbuf.len() < 4 {
            return None;
        }
        let len = u32::from_be_bytes([self.inbuf[0], self.inbuf[1], self.inbuf[2], self.inbuf[3]]);
        let len = len as usize;
        if len > 65536 {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("stream frame length {len} is not plausible"),
            )));
        }
        if self.inbuf.len() < 4 + len {
            return None;
        }
        let f = self.inbuf[4..4 + len].to_vec();
        self.inbuf.drain(..4 + len);
        Some(Ok(f))
    }
}

impl Wire for StreamWire {
    fn fd(&self) -> Option<RawFd> {
        match (&self.conn, &self.listener) {
            (Some(c), _) => Some(c.as_raw_fd()),
            (None, Some(l)) => Some(l.as_raw_fd()),
            (None, None) => None,
        }
    }

    fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.try_connect();
        match self.take_frame() {
            Some(Ok(f)) => return Ok(Some(f)),
            Some(Err(e)) => {
                self.lost(&e.to_string());
                return Ok(None);
            }
            None => {}
        }
        let Some(c) = &mut self.conn else {
            return Ok(None);
        };
        let mut buf = [0u8; 16384];
        match c.read(&mut buf) {
            Ok(0) => self.lost("end of stream"),
            Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => self.lost(&e.to_string()),
        }
        match self.take_frame() {
            Some(Ok(f)) => Ok(Some(f)),
            Some(Err(e)) => {
                self.lost(&e.to_string());
                Ok(None)
            }
            None => Ok(None),
        }
    }

    fn send(&mut self, frame: &[u8]) {
        if self.conn.is_none() || self.out.len() > STREAM_OUT_LIMIT {
            self.dropped += 1;
            return;
        }
        self.out
            .extend_from_slice(&(frame.len() as u32).to_be_bytes());
        self.out.extend_from_slice(frame);
        self.flush();
    }

    fn wants_write(&self) -> bool {
        self.conn.is_some() && !self.out.is_empty()
    }

    fn flush(&mut self) {
        let Some(c) = &mut self.conn else { return };
        while !self.out.is_empty() {
            match c.write(&self.out) {
                Ok(0) => return self.lost("write returned 0"),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.lost(&e.to_string()),
            }
        }
    }

    fn tick(&self) -> Option<Duration> {
        (self.conn.is_none() && self.listener.is_none()).then_some(Duration::from_millis(100))
    }

    fn describe(&self) -> String {
        match (&self.connect_to, &self.listener) {
            (Some(a), _) => format!("stream:{a}"),
            (None, Some(l)) => format!("stream-listen:{}", l.local_addr()),
            (None, None) => "stream".into(),
        }
    }
}

enum Dgram {
    Unix(UnixDatagram, std::path::PathBuf),
    Udp(UdpSocket, String),
}

/// Frames held while the partner's socket queue is full (a unix datagram
/// receiver queues only net.unix.max_dgram_qlen = 10 by default; QEMU drains
/// it when its NIC has buffers). About 30 ms of 100 Mbit/s traffic, like a
/// switch port's buffer.
pub const DGRAM_QUEUE: usize = 256;

pub struct DgramWire {
    sock: Dgram,
    /// The unix socket is connected to the peer once it exists, so a full
    /// peer queue reads as EAGAIN and poll(POLLOUT) says when it drains.
    connected: bool,
    queue: std::collections::VecDeque<Vec<u8>>,
    warned: bool,
    pub dropped: u64,
}

impl DgramWire {
    pub fn bind(local: &SockAddr, remote: &SockAddr) -> io::Result<DgramWire> {
        let sock = match (local, remote) {
            (SockAddr::Unix(l), SockAddr::Unix(r)) => {
                crate::net::remove_stale_socket(l, false)?;
                let s = UnixDatagram::bind(l)?;
                s.set_nonblocking(true)?;
                Dgram::Unix(s, r.clone())
            }
            (SockAddr::Inet(l), SockAddr::Inet(r)) => {
                let s = UdpSocket::bind(l)?;
                s.set_nonblocking(true)?;
                Dgram::Udp(s, r.clone())
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "mixed address families",
                ))
            }
        };
        Ok(DgramWire {
            sock,
            connected: false,
            queue: std::collections::VecDeque::new(),
            warned: false,
            dropped: 0,
        })
    }

    fn send_now(&mut self, frame: &[u8]) -> io::Result<usize> {
        match &self.sock {
            Dgram::Unix(s, r) => {
                if !self.connected {
                    s.connect(r)?;
                    self.connected = true;
                }
                let res = s.send(frame);
                if let Err(e) = &res {
                    if e.kind() != io::ErrorKind::WouldBlock {
                        // The peer went away (or was replaced): reconnect next time.
                        self.connected = false;
                    }
                }
                res
            }
            Dgram::Udp(s, r) => s.send_to(frame, r.as_str()),
        }
    }

    fn failed(&mut self, e: &io::Error) {
        self.dropped += 1;
        if !self.warned {
            log_w!("wire: dgram send failed ({e}); frames are dropped until the peer is up");
            self.warned = true;
        }
    }
}

impl Wire for DgramWire {
    fn fd(&self) -> Option<RawFd> {
        Some(match &self.sock {
            Dgram::Unix(s, _) => s.as_raw_fd(),
            Dgram::Udp(s, _) => s.as_raw_fd(),
        })
    }

    fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; MAX_FRAME + 64];
        let r = match &self.sock {
            Dgram::Unix(s, _) => s.recv(&mut buf),
            Dgram::Udp(s, _) => s.recv(&mut buf),
        };
        match r {
            Ok(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // A previous send found nobody listening: not a receive error.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn send(&mut self, frame: &[u8]) {
        if !self.queue.is_empty() {
            if self.queue.len() >= DGRAM_QUEUE {
                self.dropped += 1;
            } else {
                self.queue.push_back(frame.to_vec());
            }
            return;
        }
        match self.send_now(frame) {
            Ok(_) => self.warned = false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.queue.push_back(frame.to_vec()),
            Err(e) => self.failed(&e),
        }
    }

    fn wants_write(&self) -> bool {
        !self.queue.is_empty()
    }

    fn flush(&mut self) {
        while let Some(f) = self.queue.pop_front() {
            match self.send_now(&f) {
                Ok(_) => self.warned = false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.queue.push_front(f);
                    return;
                }
                Err(e) => self.failed(&e),
            }
        }
    }

    fn describe(&self) -> String {
        match &self.sock {
            Dgram::Unix(s, r) => {
                let l = s
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.display().to_string()));
                format!("dgram:unix:{},unix:{}", l.unwrap_or_default(), r.display())
            }
            Dgram::Udp(s, r) => {
                format!(
                    "dgram:{},{r}",
                    s.local_addr().map(|a| a.to_string()).unwrap_or_default()
                )
            }
        }
    }
}

impl Drop for DgramWire {
    fn drop(&mut self) {
        if let Dgram::Unix(s, _) = &self.sock {
            if let Ok(Some(p)) = s
                .local_addr()
                .map(|a| a.as_pathname().map(|p| p.to_path_buf()))
            {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// In-memory wire for tests: frames injected through a [`MockHandle`]
/// arrive at the device; frames the device sends are collected there.
#[cfg(any(test, feature = "test-utils"))]
pub mod mock {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct State {
        to_device: VecDeque<Vec<u8>>,
        from_device: Vec<Vec<u8>>,
    }

    pub struct MockWire(Arc<Mutex<State>>);

    #[derive(Clone)]
    pub struct MockHandle(Arc<Mutex<State>>);

    pub fn pair() -> (MockWire, MockHandle) {
        let s = Arc::new(Mutex::new(State::default()));
        (MockWire(s.clone()), MockHandle(s))
    }

    impl MockHandle {
        /// A frame from the link partner.
        pub fn inject(&self, frame: Vec<u8>) {
            if let Ok(mut s) = self.0.lock() {
                s.to_device.push_back(frame);
            }
        }
        /// Frames the device put on the wire so far (taken).
        pub fn take_sent(&self) -> Vec<Vec<u8>> {
            self.0
                .lock()
                .map(|mut s| std::mem::take(&mut s.from_device))
                .unwrap_or_default()
        }
    }

    impl Wire for MockWire {
        fn fd(&self) -> Option<RawFd> {
            None
        }
        fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
            Ok(self.0.lock().ok().and_then(|mut s| s.to_device.pop_front()))
        }
        fn send(&mut self, frame: &[u8]) {
            if let Ok(mut s) = self.0.lock() {
                s.from_device.push(frame.to_vec());
            }
        }
        fn tick(&self) -> Option<Duration> {
            Some(Duration::from_millis(1))
        }
        fn describe(&self) -> String {
            "mock".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ax-wire-{}-{name}", std::process::id()))
    }

    #[test]
    fn stream_framing_round_trip() {
        let path = tmp("s.sock");
        let mut w = open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
        let mut peer = UnixStream::connect(&path).unwrap();
        // Length-prefixed input, delivered in pieces.
        let mut bytes = 3u32.to_be_bytes().to_vec();
        bytes.extend([1, 2, 3]);
        bytes.extend(2u32.to_be_bytes());
        bytes.extend([9, 9]);
        peer.write_all(&bytes).unwrap();
        let mut got = Vec::new();
        for _ in 0..1000 {
            if let Some(f) = w.recv().unwrap() {
                got.push(f);
            }
            if got.len() == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, vec![vec![1, 2, 3], vec![9, 9]]);
        w.send(&[7, 7, 7, 7, 7]);
        let mut out = [0u8; 9];
        peer.read_exact(&mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 5, 7, 7, 7, 7, 7]);
        drop(w);
        assert!(!path.exists(), "socket file removed");
    }

    #[test]
    fn dgram_one_frame_per_datagram() {
        let (a, b) = (tmp("a.sock"), tmp("b.sock"));
        let spec = WireSpec::Dgram {
            local: SockAddr::Unix(a.clone()),
            remote: SockAddr::Unix(b.clone()),
        };
        let mut w = open(&spec).unwrap();
        w.send(&[1]); // peer not up yet: dropped, no panic
        let peer = UnixDatagram::bind(&b).unwrap();
        w.send(&[1, 2, 3]);
        let mut buf = [0u8; 64];
        assert_eq!(peer.recv(&mut buf).unwrap(), 3);
        peer.send_to(&[4, 5], &a).unwrap();
        let mut got = None;
        for _ in 0..1000 {
            got = w.recv().unwrap();
            if got.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, Some(vec![4, 5]));
        drop(w);
        let _ = std::fs::remove_file(&b);
    }

    #[test]
    fn dgram_holds_frames_while_the_peer_queue_is_full() {
        let (a, b) = (tmp("qa.sock"), tmp("qb.sock"));
        let spec = WireSpec::Dgram {
            local: SockAddr::Unix(a.clone()),
            remote: SockAddr::Unix(b.clone()),
        };
        let peer = UnixDatagram::bind(&b).unwrap();
        let mut w = open(&spec).unwrap();
        let n = 100u8;
        for i in 0..n {
            w.send(&[i; 60]);
        }
        assert!(
            w.wants_write(),
            "a 10-deep peer queue cannot take 100 frames"
        );
        let mut got = Vec::new();
        let mut buf = [0u8; 128];
        peer.set_nonblocking(true).unwrap();
        for _ in 0..10_000 {
            while let Ok(len) = peer.recv(&mut buf) {
                got.push(buf[..len].to_vec());
            }
            w.flush();
            if got.len() == n as usize {
                break;
            }
        }
        assert_eq!(got.len(), n as usize, "no frame lost");
        assert!(
            got.iter().enumerate().all(|(i, f)| f[0] == i as u8),
            "in order"
        );
        assert!(!w.wants_write());
        drop(w);
        let _ = std::fs::remove_file(&b);
    }

    #[test]
    fn an_empty_stream_frame_is_a_frame() {
        let path = tmp("empty.sock");
        let mut w = open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
        let mut peer = UnixStream::connect(&path).unwrap();
        // Exactly one header, no payload, nothing after it.
        peer.write_all(&0u32.to_be_bytes()).unwrap();
        let mut got = None;
        for _ in 0..1000 {
            got = w.recv().unwrap();
            if got.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, Some(vec![]));
    }

    #[test]
    fn each_wire_says_what_it_is_and_what_to_poll() {
        let none = open(&WireSpec::None).unwrap();
        assert_eq!(none.describe(), "none");
        assert!(none.fd().is_none() && !none.wants_write());
        let path = tmp("d.sock");
        let listen = open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
        assert_eq!(
            listen.describe(),
            format!("stream-listen:unix:{}", path.display())
        );
        assert!(!listen.wants_write(), "nothing to send, no peer");
        let (a, b) = (tmp("da.sock"), tmp("db.sock"));
        let spec = WireSpec::Dgram {
            local: SockAddr::Unix(a.clone()),
            remote: SockAddr::Unix(b.clone()),
        };
        let dgram = open(&spec).unwrap();
        assert_eq!(
            dgram.describe(),
            format!("dgram:unix:{},unix:{}", a.display(), b.display())
        );
        assert!(dgram.fd().is_some(), "the event loop polls the socket");
        assert!(!dgram.wants_write());
    }

    fn listening(name: &str) -> (StreamWire, std::path::PathBuf) {
        let path = tmp(name);
        let l = Listener::bind(&SockAddr::Unix(path.clone())).unwrap();
        (StreamWire::new(None, Some(l)), path)
    }

    #[test]
    fn a_listener_with_nobody_waiting_has_nothing_to_accept() {
        let path = tmp("idle-listen.sock");
        let l = Listener::bind(&SockAddr::Unix(path.clone())).unwrap();
        assert!(l.accept().unwrap().is_none());
        let _peer = UnixStream::connect(&path).unwrap();
        assert!(l.accept().unwrap().is_some());
        assert!(l.accept().unwrap().is_none());
    }

    #[test]
    fn a_connecting_wire_connects_on_its_first_turn() {
        let path = tmp("connect.sock");
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        let mut w = StreamWire::new(Some(SockAddr::Unix(path.clone())), None);
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(w.recv().unwrap(), None);
        let (mut peer, _) = l.accept().expect("the wire connected");
        w.send(&[5, 6]);
        let mut out = [0u8; 6];
        peer.read_exact(&mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 2, 5, 6]);
        assert_eq!(w.dropped, 0);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_quiet_peer_stays_connected() {
        let (mut w, path) = listening("quiet.sock");
        let mut peer = UnixStream::connect(&path).unwrap();
        // Accepted, and nothing to read yet.
        assert_eq!(w.recv().unwrap(), None);
        assert_eq!(w.recv().unwrap(), None);
        peer.write_all(&[0, 0, 0, 1, 42]).unwrap();
        assert_eq!(w.recv().unwrap(), Some(vec![42]));
    }

    #[test]
    fn frames_without_a_peer_are_counted_as_dropped() {
        let (mut w, _path) = listening("nopeer.sock");
        w.send(&[1, 2, 3]);
        w.send(&[4]);
        assert_eq!(w.dropped, 2);
        assert!(!w.wants_write());
    }

    #[test]
    fn a_peer_that_went_away_is_let_go_when_sending() {
        let (mut w, path) = listening("gone.sock");
        let peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        drop(peer);
        // The write fails (EPIPE): the connection is dropped, not retried.
        w.send(&[1, 2, 3]);
        assert!(w.conn.is_none());
        assert!(!w.wants_write());
        w.send(&[4]);
        assert_eq!(w.dropped, 1, "no peer any more");
    }

    #[test]
    fn dgram_receive_errors_reach_the_caller() {
        let (a, b) = (tmp("ea.sock"), tmp("eb.sock"));
        let mut w =
            DgramWire::bind(&SockAddr::Unix(a.clone()), &SockAddr::Unix(b.clone())).unwrap();
        // Put a file where the socket was: recv(2) fails with ENOTSOCK.
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = w.fd().unwrap();
        // SAFETY: both descriptors are open; `fd` stays owned by the wire,
        // which closes it (now the file) when dropped.
        assert_eq!(unsafe { libc::dup2(f.as_raw_fd(), fd) }, fd);
        let e = w.recv().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
        drop(w);
        let _ = std::fs::remove_file(&a);
    }

    #[test]
    fn dgram_frames_toward_an_absent_peer_are_counted_as_dropped() {
        let (a, b) = (tmp("absent-a.sock"), tmp("absent-b.sock"));
        let mut w =
            DgramWire::bind(&SockAddr::Unix(a.clone()), &SockAddr::Unix(b.clone())).unwrap();
        // Nobody is bound at `b`: each send fails and is counted, once each.
        w.send(&[1, 2, 3]);
        w.send(&[4]);
        assert_eq!(w.dropped, 2);
        drop(w);
        let _ = std::fs::remove_file(&a);
    }

    #[test]
    fn a_dgram_wire_is_polled_not_ticked_and_removes_its_socket() {
        let (a, b) = (tmp("tick-a.sock"), tmp("tick-b.sock"));
        let w = DgramWire::bind(&SockAddr::Unix(a.clone()), &SockAddr::Unix(b)).unwrap();
        assert_eq!(w.tick(), None);
        assert!(a.exists());
        drop(w);
        assert!(!a.exists(), "socket file removed");
    }

    #[test]
    fn the_longest_stream_frame_is_taken() {
        let (mut w, path) = listening("long.sock");
        let mut peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        let mut bytes = 65536u32.to_be_bytes().to_vec();
        bytes.extend(vec![7u8; 65536]);
        let writer = std::thread::spawn(move || {
            peer.write_all(&bytes).unwrap();
            peer
        });
        let mut got = None;
        for _ in 0..10_000 {
            got = w.recv().unwrap();
            if got.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let _peer = writer.join().unwrap();
        assert_eq!(got.map(|f| f.len()), Some(65536));
        assert!(w.conn.is_some(), "still connected");
    }

    #[test]
    fn a_peer_that_does_not_read_gets_four_mib_queued_then_drops() {
        let (mut w, path) = listening("slow.sock");
        let mut peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        let frame = [0u8; 1500];
        let mut sent = 0;
        while w.dropped == 0 {
            w.send(&frame);
            sent += 1;
            assert!(sent < 10_000, "never dropped");
        }
        assert!(w.wants_write(), "output waits for the socket");
        assert!(
            w.out.len() >= 4 << 20,
            "dropped with {} queued",
            w.out.len()
        );
        // The peer reads everything: the queue drains, nothing is asked.
        peer.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        while w.wants_write() || total < (sent - 1) * 1504 {
            w.flush();
            match peer.read(&mut buf) {
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(total, (sent - 1) * 1504);
        assert!(w.out.is_empty());
    }

    #[test]
    fn implausible_stream_length_drops_the_connection() {
        let path = tmp("bad.sock");
        let mut w = open(&WireSpec::StreamListen(SockAddr::Unix(path.clone()))).unwrap();
        let mut peer = UnixStream::connect(&path).unwrap();
        peer.write_all(&[0xff, 0xff, 0xff, 0xff, 0]).unwrap();
        for _ in 0..50 {
            assert_eq!(w.recv().unwrap(), None);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!w.wants_write());
    }
    #[test]
    fn no_wire_never_delivers_nor_asks_to_be_polled() {
        let mut w = NoWire;
        assert_eq!(w.fd(), None);
        for _ in 0..3 {
            assert_eq!(w.recv().unwrap(), None);
        }
        w.send(&[1, 2, 3]);
        assert_eq!(w.recv().unwrap(), None, "nothing loops back");
        assert!(!w.wants_write());
        assert_eq!(w.tick(), None);
    }

    /// The connecting side: a failed connect is tried again 500 ms later
    /// and not sooner; a lost connection 200 ms later, its buffers emptied;
    /// the descriptor to poll is the connection's once there is one.
    #[test]
    fn a_connecting_wire_retries_on_its_schedule() {
        let path = tmp("retry.sock");
        let _ = std::fs::remove_file(&path);
        let mut w = StreamWire::new(Some(SockAddr::Unix(path.clone())), None);
        assert_eq!(w.fd(), None, "nothing to poll before a connection");
        assert_eq!(w.tick(), Some(Duration::from_millis(100)));
        let before = Instant::now();
        assert_eq!(w.recv().unwrap(), None); // nobody listens: refused
        let after = Instant::now();
        assert!(w.conn.is_none());
        let wait = Duration::from_millis(500);
        assert!(
            w.next_try >= before + wait && w.next_try <= after + wait,
            "retry at {:?} after the failure",
            w.next_try - before
        );
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        assert!(w.conn.is_none(), "connected before the retry was due");
        assert!(l.accept().is_err(), "no connection attempt yet");
        // The retry falls due.
        w.next_try = Instant::now() - Duration::from_millis(1);
        assert_eq!(w.recv().unwrap(), None);
        let fd = w.conn.as_ref().map(|c| c.as_raw_fd());
        assert!(fd.is_some(), "connected once due");
        assert_eq!(w.fd(), fd, "the connection is what the event loop polls");
        assert_eq!(w.tick(), None, "a connected wire is polled, not ticked");
        let (mut peer, _) = l.accept().expect("the wire connected");
        // A quiet peer (the read would block) keeps the connection.
        assert_eq!(w.recv().unwrap(), None);
        assert!(w.conn.is_some());
        // Half a length prefix, then the peer goes away.
        peer.write_all(&[0, 0]).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        assert_eq!(w.inbuf.len(), 2);
        drop(peer);
        let before = Instant::now();
        assert_eq!(w.recv().unwrap(), None);
        let after = Instant::now();
        assert!(w.conn.is_none(), "end of stream lets the connection go");
        assert!(w.inbuf.is_empty() && w.out.is_empty());
        let wait = Duration::from_millis(200);
        assert!(
            w.next_try >= before + wait && w.next_try <= after + wait,
            "retry at {:?} after the loss",
            w.next_try - before
        );
        assert_eq!(w.fd(), None);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_listening_wire_polls_its_listener_until_a_peer_comes() {
        let (mut w, path) = listening("poll-listen.sock");
        let lfd = w.listener.as_ref().map(|l| l.as_raw_fd());
        assert!(lfd.is_some());
        assert_eq!(w.fd(), lfd);
        assert_eq!(w.tick(), None, "the listener is polled");
        let _peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        let cfd = w.conn.as_ref().map(|c| c.as_raw_fd());
        assert!(cfd.is_some() && cfd != lfd);
        assert_eq!(w.fd(), cfd);
    }

    /// The queue toward a peer that does not read takes a frame while it
    /// holds at most 4 MiB, and drops (and counts) it beyond.
    #[test]
    fn the_stream_queue_bound_is_exactly_four_mib() {
        let (mut w, path) = listening("bound.sock");
        let _peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        assert!(w.conn.is_some());
        w.out = vec![0; STREAM_OUT_LIMIT];
        w.send(&[1]);
        assert_eq!(w.dropped, 0, "4 MiB queued still takes a frame");
        w.out = vec![0; STREAM_OUT_LIMIT + 1];
        w.send(&[1]);
        assert_eq!(w.dropped, 1, "over 4 MiB queued drops the frame");
        assert_eq!(w.out.len(), STREAM_OUT_LIMIT + 1, "nothing added");
    }
    /// A read that fails for another reason than "nothing yet" lets the
    /// connection go: a unix stream peer that closes with our frames still
    /// unread makes the next read fail with ECONNRESET.
    #[test]
    fn a_failed_read_lets_the_connection_go() {
        let (mut w, path) = listening("reset.sock");
        let peer = UnixStream::connect(&path).unwrap();
        assert_eq!(w.recv().unwrap(), None);
        w.send(&[1, 2, 3]);
        assert!(!w.wants_write(), "the frame is in the peer's queue");
        drop(peer);
        assert_eq!(w.recv().unwrap(), None);
        assert!(w.conn.is_none(), "a reset connection is let go");
        assert_eq!(w.fd(), w.listener.as_ref().map(|l| l.as_raw_fd()));
    }
}
