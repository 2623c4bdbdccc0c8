//! Bulk OUT completion latency of the event loop under a paced stream:
//! the real server on one end of a socketpair, QEMU's side on the other,
//! the mock wire as the partner. Strict pacing (burst 0) at 100 Mbit/s.
//! Two cases: a stream of 1514-byte frames with four transfers in flight,
//! and bursts of 32 minimum-size frames written at once (the loop reads a
//! whole burst in one go, and the frames' deadlines pass while it does).
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
const SMALL: usize = 60;
const BURST: usize = 32;

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

/// (late, total) per transfer, in units of the frame's wire time. With
/// `burst`, `window` transfers are written at once and all awaited.
fn run(paced: bool, frames: usize, len: usize, window: usize, burst: bool) -> (Vec<f64>, Vec<f64>) {
    let (mut g, t) = start(paced);
    let wt = framing::wire_time(len, 100_000_000);
    let data = framing::tx_transfer(&vec![0x02; len]);
    let mut inflight = std::collections::VecDeque::new();
    let mut prev = Instant::now();
    let (mut late, mut total) = (Vec::new(), Vec::new());
    let mut sent = 0;
    while late.len() < frames {
        if !burst || inflight.is_empty() {
            let mut bytes = Vec::new();
            let at = Instant::now();
            while inflight.len() < window && sent < frames {
                g.id += 1;
                let m = Message::BulkPacket(BulkPacket {
                    endpoint: 0x03,
                    length: data.len() as u32,
                    data: data.clone(),
                    ..Default::default()
                });
                g.codec.encode(&Packet::new(g.id, m), &mut bytes).unwrap();
                inflight.push_back((g.id, at));
                sent += 1;
            }
            g.s.write_all(&bytes).unwrap();
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
    let (mut late, mut total) = run(true, frames, LEN, WINDOW, false);
    let (_, mut reference) = run(false, frames, LEN, WINDOW, false);
    let (mut blate, mut btotal) = run(true, frames, SMALL, BURST, true);
    let row = |name: &str, v: &mut Vec<f64>| {
        let (a, b, c) = pct(v);
        println!("{name:<44} {a:>8.2} {b:>8.2} {c:>8.2}");
        b
    };
    println!(
        "bulk OUT completion latency, {frames} transfers per case, ratios to the frame's wire time"
    );
    println!(
        "({LEN} bytes: 123.04 us, {WINDOW} in flight; {SMALL} bytes: 6.72 us, bursts of {BURST})"
    );
    println!("{:<44} {:>8} {:>8} {:>8}", "case", "p50", "p99", "max");
    let l99 = row("paced 1514: late past departure", &mut late);
    row("paced 1514: submit to completion", &mut total);
    let r99 = row(
        "reference unpaced 1514: submit to completion",
        &mut reference,
    );
    row("paced 60, bursts: late past departure", &mut blate);
    row("paced 60, bursts: submit to completion", &mut btotal);
    println!("paced late p99 / unpaced p99: {:.2}", l99 / r99.max(1e-9));
}
