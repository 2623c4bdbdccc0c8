//! The `ax88772-emu` binary: readiness, both socket roles, reconnects.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usbredir::{Caps, Codec, Hello, Message, Packet, Role};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ax-bin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // The control socket wants a directory only we can enter.
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    d
}

/// The emulator, killed when the test ends, however it ends (a failed
/// assertion must not leave it holding the test's output open).
struct Emu(Child);

impl std::ops::Deref for Emu {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Emu {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn emu(args: &[&str]) -> Emu {
    Emu(Command::new(env!("CARGO_BIN_EXE_ax88772-emu"))
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap())
}

fn wait_for(p: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_exit(c: &mut Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "emulator did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// QEMU's hello, then read until device_connect.
fn plug_session(s: &mut UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = Codec::new(Role::Guest, Caps(0xff));
    let mut out = Vec::new();
    let h = Hello {
        version: "qemu".into(),
        caps: Caps(0xff),
        extra_caps: vec![],
    };
    c.encode(&Packet::new(0, Message::Hello(h)), &mut out)
        .unwrap();
    s.write_all(&out).unwrap();
    let mut names = Vec::new();
    let mut buf = [0u8; 4096];
    while names.last() != Some(&"device_connect") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "emulator closed early");
        c.feed(&buf[..n]);
        while let Some(p) = c.next_packet() {
            names.push(p.unwrap().msg.name());
        }
    }
    assert_eq!(
        names,
        ["hello", "interface_info", "ep_info", "device_connect"]
    );
}

#[test]
fn listen_mode_ready_file_and_exit_on_disconnect() {
    let d = tmpdir("listen");
    let (usb, ready, ctl) = (d.join("usb.sock"), d.join("ready.json"), d.join("ctl.sock"));
    let mut child = emu(&[
        "--listen",
        &format!("unix:{}", usb.display()),
        "--ready-file",
        ready.to_str().unwrap(),
        "--ctl",
        ctl.to_str().unwrap(),
        "--seed",
        "7",
        "--wire",
        &format!(
            "dgram:unix:{},unix:{}",
            d.join("a.sock").display(),
            d.join("b.sock").display()
        ),
    ]);
    wait_for(&ready);
    let about: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ready).unwrap()).unwrap();
    assert_eq!(about["caps"], 0x7a);
    assert!(about["usb"].as_str().unwrap().starts_with("listen:unix:"));

    let mut c = UnixStream::connect(&ctl).unwrap();
    c.write_all(b"{\"cmd\":\"describe\"}\n").unwrap();
    let line = BufReader::new(c.try_clone().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["config"]["variant"], "772a");
    assert_eq!(
        v["config"]["mac"], "02:d7:0d:32:59:e4",
        "--seed 7 derives the MAC"
    );
    assert_eq!(
        v["impair"]["seed"], 7,
        "--seed 7 seeds the impairments: {v}"
    );

    let mut s = UnixStream::connect(&usb).unwrap();
    plug_session(&mut s);
    drop(s);
    assert_eq!(wait_exit(&mut child), 0);
    assert!(!usb.exists() && !ctl.exists(), "sockets removed");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The emulator's next connection to `l`; fails the test if the emulator
/// exits or nothing comes within 20 s.
fn accept_within(l: &UnixListener, child: &mut Child) -> UnixStream {
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("the emulator exited ({status}) instead of connecting");
                }
                assert!(Instant::now() < deadline, "the emulator never connected");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn connect_mode_waits_and_reconnects() {
    let d = tmpdir("connect");
    let usb = d.join("qemu.sock");
    let qemu = UnixListener::bind(&usb).unwrap();
    let mut child = emu(&[
        "--connect",
        &format!("unix:{}", usb.display()),
        "--on-disconnect",
        "wait",
    ]);
    for _ in 0..2 {
        let mut s = accept_within(&qemu, &mut child);
        plug_session(&mut s);
    }
    // SIGTERM ends it cleanly.
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(wait_exit(&mut child), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn connect_timeout_is_a_setup_error() {
    let d = tmpdir("timeout");
    let mut child = emu(&[
        "--connect",
        &format!("unix:{}", d.join("nobody.sock").display()),
        "--connect-timeout",
        "0",
    ]);
    assert_eq!(wait_exit(&mut child), 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_arguments_exit_2() {
    let mut child = emu(&["--listen", "nonsense"]);
    assert_eq!(wait_exit(&mut child), 2);
}

#[test]
fn timing_values_out_of_range_exit_2_naming_the_option() {
    for args in [
        &["--autoneg-ms", "10001"][..],
        &["--phy-reset-ms", "501"],
        &["--phy-powerup-ms", "1001"],
        &["--autoneg-ms", "9000", "--autoneg-jitter-ms", "1001"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ax88772-emu"))
            .args([
                "--connect",
                "unix:/nonexistent/usb.sock",
                "--connect-timeout",
                "0",
            ])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let opt = args[args.len() - 2];
        let named = err
            .lines()
            .any(|l| l.contains(opt) && (l.contains("not in 0..=") || l.contains("at most")));
        assert!(named, "{args:?}: {err}");
    }
}

#[test]
fn control_socket_is_private_and_a_live_one_is_never_replaced() {
    use std::os::unix::fs::PermissionsExt;
    let base = tmpdir("ctlsec");
    let dir = base.join("private");
    let ctl = dir.join("ctl.sock");
    let start = |name: &str| {
        let ready = base.join(format!("{name}.json"));
        let usb = format!("unix:{}", base.join(format!("{name}.sock")).display());
        let c = emu(&[
            "--listen",
            &usb,
            "--ctl",
            ctl.to_str().unwrap(),
            "--ready-file",
            ready.to_str().unwrap(),
        ]);
        (c, ready)
    };
    let (mut first, ready) = start("a");
    wait_for(&ready);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "directory created private");
    assert_eq!(mode(&ctl), 0o600, "socket only for its owner");
    // A second emulator on the same path refuses to start (exit 2).
    let (mut second, _) = start("b");
    assert_eq!(wait_exit(&mut second), 2);
    let mut c = UnixStream::connect(&ctl).unwrap();
    c.write_all(b"{\"cmd\":\"ping\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    assert!(
        line.contains("\"ok\":true"),
        "the first still answers: {line}"
    );
    // Killed without cleanup: the stale socket is replaced.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(ctl.exists());
    let (mut third, ready) = start("c");
    wait_for(&ready);
    third.kill().unwrap();
    third.wait().unwrap();
    // A directory others may enter is refused.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (mut fourth, _) = start("d");
    assert_eq!(wait_exit(&mut fourth), 2);
    let _ = std::fs::remove_dir_all(&base);
}
