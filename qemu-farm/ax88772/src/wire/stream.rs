//! [`StreamWire`]: the wire over a `-netdev stream` socket, each frame
//! behind its 4-byte big-endian length, connecting or listening, with a
//! bounded queue toward a slow peer.

use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use super::Wire;
use crate::addr::SockAddr;
use crate::net::{Conn, Listener};
use crate::{log_i, log_w};

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
    pub(super) fn new(connect_to: Option<SockAddr>, listener: Option<Listener>) -> StreamWire {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::WireSpec;
    use crate::wire::open;
    use crate::wire::tests::tmp;
    use std::os::unix::net::UnixStream;
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

    fn listening(name: &str) -> (StreamWire, std::path::PathBuf) {
        let path = tmp(name);
        let l = Listener::bind(&SockAddr::Unix(path.clone())).unwrap();
        (StreamWire::new(None, Some(l)), path)
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
