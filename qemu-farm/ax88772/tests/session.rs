//! Plays QEMU's side of a usbredir session against the emulator's event
//! loop over a socketpair, with the mock wire as the link partner.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ax88772::descriptors::Variant;
use ax88772::device::{Counters, Device, DeviceConfig};
use ax88772::framing;
use ax88772::mac::cmd;
use ax88772::net::Conn;
use ax88772::server::{OnDisconnect, Server, UsbRole};
use ax88772::wire::mock::{self, MockHandle};
use usbredir::*;

const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

struct Qemu {
    s: UnixStream,
    codec: Codec,
    next_id: u64,
}

impl Qemu {
    fn send(&mut self, msg: Message) -> u64 {
        self.next_id += 0x1000_0000_0001; // wide ids, as xHCI uses
        let mut out = Vec::new();
        self.codec
            .encode(&Packet::new(self.next_id, msg), &mut out)
            .unwrap();
        self.s.write_all(&out).unwrap();
        self.next_id
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    fn recv(&mut self) -> Packet {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = self.codec.next_packet() {
                return r.expect("device sent a valid packet");
            }
            assert!(Instant::now() < deadline, "no packet from the device");
            let mut buf = [0u8; 8192];
            match self.s.read(&mut buf) {
                Ok(0) => panic!("device closed the connection"),
                Ok(n) => self.codec.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn expect(&mut self, name: &str) -> Packet {
        let p = self.recv();
        assert_eq!(p.msg.name(), name, "got {:?}", p.msg);
        p
    }

    fn control(
        &mut self,
        requesttype: u8,
        request: u8,
        value: u16,
        index: u16,
        length: u16,
        data: Vec<u8>,
    ) -> ControlPacket {
        let id = self.send(Message::ControlPacket(ControlPacket {
            endpoint: requesttype & 0x80,
            request,
            requesttype,
            value,
            index,
            length,
            data,
            ..Default::default()
        }));
        let p = self.expect("control_packet");
        assert_eq!(p.id, id, "replies carry the request id");
        match p.msg {
            Message::ControlPacket(c) => c,
            _ => unreachable!(),
        }
    }

    fn vin(&mut self, request: u8, value: u16, index: u16, length: u16) -> Vec<u8> {
        let c = self.control(0xc0, request, value, index, length, vec![]);
        assert_eq!(c.status, Status::SUCCESS, "IN {request:#04x}");
        assert_eq!(
            c.data.len(),
            usize::from(length),
            "exact length for {request:#04x}"
        );
        c.data
    }

    fn vout(&mut self, request: u8, value: u16, index: u16, data: Vec<u8>) {
        let len = data.len() as u16;
        let c = self.control(0x40, request, value, index, len, data);
        assert_eq!(c.status, Status::SUCCESS, "OUT {request:#04x}");
    }

    fn mdio_read(&mut self, phy: u16, reg: u16) -> u16 {
        self.vout(cmd::SET_SW_MII, 0, 0, vec![]);
        assert_eq!(self.vin(cmd::STATMNGSTS_REG, 0, 0, 1)[0] & 1, 1);
        let v = self.vin(cmd::READ_MII_REG, phy, reg, 2);
        self.vout(cmd::SET_HW_MII, 0, 0, vec![]);
        u16::from_le_bytes([v[0], v[1]])
    }

    fn mdio_write(&mut self, phy: u16, reg: u16, val: u16) {
        self.vout(cmd::SET_SW_MII, 0, 0, vec![]);
        self.vout(cmd::WRITE_MII_REG, phy, reg, val.to_le_bytes().to_vec());
        self.vout(cmd::SET_HW_MII, 0, 0, vec![]);
    }
}

/// A path in a fresh directory the emulator creates (0700) itself.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ax-session-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d.join(name)
}

fn start(ctl: Option<PathBuf>) -> (Qemu, MockHandle, std::thread::JoinHandle<Counters>) {
    let (a, b) = UnixStream::pair().unwrap();
    let (wire, handle) = mock::pair();
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
    cfg.paced = true;
    let dev = Device::new(cfg, Instant::now());
    let mut server = Server::new(
        dev,
        Box::new(wire),
        UsbRole::Connected,
        OnDisconnect::Exit,
        ctl,
    )
    .unwrap();
    server.attach(Conn::Unix(a));
    let t = std::thread::spawn(move || {
        server.run().unwrap();
        server.device().counters().clone()
    });
    b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let q = Qemu {
        s: b,
        codec: Codec::new(Role::Guest, Caps(0xff)),
        next_id: 0,
    };
    (q, handle, t)
}

fn hello_and_connect(q: &mut Qemu) {
    let mut out = Vec::new();
    q.codec
        .encode(
            &Packet::new(
                0,
                Message::Hello(Hello {
                    version: "qemu usb-redir guest 7.2.22".into(),
                    caps: Caps(0xff),
                    extra_caps: vec![],
                }),
            ),
            &mut out,
        )
        .unwrap();
    q.raw(&out);
    let h = q.expect("hello");
    let Message::Hello(h) = h.msg else {
        unreachable!()
    };
    assert_eq!(h.caps, Caps(0x7a));
    assert_eq!(q.codec.header_len(), 16);
    q.expect("interface_info");
    let ep = q.expect("ep_info");
    let Message::EpInfo(ep) = ep.msg else {
        unreachable!()
    };
    assert_eq!(ep.max_packet_size[ep_index(0x82)], 512);
    let dc = q.expect("device_connect");
    let Message::DeviceConnect(dc) = dc.msg else {
        unreachable!()
    };
    assert_eq!((dc.vendor_id, dc.product_id), (0x0b95, 0x772a));
}

/// Enumeration and the AX88772A bind sequence as Linux 6.12 sends them.
fn enumerate_and_bind(q: &mut Qemu) {
    q.send(Message::Reset);
    q.send(Message::Reset);
    let d = q.control(0x80, 6, 0x0100, 0, 64, vec![]);
    assert_eq!(d.data.len(), 18);
    assert_eq!(&d.data[8..12], &[0x95, 0x0b, 0x2a, 0x77]);
    let c = q.control(0x80, 6, 0x0200, 0, 39, vec![]);
    assert_eq!(c.data.len(), 39);
    for i in [0u16, 2, 1, 3] {
        let s = q.control(0x80, 6, 0x0300 | i, 0x0409, 255, vec![]);
        assert_eq!(s.status, Status::SUCCESS);
        assert_eq!(usize::from(s.data[0]), s.data.len());
    }
    let id = q.send(Message::SetConfiguration { configuration: 1 });
    q.expect("interface_info");
    q.expect("ep_info");
    let st = q.expect("configuration_status");
    assert_eq!(
        (st.id, st.msg),
        (
            id,
            Message::ConfigurationStatus {
                status: Status::SUCCESS,
                configuration: 1
            }
        )
    );
    q.send(Message::SetAltSetting {
        interface: 0,
        alt: 0,
    });
    q.expect("interface_info");
    q.expect("ep_info");
    let st = q.expect("alt_setting_status");
    assert_eq!(
        st.msg,
        Message::AltSettingStatus {
            status: Status::SUCCESS,
            interface: 0,
            alt: 0
        }
    );

    assert_eq!(q.vin(cmd::READ_NODE_ID, 0, 0, 6), MAC);
    assert_eq!(q.vin(cmd::READ_PHY_ID, 0, 0, 2)[1], 0x10);
    assert_eq!(q.vin(cmd::STATMNGSTS_REG, 0, 0, 1)[0] & 0x70, 0x10);
    q.vout(cmd::WRITE_GPIOS, 0x0080, 0, vec![]);
    q.vout(cmd::SW_PHY_SELECT, 0x0011, 0, vec![]);
    // ax88772a_hw_reset's sequence with its sleeps: the PHY is reachable
    // again when the driver goes on.
    for (v, ms) in [(0x0060, 10), (0x0020, 160), (0x0000, 0), (0x0020, 200)] {
        q.vout(cmd::SW_RESET, v, 0, vec![]);
        std::thread::sleep(Duration::from_millis(ms));
    }
    for (reg, want) in [(0x14, 0x442c), (0x15, 0x03c8), (0x16, 0x4044)] {
        assert_eq!(q.mdio_read(0, reg), want, "address 0 aliases the PHY");
    }
    q.vout(cmd::WRITE_IPG0, 0x001d, 0x0012, vec![]);
    q.vout(cmd::WRITE_NODE_ID, 0, 0, MAC.to_vec());
    q.vout(cmd::WRITE_RX_CTL, 0x0088, 0, vec![]);
    q.vout(cmd::WRITE_MEDIUM_MODE, 0x0306, 0, vec![]);
    q.vout(cmd::WRITE_RX_CTL, 0x0088, 0, vec![]);
    assert_eq!(q.vin(cmd::READ_RX_CTL, 0, 0, 2), [0x88, 0x00]);
    assert_eq!(q.vin(cmd::READ_MEDIUM_STATUS, 0, 0, 2), [0x06, 0x03]);
    assert_eq!(q.mdio_read(0x10, 2), 0x003b);
    assert_eq!(q.mdio_read(0x10, 3), 0x1861);
    // The SW_RESET sequence dropped the link: LSTATUS is latched low once.
    assert_eq!(q.mdio_read(0x10, 1), 0x7829);
    assert_eq!(q.mdio_read(0x10, 1), 0x782d);
    // soft reset, then ifup's autonegotiation
    q.mdio_write(0x10, 0, 0x0000);
    q.mdio_write(0x10, 0, 0x8200);
    // phy_poll_reset sleeps 50 ms before it first reads BMCR.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(q.mdio_read(0x10, 0) & 0x8000, 0);
    q.mdio_write(0x10, 4, 0x0de1);
    q.mdio_write(0x10, 0, 0x3300);
    // BMCR 0 forced 10/half under a live link, the reset brought 100/full
    // back: the retrain shows once in the latched-low link status.
    assert_eq!(q.mdio_read(0x10, 1) & 0x0004, 0, "retrain latched");
    assert_eq!(
        q.mdio_read(0x10, 1) & 0x0024,
        0x0024,
        "link and aneg complete"
    );
    assert_eq!(q.mdio_read(0x10, 5), 0x45e1);
    q.vout(cmd::WRITE_MEDIUM_MODE, 0x0336, 0, vec![]);
}

fn frame(dst: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend((6..len).map(|i| (i * 7) as u8));
    f
}

#[test]
fn full_session_over_a_socketpair() {
    let ctl = tmp("ctl.sock");
    let (mut q, wire, t) = start(Some(ctl.clone()));
    hello_and_connect(&mut q);
    enumerate_and_bind(&mut q);

    // Bulk OUT: the 508-byte frame with its pad reaches the wire.
    let f = frame([0xff; 6], 508);
    let data = framing::tx_transfer(&f);
    assert_eq!(data.len(), 516);
    let id = q.send(Message::BulkPacket(BulkPacket {
        endpoint: 0x03,
        length: 516,
        data,
        ..Default::default()
    }));
    let r = q.expect("bulk_packet");
    let Message::BulkPacket(b) = r.msg else {
        unreachable!()
    };
    assert_eq!(
        (r.id, b.endpoint, b.status, b.length, b.data.len()),
        (id, 0x03, Status::SUCCESS, 516, 0)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut sent = Vec::new();
    while sent.is_empty() && Instant::now() < deadline {
        sent = wire.take_sent();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(sent, vec![f]);

    // A frame from the partner arrives as bulk IN; two requests complete in order.
    let in1 = q.send(Message::BulkPacket(BulkPacket {
        endpoint: 0x82,
        length: 2048,
        ..Default::default()
    }));
    let in2 = q.send(Message::BulkPacket(BulkPacket {
        endpoint: 0x82,
        length: 2048,
        ..Default::default()
    }));
    wire.inject(frame(MAC, 61));
    let r = q.expect("bulk_packet");
    let Message::BulkPacket(b) = r.msg else {
        unreachable!()
    };
    assert_eq!(r.id, in1);
    assert_eq!(b.data.len(), 4 + 61 + 1);
    assert_eq!(&b.data[..4], &framing::header(61));
    assert_eq!(&b.data[4..65], frame(MAC, 61).as_slice());

    // Cancel the second request.
    q.send_cancel(in2);
    let r = q.expect("bulk_packet");
    let Message::BulkPacket(b) = r.msg else {
        unreachable!()
    };
    assert_eq!((r.id, b.status), (in2, Status::CANCELLED));

    // Garbage from QEMU's side is refused and the session goes on.
    let mut junk = 999u32.to_le_bytes().to_vec();
    junk.extend(3u32.to_le_bytes());
    junk.extend(7u64.to_le_bytes());
    junk.extend([1, 2, 3]);
    q.raw(&junk);
    let d = q.control(0xc0, 0x77, 0, 0, 2, vec![]);
    assert_eq!(d.status, Status::STALL, "unknown vendor request");
    assert_eq!(q.vin(cmd::READ_NODE_ID, 0, 0, 6), MAC);

    // Control socket: garbage, then counters.
    let mut c = UnixStream::connect(&ctl).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"this is not json\n{\"cmd\":\"counters\"}\n")
        .unwrap();
    let mut lines = BufReader::new(c.try_clone().unwrap()).lines();
    let e: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(e["ok"], false);
    let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["counters"]["tx_frames"], 1);
    assert_eq!(v["counters"]["rx_frames"], 1);
    assert_eq!(v["counters"]["usbredir_errors"], 1);
    assert!(v["mdio_reads"]["0x01"].as_u64().unwrap() >= 2);
    // Link down through the control socket is visible over MDIO (latched).
    c.write_all(b"{\"cmd\":\"link\",\"up\":false}\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(v["phy"]["state"], "link_down");
    assert_eq!(q.mdio_read(0x10, 1) & 0x0004, 0);

    // QEMU goes away: the loop ends (--on-disconnect exit).
    drop(q);
    let counters = t.join().unwrap();
    assert_eq!(counters.bulk_cancelled, 1);
    assert!(!ctl.exists(), "control socket removed on exit");
}

#[test]
fn oversized_length_closes_the_connection() {
    let (mut q, _wire, t) = start(None);
    hello_and_connect(&mut q);
    let mut bad = 101u32.to_le_bytes().to_vec();
    bad.extend(u32::MAX.to_le_bytes());
    bad.extend(1u64.to_le_bytes());
    q.raw(&bad);
    let counters = t.join().unwrap();
    assert_eq!(counters.usbredir_errors, 1);
    let mut buf = [0u8; 16];
    q.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    assert_eq!(q.s.read(&mut buf).unwrap(), 0, "device closed its end");
}

trait Cancel {
    fn send_cancel(&mut self, id: u64);
}

impl Cancel for Qemu {
    fn send_cancel(&mut self, id: u64) {
        let mut out = Vec::new();
        self.codec
            .encode(&Packet::new(id, Message::CancelDataPacket), &mut out)
            .unwrap();
        self.s.write_all(&out).unwrap();
    }
}
