//! [`DgramWire`]: the wire over a `-netdev dgram` socket (unix or UDP),
//! one frame per datagram, frames held while the peer's queue is full.

use std::io;
use std::net::UdpSocket;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;

use super::Wire;
use crate::addr::SockAddr;
use crate::framing::MAX_FRAME;
use crate::log_w;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::WireSpec;
    use crate::wire::open;
    use crate::wire::tests::tmp;
    use std::time::Duration;
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
}
