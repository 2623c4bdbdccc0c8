//! Hostile peers against the `ax88772-emu` binary: each drives one bound
//! (stderr nobody reads, a usbredir peer that never reads, a flood of
//! transfers, control clients that never read or never stop) and then
//! checks that the emulator's memory stayed flat and that it still serves.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usbredir::{BulkPacket, Caps, Codec, ControlPacket, Hello, Message, Packet, Role, Status};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ax-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // The control socket wants a directory only we can enter.
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
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
        let ctl = dir.join("ctl.sock").display().to_string();
        args.extend(extra.iter().map(|s| {
            if *s == "CTL" {
                ctl.clone()
            } else {
                s.to_string()
            }
        }));
        let child = Command::new(env!("CARGO_BIN_EXE_ax88772-emu"))
            .args(&args)
            .stderr(stderr)
            .spawn()
            .unwrap();
        wait_for(&ready);
        Emu { child, dir }
    }

    fn ctl(&self) -> Ctl {
        let s = UnixStream::connect(self.dir.join("ctl.sock")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Ctl { s, buf: Vec::new() }
    }

    /// CPU time (user + system) the emulator used so far, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let rest = &s[s.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
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

    /// Configuration 1, RX on, 100 Mbit/s full duplex.
    fn configure(&mut self) {
        self.send(Message::SetConfiguration { configuration: 1 });
        for (req, val) in [(0x10, 0x0088), (0x1b, 0x0336)] {
            self.send(Message::ControlPacket(ControlPacket {
                requesttype: 0x40,
                request: req,
                value: val,
                ..Default::default()
            }));
        }
        let mut n = 0;
        while n < 3 {
            if matches!(
                self.recv().msg,
                Message::ControlPacket(_) | Message::ConfigurationStatus { .. }
            ) {
                n += 1;
            }
        }
    }

    /// Write `bytes` from another thread (a peer that writes regardless).
    fn write_behind(&self, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
        let mut s = self.s.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&bytes).unwrap())
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

struct Ctl {
    s: UnixStream,
    buf: Vec<u8>,
}

impl Ctl {
    fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = self.buf.drain(..=i).collect();
                return String::from_utf8(l).unwrap();
            }
            let mut b = [0u8; 65536];
            let n = self.s.read(&mut b).expect("a reply");
            if n == 0 {
                return String::new();
            }
            self.buf.extend_from_slice(&b[..n]);
        }
    }

    fn ask(&mut self, req: &str) -> String {
        self.s.write_all(format!("{req}\n").as_bytes()).unwrap();
        self.line()
    }
}

fn grew(name: &str, before: u64, after: u64) {
    eprintln!("{name}: RSS {before} -> {after} kB");
    assert!(
        after < before + 8 * 1024,
        "{name}: RSS grew {before} -> {after} kB"
    );
}

#[test]
fn a_paced_bulk_out_flood_meets_back_pressure_and_every_transfer_completes() {
    let emu = Emu::start("outflood", Stdio::null(), &["--quiet"]);
    let mut q = emu.usb();
    q.configure();
    let data = ax88772::framing::tx_transfer(&[0x02u8; 1514]);
    let n = 20_000;
    let mut bytes = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let m = Message::BulkPacket(BulkPacket {
            endpoint: 0x03,
            length: data.len() as u32,
            data: data.clone(),
            ..Default::default()
        });
        bytes.extend(q.encode(m));
        ids.push(q.id);
    }
    let rss0 = emu.rss_kb();
    let w = q.write_behind(bytes);
    let mut done = 0;
    let mut peak = rss0;
    while done < n {
        let p = q.recv();
        if let Message::BulkPacket(b) = p.msg {
            assert_eq!(b.status, Status::SUCCESS);
            assert_eq!(p.id, ids[done], "completions in order");
            done += 1;
            if done % 2000 == 0 {
                peak = peak.max(emu.rss_kb());
            }
        }
    }
    w.join().unwrap();
    grew("bulk OUT flood (30 MB)", rss0, peak);
}

/// A peer that sends 4 MiB bulk OUTs of valid frames as fast as the
/// emulator reads them and never reads an answer: what the emulator holds
/// (waiting transfers, the TX queue, the decoder's buffer, answers for
/// QEMU) stays bounded in bytes. `AX88772_FLOOD_SECS` sets the duration
/// (5 s by default).
#[test]
fn a_flood_of_4_mib_bulk_outs_never_read_stays_under_32_mib() {
    let secs: u64 = std::env::var("AX88772_FLOOD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let emu = Emu::start("bigflood", Stdio::null(), &["--quiet"]);
    let mut q = emu.usb();
    q.configure();
    let one = ax88772::framing::tx_transfer(&[0x02u8; 1514]);
    let data: Vec<u8> = one.iter().copied().cycle().take(one.len() * 2760).collect();
    let m = Message::BulkPacket(BulkPacket {
        endpoint: 0x03,
        length: data.len() as u32,
        data,
        ..Default::default()
    });
    let mut packet = q.encode(m);
    let rss0 = emu.rss_kb();
    let mut s = q.s.try_clone().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            // A fresh id each time (bytes 8..16 of the header).
            packet[8..16].copy_from_slice(&(1000 + n).to_le_bytes());
            if s.write_all(&packet).is_err() {
                break;
            }
            n += 1;
        }
        n
    });
    let end = Instant::now() + Duration::from_secs(secs);
    let mut peak = rss0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(emu.rss_kb());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!("4 MiB bulk OUT flood, {secs} s, never read: RSS {rss0} -> peak {peak} kB");
    assert!(peak < 32 * 1024, "RSS peaked at {peak} kB");
    assert!(peak < rss0 + 24 * 1024, "RSS grew {rss0} -> {peak} kB");
    drop(emu);
    let n = writer.join().unwrap();
    assert!(n >= 2, "the peer got {n} transfers in");
}

