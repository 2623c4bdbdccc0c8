//! `--relay`: QEMU's usbredir session on a virtio-serial port, passed to
//! usbredirect over TCP, each new usbredirect session spliced into it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ax88772::splice::{Splice, Splitter};

use crate::conn::{open_port, Conn};
use crate::failure::Failures;

/// The relay's state, shared by its two directions.
pub(crate) struct Relay {
    pub(crate) splice: Splice,
    /// The current usbredirect session, if one is up.
    pub(crate) to_exporter: Option<Arc<TcpStream>>,
}

/// `--relay NAME=HOST:PORT`: wait for QEMU's hello on the port (so nothing
/// usbredirect says is sent before QEMU listens), then connect to
/// HOST:PORT and pass whole messages both ways. usbredirect ends its
/// session and exits when its device goes away (an unplug); QEMU's session
/// lives on, so the relay splices the next usbredirect listening there into
/// it (`ax88772::splice`): QEMU is told the device went away, and then that
/// it is back. The second thread's failure is reported to `failures`.
pub(crate) fn relay(spec: &str, failures: &Failures) -> Result<()> {
    let (name, addr) = spec
        .split_once('=')
        .context("--relay wants NAME=HOST:PORT")?;
    let port = Conn::Port(open_port(name, Duration::from_secs(30))?);
    relay_on(port, addr, Duration::from_secs(60), failures)
}

/// The relay on an open port: QEMU's side, read here; each usbredirect
/// session is read by a second thread, whose failure, reported to
/// `failures`, ends the gadget. `first_connect` bounds the wait for the
/// first usbredirect to listen.
pub(crate) fn relay_on(
    mut port: Conn,
    addr: &str,
    first_connect: Duration,
    failures: &Failures,
) -> Result<()> {
    let sh = Arc::new(Mutex::new(Relay {
        splice: Splice::default(),
        to_exporter: None,
    }));
    let mut split = Splitter::default();
    let mut buf = vec![0u8; 256 * 1024];
    let mut sessions_started = false;
    loop {
        let n = match port.read(&mut buf) {
            // The port's host side is not connected yet.
            Ok(0) if !sessions_started => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Ok(0) => {
                say!("I: relay: QEMU closed the port");
                return Ok(());
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("relay: reading the port: {e}"),
        };
        split.feed(&buf[..n]);
        let (out, to) = {
            let mut r = sh.lock().unwrap();
            let mut out = Vec::new();
            while let Some(m) = split
                .next(r.splice.qemu_header_len())
                .context("relay: from QEMU")?
            {
                if let Some(m) = r.splice.from_qemu(m).context("relay: from QEMU")? {
                    out.extend_from_slice(&m);
                }
            }
            (out, r.to_exporter.clone())
        };
        if let (false, Some(t)) = (out.is_empty(), to) {
            // A failed write ends that session: its reader sees it too.
            let _ = (&*t).write_all(&out);
        }
        if !sessions_started && sh.lock().unwrap().splice.has_qemu_hello() {
            sessions_started = true;
            let (sh, addr, port) = (sh.clone(), addr.to_string(), port.try_clone()?);
            failures.worker("usbredirect sessions", move || {
                exporter_sessions(&sh, &addr, port, first_connect)
            });
        }
    }
}

/// Connect to usbredirect at `addr`, trying every 50 ms, for at most
/// `limit` (None: until it listens).
pub(crate) fn connect_exporter(addr: &str, limit: Option<Duration>) -> Result<TcpStream> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if limit.is_some_and(|l| start.elapsed() >= l) => {
                bail!("relay: cannot connect to {addr}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// usbredirect's sessions, one after another, spliced into QEMU's, until
/// the port closes (QEMU went away). An error is one the splice cannot
/// survive.
pub(crate) fn exporter_sessions(
    sh: &Mutex<Relay>,
    addr: &str,
    mut port: Conn,
    first_connect: Duration,
) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut limit = Some(first_connect);
    loop {
        let tcp = Arc::new(connect_exporter(addr, limit.take())?);
        let (hello, n) = {
            let mut r = sh.lock().unwrap();
            let hello = r
                .splice
                .session_start()
                .context("relay: no hello from QEMU")?;
            r.to_exporter = Some(tcp.clone());
            (hello, r.splice.sessions)
        };
        say!("I: relay: usbredirect session {n} at {addr}");
        let mut split = Splitter::default();
        let why = match (&*tcp).write_all(&hello) {
            Err(e) => e.to_string(),
            Ok(()) => loop {
                let k = match (&*tcp).read(&mut buf) {
                    Ok(0) => break "closed".to_string(),
                    Ok(k) => k,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => break e.to_string(),
                };
                split.feed(&buf[..k]);
                let mut out = Vec::new();
                {
                    let mut r = sh.lock().unwrap();
                    while let Some(m) = split
                        .next(r.splice.exporter_header_len())
                        .context("relay: from usbredirect")?
                    {
                        if let Some(m) = r.splice.from_exporter(m).context("relay")? {
                            out.extend_from_slice(&m);
                        }
                    }
                }
                if let Err(e) = port.write_all(&out) {
                    say!("I: relay: the port closed ({e})");
                    return Ok(());
                }
            },
        };
        let _ = tcp.shutdown(std::net::Shutdown::Both);
        let gone = {
            let mut r = sh.lock().unwrap();
            r.to_exporter = None;
            r.splice.session_end()
        };
        if let Some(Err(e)) = gone.as_ref().map(|d| port.write_all(d)) {
            say!("I: relay: the port closed ({e})");
            return Ok(());
        }
        say!(
            "I: relay: usbredirect session {n} ended ({why}){}",
            if gone.is_some() {
                "; QEMU was told the device went away"
            } else {
                ""
            }
        );
    }
}
