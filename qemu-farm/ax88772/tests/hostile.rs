//! Hostile peers against the `ax88772-emu` binary: each drives one bound
//! (stderr nobody reads, a usbredir peer that never reads, a flood of
//! transfers, control clients that never read or never stop) and then
//! checks that the emulator's memory stayed flat and that it still serves.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usbredir::{Caps, Codec, ControlPacket, Hello, Message, Packet, Role};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ax-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Emu {
    child: Child,
    dir: PathBuf,
}

impl Emu {
    fn start(name: &str, stderr: Stdio, extra: &[&str]) -> Emu {
        let dir = tmpdir(name);
        let usb = format!("unix:{}", dir.join("usb.sock").display());
        let ready = dir.join("ready.json");
        let mut args = vec![
            "--listen".to_string(),
            usb,
            "--ready-file".into(),
            ready.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(env!("CARGO_BIN_EXE_ax88772-emu"))
            .args(&args)
            .stderr(stderr)
            .spawn()
            .unwrap();
        wait_for(&ready);
        Emu { child, dir }
    }

    fn rss_kb(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn usb(&self) -> Qemu {
        let s = UnixStream::connect(self.dir.join("usb.sock")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut q = Qemu {
            s,
            codec: Codec::new(Role::Guest, Caps(0xff)),
            id: 0,
        };
        let mut out = Vec::new();
        let h = Hello {
            version: "qemu".into(),
            caps: Caps(0xff),
            extra_caps: vec![],
        };
        q.codec
            .encode(&Packet::new(0, Message::Hello(h)), &mut out)
            .unwrap();
        q.s.write_all(&out).unwrap();
        while q.recv().msg.name() != "device_connect" {}
        q
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Qemu {
    s: UnixStream,
    codec: Codec,
    id: u64,
}

impl Qemu {
    fn encode(&mut self, m: Message) -> Vec<u8> {
        self.id += 1;
        let mut out = Vec::new();
        self.codec
            .encode(&Packet::new(self.id, m), &mut out)
            .unwrap();
        out
    }

    fn send(&mut self, m: Message) -> u64 {
        let b = self.encode(m);
        self.s.write_all(&b).unwrap();
        self.id
    }

    fn recv(&mut self) -> Packet {
        loop {
            if let Some(p) = self.codec.next_packet() {
                return p.expect("valid packet from the device");
            }
            let mut buf = [0u8; 65536];
            let n = self.s.read(&mut buf).expect("the device answers");
            assert!(n > 0, "the device closed the connection");
            self.codec.feed(&buf[..n]);
        }
    }

    /// A vendor IN request the chip does not know: STALL, and a log line.
    fn bad_request(&mut self) -> Message {
        Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            requesttype: 0xc0,
            request: 0xee,
            length: 2,
            ..Default::default()
        })
    }

    /// GET_STATUS: the device is alive and answering.
    fn ping(&mut self) {
        let id = self.send(Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            requesttype: 0x80,
            request: 0,
            length: 2,
            ..Default::default()
        }));
        loop {
            let p = self.recv();
            if p.id == id {
                let Message::ControlPacket(c) = p.msg else {
                    panic!("expected a control reply")
                };
                assert_eq!(c.data, [1, 0]);
                return;
            }
        }
    }
}

#[test]
fn a_stderr_nobody_reads_never_stalls_the_device_and_a_closed_one_never_kills_it() {
    // -v traces every usbredir message: far more than a pipe holds.
    let mut emu = Emu::start("stderr", Stdio::piped(), &["-v"]);
    let mut err = emu.child.stderr.take().unwrap();
    let mut q = emu.usb();
    let n = 20_000;
    let rss0 = emu.rss_kb();
    let mut batch = Vec::new();
    for _ in 0..n {
        let m = q.bad_request();
        batch.extend(q.encode(m));
    }
    let writer = {
        let mut s = q.s.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&batch).unwrap())
    };
    let mut stalls = 0;
    while stalls < n {
        if let Message::ControlPacket(c) = q.recv().msg {
            assert_eq!(c.status, usbredir::Status::STALL);
            stalls += 1;
        }
    }
    writer.join().unwrap();
    let rss1 = emu.rss_kb();
    eprintln!("stderr undrained: {n} STALLs answered, RSS {rss0} -> {rss1} kB");
    assert!(rss1 < rss0 + 8 * 1024, "RSS grew {rss0} -> {rss1} kB");
    // Now nobody will ever read stderr: writes fail with EPIPE.
    let mut buf = [0u8; 4096];
    let _ = err.read(&mut buf);
    drop(err);
    for _ in 0..2000 {
        let m = q.bad_request();
        q.send(m);
    }
    q.ping();
    std::thread::sleep(Duration::from_millis(100));
    assert!(emu.alive(), "the emulator died after stderr closed");
}
