//! QEMU's side of a usbredir session for tests that drive the event loop
//! by hand: a non-blocking socket, the guest-role codec, and a clock the
//! test advances itself.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ax88772::descriptors::Variant;
use ax88772::device::{Device, DeviceConfig};
use ax88772::mac::cmd;
use ax88772::net::Conn;
use ax88772::server::{OnDisconnect, Server, UsbRole};
use ax88772::wire::mock::{self, MockHandle};
use usbredir::{Caps, Codec, ControlPacket, Hello, Message, Packet, Role};

pub const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

/// A clock the test sets; the server reads it for every event.
#[derive(Clone)]
pub struct FakeClock(Arc<Mutex<Instant>>);

impl FakeClock {
    pub fn new(t: Instant) -> FakeClock {
        FakeClock(Arc::new(Mutex::new(t)))
    }
    pub fn set(&self, t: Instant) {
        *self.0.lock().unwrap() = t;
    }
    pub fn get(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

pub struct Peer {
    pub s: UnixStream,
    pub codec: Codec,
    pub next_id: u64,
}

impl Peer {
    pub fn send(&mut self, msg: Message) -> u64 {
        self.next_id += 1;
        let mut out = Vec::new();
        self.codec
            .encode(&Packet::new(self.next_id, msg), &mut out)
            .unwrap();
        self.s.set_nonblocking(false).unwrap();
        self.s.write_all(&out).unwrap();
        self.s.set_nonblocking(true).unwrap();
        self.next_id
    }

    /// Every packet the device has written so far.
    pub fn take(&mut self) -> Vec<Packet> {
        let mut buf = [0u8; 65536];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.codec.feed(&buf[..n]),
                Err(_) => break,
            }
        }
        let mut v = Vec::new();
        while let Some(p) = self.codec.next_packet() {
            v.push(p.expect("device sent a valid packet"));
        }
        v
    }

    pub fn control(&mut self, requesttype: u8, request: u8, value: u16) -> u64 {
        self.send(Message::ControlPacket(ControlPacket {
            endpoint: requesttype & 0x80,
            request,
            requesttype,
            value,
            ..Default::default()
        }))
    }
}

/// A server on one end of a socketpair with the mock wire, the clock
/// under the test's control, and QEMU's side on the other end.
pub fn rig(cfg: DeviceConfig, t0: Instant) -> (Server, Peer, MockHandle, FakeClock) {
    let (a, b) = UnixStream::pair().unwrap();
    let (wire, handle) = mock::pair();
    let dev = Device::new(cfg, t0);
    let mut server = Server::new(
        dev,
        Box::new(wire),
        UsbRole::Connected,
        OnDisconnect::Exit,
        None,
    )
    .unwrap();
    let clock = FakeClock::new(t0);
    let c = clock.clone();
    server.set_clock(Box::new(move || c.get()));
    server.attach(Conn::Unix(a));
    b.set_nonblocking(true).unwrap();
    let peer = Peer {
        s: b,
        codec: Codec::new(Role::Guest, Caps(0xff)),
        next_id: 0,
    };
    (server, peer, handle, clock)
}

pub fn config(paced: bool) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
    cfg.paced = paced;
    cfg
}

/// Hello, configuration 1, RX on at 100 Mbit/s full duplex; replies taken.
pub fn bring_up(server: &mut Server, peer: &mut Peer) {
    let now = server.now();
    server.prepare(now);
    let hello = peer.take();
    assert_eq!(hello.first().map(|p| p.msg.name()), Some("hello"));
    let mut out = Vec::new();
    let h = Hello {
        version: "test".into(),
        caps: Caps(0xff),
        extra_caps: vec![],
    };
    peer.codec
        .encode(&Packet::new(0, Message::Hello(h)), &mut out)
        .unwrap();
    peer.s.write_all(&out).unwrap();
    peer.send(Message::SetConfiguration { configuration: 1 });
    peer.control(0x40, cmd::WRITE_RX_CTL, 0x0088);
    peer.control(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336);
    let mut got = 0;
    for _ in 0..100 {
        server.step().unwrap();
        got += peer
            .take()
            .iter()
            .filter(|p| matches!(p.msg, Message::ControlPacket(_)))
            .count();
        if got == 2 {
            return;
        }
    }
    panic!("device did not answer the bring-up requests");
}
