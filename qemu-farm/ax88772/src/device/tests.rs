//! Session-level tests of the device, all driving one `Device` through
//! usbredir packets and wire frames: the helpers here, the tests by topic
//! beside them (`session`, `tx`, `rx`, `endpoints`, `link`, `wire`).

use super::*;
use crate::descriptors::Variant;
use crate::framing;
use crate::impair::ImpairConfig;
use crate::mac::cmd;
use crate::nic::RxMode;
use usbredir::{ControlPacket, Hello};

mod endpoints;
mod link;
mod rx;
mod session;
mod tx;
mod wire;

const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

fn hello() -> Packet {
    Packet::new(
        0,
        Message::Hello(Hello {
            version: "qemu".into(),
            caps: Caps(0xff),
            extra_caps: vec![],
        }),
    )
}

fn ctrl(
    requesttype: u8,
    request: u8,
    value: u16,
    index: u16,
    length: u16,
    data: Vec<u8>,
) -> Message {
    Message::ControlPacket(ControlPacket {
        endpoint: requesttype & 0x80,
        request,
        requesttype,
        value,
        index,
        length,
        data,
        ..Default::default()
    })
}

fn bulk_in(len: u32) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint: EP_BULK_IN,
        length: len,
        ..Default::default()
    })
}

fn bulk_out(data: Vec<u8>) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint: EP_BULK_OUT,
        length: data.len() as u32,
        data,
        ..Default::default()
    })
}

fn frame(dst: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend((6..len).map(|i| i as u8));
    f
}

/// `n` copies of a TX transfer's `one` record, back to back: one bulk OUT.
fn repeated(one: &[u8], n: usize) -> Vec<u8> {
    one.iter().copied().cycle().take(one.len() * n).collect()
}

struct T {
    d: Device,
    t: Instant,
}

impl T {
    fn new(paced: bool) -> T {
        let t = Instant::now();
        let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
        cfg.paced = paced;
        let mut d = Device::new(cfg, t);
        d.transport_opened(t);
        T { d, t }
    }

    fn send(&mut self, id: u64, m: Message) -> Vec<Packet> {
        self.d.handle(self.t, Packet::new(id, m));
        self.d.take_usb()
    }

    /// Hello, configuration, RX enabled at 100 Mbit/s.
    fn up(paced: bool) -> T {
        let mut t = T::new(paced);
        t.send(0, hello().msg);
        t.send(1, Message::SetConfiguration { configuration: 1 });
        t.send(2, ctrl(0x40, cmd::WRITE_RX_CTL, 0x0088, 0, 0, vec![]));
        t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336, 0, 0, vec![]));
        t
    }
}

/// Take MDIO (SET_SW_MII) and write PHY register `reg`: requests `id`
/// and `id + 1`.
fn mdio_write(t: &mut T, id: u64, reg: u16, v: u16) {
    t.send(id, ctrl(0x40, cmd::SET_SW_MII, 0, 0, 0, vec![]));
    t.send(
        id + 1,
        ctrl(
            0x40,
            cmd::WRITE_MII_REG,
            0x10,
            reg,
            2,
            v.to_le_bytes().to_vec(),
        ),
    );
}

fn bulk_reply(p: &Packet) -> &BulkPacket {
    match &p.msg {
        Message::BulkPacket(b) => b,
        m => panic!("expected bulk_packet, got {}", m.name()),
    }
}

fn ctl(t: &mut T, line: &str) -> serde_json::Value {
    let env = crate::ctl::CtlEnv::bare(serde_json::json!({}));
    serde_json::from_str(&crate::ctl::handle_line(&mut t.d, t.t, line, &env)).unwrap()
}
