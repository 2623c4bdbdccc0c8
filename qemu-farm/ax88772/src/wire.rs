//! The wire: Ethernet frames to and from the link partner over a QEMU
//! `-netdev stream` (4-byte big-endian length, then the frame) or
//! `-netdev dgram` (one frame per datagram) socket, or a tap interface.
//!
//! This file holds the [`Wire`] trait, [`open`], [`NoWire`] and the
//! in-memory [`mock`]; beside it: `stream` ([`StreamWire`]), `dgram`
//! ([`DgramWire`]) and `tap` ([`tap::TapWire`]).

use std::io;
use std::os::unix::io::RawFd;
use std::time::Duration;

use crate::addr::WireSpec;
use crate::net::Listener;

mod dgram;
mod stream;
pub mod tap;

pub use dgram::{DgramWire, DGRAM_QUEUE};
pub use stream::StreamWire;

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
        WireSpec::Tap(name) => Box::new(tap::TapWire::attach(name)?),
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
    use crate::addr::SockAddr;
    use std::os::unix::net::UnixStream;

    pub(super) fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("ax-wire-{}-{name}", std::process::id()))
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
}