#[test]
fn a_usbredir_peer_that_never_reads_gets_back_pressure_then_every_answer() {
    let emu = Emu::start("noread", Stdio::null(), &["--quiet"]);
    let mut q = emu.usb();
    let n = 300_000;
    let mut bytes = Vec::new();
    for _ in 0..n {
        let m = Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            requesttype: 0x80,
            request: 0,
            length: 2,
            ..Default::default()
        });
        bytes.extend(q.encode(m));
    }
    let rss0 = emu.rss_kb();
    let w = q.write_behind(bytes);
    std::thread::sleep(Duration::from_millis(1500));
    let rss1 = emu.rss_kb();
    let mut got = 0;
    while got < n {
        if let Message::ControlPacket(c) = q.recv().msg {
            assert_eq!(c.data, [1, 0]);
            got += 1;
        }
    }
    w.join().unwrap();
    grew("usbredir peer not reading (300k replies)", rss0, rss1);
    q.ping();
}

#[test]
fn pending_bulk_ins_are_bounded_and_cancels_are_cheap() {
    let emu = Emu::start("inflood", Stdio::null(), &["--quiet"]);
    let mut q = emu.usb();
    q.configure();
    let n = 60_000u64;
    let mut bytes = Vec::new();
    let first = q.id + 1;
    for _ in 0..n {
        let m = Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: 2048,
            ..Default::default()
        });
        bytes.extend(q.encode(m));
    }
    for id in first..first + n {
        let mut out = Vec::new();
        q.codec
            .encode(&Packet::new(id, Message::CancelDataPacket), &mut out)
            .unwrap();
        bytes.extend(out);
    }
    let rss0 = emu.rss_kb();
    let w = q.write_behind(bytes);
    let (mut refused, mut cancelled) = (0, 0);
    while refused + cancelled < n {
        if let Message::BulkPacket(b) = q.recv().msg {
            match b.status {
                Status::IOERROR => refused += 1,
                Status::CANCELLED => cancelled += 1,
                s => panic!("unexpected status {s:?}"),
            }
        }
    }
    w.join().unwrap();
    assert_eq!(cancelled, 1024, "the bound of pending bulk INs");
    assert_eq!(refused, n - 1024);
    grew("60k bulk INs and cancels", rss0, emu.rss_kb());
    q.ping();
}

#[test]
fn control_clients_are_capped_and_usbredir_still_connects_under_a_low_fd_limit() {
    let dir = tmpdir("ctlcap");
    let ready = dir.join("ready.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ax88772-emu"));
    cmd.args(["--quiet", "--listen"])
        .arg(format!("unix:{}", dir.join("usb.sock").display()))
        .arg("--ctl")
        .arg(dir.join("ctl.sock"))
        .arg("--ready-file")
        .arg(&ready)
        .stderr(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let l = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    wait_for(&ready);
    let emu = Emu { child, dir };
    let rss0 = emu.rss_kb();
    let mut held: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(emu.dir.join("ctl.sock")).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let cpu0 = emu.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1000));
    let busy = emu.cpu_ticks() - cpu0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        busy * 2 < hz,
        "the loop spun: {busy} ticks of {hz} in a second"
    );
    let mut refused = 0;
    for s in &mut held[16..] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        assert!(r.contains("too many control clients"), "{r}");
        refused += 1;
    }
    assert_eq!(refused, 200 - 16);
    let mut q = emu.usb();
    q.ping();
    held.truncate(16);
    let mut c = Ctl {
        s: held.pop().unwrap(),
        buf: Vec::new(),
    };
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(c.ask(r#"{"cmd":"ping"}"#).contains(r#""ok":true"#));
    grew("200 control connections", rss0, emu.rss_kb());
}

#[test]
fn a_control_client_that_never_reads_waits_and_others_are_served() {
    let emu = Emu::start("ctlnoread", Stdio::null(), &["--quiet", "--ctl", "CTL"]);
    let mut slow = emu.ctl();
    let n = 20_000;
    let req = r#"{"cmd":"describe"}"#.to_string() + "\n";
    let bytes = req.repeat(n).into_bytes();
    let rss0 = emu.rss_kb();
    let w = {
        let mut s = slow.s.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&bytes).unwrap())
    };
    std::thread::sleep(Duration::from_millis(1500));
    let rss1 = emu.rss_kb();
    let mut other = emu.ctl();
    assert!(other.ask(r#"{"cmd":"ping"}"#).contains(r#""ok":true"#));
    for _ in 0..n {
        assert!(slow.line().contains(r#""version""#));
    }
    w.join().unwrap();
    grew("control client not reading (20k describes)", rss0, rss1);
}

#[test]
fn an_overlong_control_line_in_one_write_is_refused_and_the_next_is_served() {
    let emu = Emu::start("ctllong", Stdio::null(), &["--quiet", "--ctl", "CTL"]);
    let mut c = emu.ctl();
    let rss0 = emu.rss_kb();
    let mut big = vec![b' '; 4 << 20];
    big.extend_from_slice(b"{\"cmd\":\"ping\"}\n{\"cmd\":\"ping\"}\n");
    let w = {
        let mut s = c.s.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&big).unwrap())
    };
    let r = c.line();
    assert!(r.contains("request longer than 65536 bytes"), "{r}");
    assert!(c.line().contains(r#""ok":true"#), "the next line is served");
    w.join().unwrap();
    grew("a 4 MiB control line", rss0, emu.rss_kb());
}
