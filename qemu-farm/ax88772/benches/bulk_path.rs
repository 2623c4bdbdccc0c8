//! Bulk path throughput without QEMU: usbredir codec (both ends), ASIX
//! framing, the device model and the mock wire, on one thread. Pacing is
//! off, so this measures how much faster than the line rate the model can
//! move frames. Prints ratios to the 100 Mbit/s line rate.
//!
//! `BENCH_SECONDS` (default 1) sets the time per case.

use std::time::{Duration, Instant};

use ax88772::descriptors::Variant;
use ax88772::device::{Device, DeviceConfig};
use ax88772::framing;
use ax88772::mac::cmd;
use ax88772::wire::{mock, Wire};
use usbredir::{BulkPacket, Caps, Codec, ControlPacket, Hello, Message, Packet, Role};

const MAC: [u8; 6] = [0x02, 0, 0, 0xaa, 0xbb, 0xcc];
const LINE_RATE: f64 = 100e6;

struct Rig {
    dev: Device,
    host: Codec,
    guest: Codec,
    wire: mock::MockWire,
    partner: mock::MockHandle,
    bytes: Vec<u8>,
    id: u64,
}

impl Rig {
    fn new() -> Rig {
        let now = Instant::now();
        let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
        cfg.paced = false;
        cfg.rx_queue_frames = 4096;
        let (wire, partner) = mock::pair();
        let mut r = Rig {
            dev: Device::new(cfg, now),
            host: Codec::new(Role::Host, ax88772::device::OUR_CAPS),
            guest: Codec::new(Role::Guest, Caps(0xff)),
            wire,
            partner,
            bytes: Vec::with_capacity(1 << 16),
            id: 1 << 40,
        };
        r.dev.transport_opened(now);
        let mut b = Vec::new();
        r.host.encode_hello("bench", &mut b).unwrap();
        r.guest.feed(&b);
        r.guest.next_packet().unwrap().unwrap();
        let h = Hello {
            version: "qemu".into(),
            caps: Caps(0xff),
            extra_caps: vec![],
        };
        b.clear();
        r.guest
            .encode(&Packet::new(0, Message::Hello(h)), &mut b)
            .unwrap();
        r.host.feed(&b);
        while let Some(p) = r.host.next_packet() {
            r.dev.handle(now, p.unwrap());
        }
        r.deliver(Message::SetConfiguration { configuration: 1 });
        for (req, v) in [
            (cmd::WRITE_RX_CTL, 0x0088),
            (cmd::WRITE_MEDIUM_MODE, 0x0336),
        ] {
            let c = ControlPacket {
                requesttype: 0x40,
                request: req,
                value: v,
                ..Default::default()
            };
            r.deliver(Message::ControlPacket(c));
        }
        r.drain();
        r
    }

    /// Guest codec -> bytes -> host codec -> device.
    fn deliver(&mut self, m: Message) {
        self.id += 1;
        self.bytes.clear();
        self.guest
            .encode(&Packet::new(self.id, m), &mut self.bytes)
            .unwrap();
        self.host.feed(&self.bytes);
        let now = Instant::now();
        while let Some(p) = self.host.next_packet() {
            self.dev.handle(now, p.unwrap());
        }
    }

    /// Device -> host codec -> bytes -> guest codec; frames to the wire.
    /// Returns (bulk completions, frames delivered in bulk IN).
    fn drain(&mut self) -> (u64, u64) {
        for f in self.dev.take_wire() {
            self.wire.send(&f);
        }
        self.bytes.clear();
        for p in self.dev.take_usb() {
            self.host.encode(&p, &mut self.bytes).unwrap();
        }
        self.guest.feed(&self.bytes);
        let (mut done, mut frames) = (0, 0);
        while let Some(p) = self.guest.next_packet() {
            if let Message::BulkPacket(b) = p.unwrap().msg {
                done += 1;
                let mut d = &b.data[..];
                while d.len() >= 4 {
                    let len = usize::from(u16::from_le_bytes([d[0], d[1]]) & 0x7ff);
                    d = &d[(4 + len + (len & 1)).min(d.len())..];
                    frames += 1;
                }
            }
        }
        (done, frames)
    }
}

fn frame(len: usize) -> Vec<u8> {
    let mut f = MAC.to_vec();
    f.extend((6..len).map(|i| i as u8));
    f
}

fn line_fps(len: usize) -> f64 {
    LINE_RATE / ((len.max(60) + 4 + 8 + 12) as f64 * 8.0)
}

fn report(dir: &str, label: &str, len: usize, frames: u64, el: Duration) -> f64 {
    let fps = frames as f64 / el.as_secs_f64();
    let mbps = fps * len as f64 * 8.0 / 1e6;
    let ratio = fps / line_fps(len);
    println!(
        "bulk_path {dir} {label:>10}: {fps:>10.0} frames/s {mbps:>9.1} Mbit/s  ratio {ratio:>7.1}x the 100 Mbit/s line rate ({:.0} frames/s)",
        line_fps(len)
    );
    ratio
}

fn bench_tx(len: usize, budget: Duration) -> (u64, Duration) {
    let mut r = Rig::new();
    let transfer = framing::tx_transfer(&frame(len));
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..256 {
            let b = BulkPacket {
                endpoint: 0x03,
                length: transfer.len() as u32,
                data: transfer.clone(),
                ..Default::default()
            };
            r.deliver(Message::BulkPacket(b));
            let (done, _) = r.drain();
            assert_eq!(done, 1, "every OUT completes");
        }
        n += 256;
        let sent = r.partner.take_sent();
        assert_eq!(sent.len(), 256);
        assert_eq!(sent[0].len(), len);
    }
    (n, start.elapsed())
}

fn bench_rx(len: usize, budget: Duration) -> (u64, Duration) {
    let mut r = Rig::new();
    let f = frame(len);
    // usbnet keeps up to 44 2048-byte requests posted.
    for _ in 0..44 {
        r.deliver(Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: 2048,
            ..Default::default()
        }));
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..256 {
            r.dev.wire_frame(Instant::now(), f.clone());
            let (done, frames) = r.drain();
            n += frames;
            for _ in 0..done {
                r.deliver(Message::BulkPacket(BulkPacket {
                    endpoint: 0x82,
                    length: 2048,
                    ..Default::default()
                }));
            }
        }
    }
    (n, start.elapsed())
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let budget = Duration::from_secs_f64(secs);
    ax88772::log::set_level(0);
    let mut worst = f64::MAX;
    for (label, len) in [("1514-byte", 1514), ("64-byte", 60)] {
        let (n, el) = bench_tx(len, budget);
        worst = worst.min(report("tx", label, len, n, el));
        let (n, el) = bench_rx(len, budget);
        worst = worst.min(report("rx", label, len, n, el));
    }
    println!("bulk_path lowest ratio: {worst:.1}x (target >= 10x)");
}
