//! Bulk OUT completion latency of the event loop under a paced stream:
//! the real server on one end of a socketpair, QEMU's side on the other,
//! the mock wire as the partner. Strict pacing (burst 0) at 100 Mbit/s,
//! four transfers in flight, 1514-byte frames.
//!
//! Each completion is compared with the earliest moment its frame may
//! leave: one wire time after the previous completion or after its own
//! submission, whichever is later (so a constant offset between the two
//! threads' clocks does not count, and a held completion does). Printed as
//! ratios to one frame's wire time (123 us): `late` is how long after that
//! moment the completion arrived, `total` the whole submit-to-completion
//! time. The reference in the same
//! run is the unpaced loop's submit-to-completion time.
//!
//! `BENCH_FRAMES` (default 3000) sets the frames per case.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use ax88772::descriptors::Variant;
use ax88772::device::{Device, DeviceConfig};
use ax88772::framing;
use ax88772::mac::cmd;
use ax88772::net::Conn;
use ax88772::server::{OnDisconnect, Server, UsbRole};
use ax88772::wire::mock;
use usbredir::{BulkPacket, Caps, Codec, ControlPacket, Hello, Message, Packet, Role};

const LEN: usize = 1514;
const WINDOW: usize = 4;

struct Guest {
    s: UnixStream,
    codec: Codec,
    id: u64,
}

impl Guest {
    fn send(&mut self, m: Message) -> u64 {
        self.id += 1;
        let mut b = Vec::new();
        self.codec.encode(&Packet::new(self.id, m), &mut b).unwrap();
        self.s.write_all(&b).unwrap();
        self.id
    }
    fn recv(&mut self) -> Packet {
        loop {
            if let Some(p) = self.codec.next_packet() {
                return p.unwrap();
            }
            let mut buf = [0u8; 65536];
            let n = self.s.read(&mut buf).expect("device answers within 5 s");
            assert!(n > 0, "device closed the connection");
            self.codec.feed(&buf[..n]);
        }
    }
}

fn start(paced: bool) -> (Guest, std::thread::JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0xaa, 0xbb, 0xcc]);
    cfg.paced = paced;
    cfg.pace_burst = Duration::ZERO;
    let (wire, _partner) = mock::pair();
    let dev = Device::new(cfg, Instant::now());
    let mut server = Server::new(
        dev,
        Box::new(wire),
        UsbRole::Connected,
        OnDisconnect::Exit,
        None,
    )
    .unwrap();
    server.attach(Conn::Unix(a));
    let t = std::thread::spawn(move || server.run().unwrap());
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut g = Guest {
        s: b,
        codec: Codec::new(Role::Guest, Caps(0xff)),
        id: 0,
    };
    assert_eq!(g.recv().msg.name(), "hello");
    let h = Hello {
        version: "bench".into(),
        caps: Caps(0xff),
        extra_caps: vec![],
    };
    let mut out = Vec::new();
    g.codec
        .encode(&Packet::new(0, Message::Hello(h)), &mut out)
        .unwrap();
    g.s.write_all(&out).unwrap();
    g.send(Message::SetConfiguration { configuration: 1 });
    for (req, val) in [
        (cmd::WRITE_RX_CTL, 0x0088),
        (cmd::WRITE_MEDIUM_MODE, 0x0336),
    ] {
        g.send(Message::ControlPacket(ControlPacket {
            requesttype: 0x40,
            request: req,
            value: val,
            ..Default::default()
        }));
    }
    let mut answers = 0;
    while answers < 3 {
        match g.recv().msg {
            Message::ControlPacket(_) | Message::ConfigurationStatus { .. } => answers += 1,
            _ => {}
        }
    }
    (g, t)
}

/// (late, total) per transfer, in units of the frame's wire time.
fn run(paced: bool, frames: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut g, t) = start(paced);
    let wt = framing::wire_time(LEN, 100_000_000);
    let data = framing::tx_transfer(&vec![0x02; LEN]);
    let mut inflight = std::collections::VecDeque::new();
    let mut prev = Instant::now();
    let (mut late, mut total) = (Vec::new(), Vec::new());
    let mut sent = 0;
    while late.len() < frames {
        while inflight.len() < WINDOW && sent < frames {
            let at = Instant::now();
            let id = g.send(Message::BulkPacket(BulkPacket {
                endpoint: 0x03,
                length: data.len() as u32,
                data: data.clone(),
                ..Default::default()
            }));
            inflight.push_back((id, at));
            sent += 1;
        }
        let p = g.recv();
        if !matches!(p.msg, Message::BulkPacket(_)) {
            continue;
        }
        let now = Instant::now();
        let (id, at) = inflight.pop_front().expect("a completion we asked for");
        let due = prev.max(at) + wt;
        prev = now;
        assert_eq!(id, p.id, "completions in order");
        let unit = wt.as_secs_f64();
        late.push(now.saturating_duration_since(due).as_secs_f64() / unit);
        total.push((now - at).as_secs_f64() / unit);
    }
    drop(g);
    t.join().unwrap();
    (late, total)
}

fn pct(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

fn main() {
    let frames = std::env::var("BENCH_FRAMES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    ax88772::log::set_level(0);
    let (mut late, mut total) = run(true, frames);
    let (_, mut reference) = run(false, frames);
    let (l50, l99, lmax) = pct(&mut late);
    let (t50, t99, tmax) = pct(&mut total);
    let (r50, r99, rmax) = pct(&mut reference);
    println!("bulk OUT completion latency, {frames} x {LEN}-byte frames, {WINDOW} in flight, ratios to one frame's wire time (123.04 us)");
    println!("{:<34} {:>8} {:>8} {:>8}", "case", "p50", "p99", "max");
    println!(
        "{:<34} {l50:>8.2} {l99:>8.2} {lmax:>8.2}",
        "paced: late past departure"
    );
    println!(
        "{:<34} {t50:>8.2} {t99:>8.2} {tmax:>8.2}",
        "paced: submit to completion"
    );
    println!(
        "{:<34} {r50:>8.2} {r99:>8.2} {rmax:>8.2}",
        "reference unpaced: submit to completion"
    );
    println!("paced late p99 / unpaced p99: {:.2}", l99 / r99.max(1e-9));
}
