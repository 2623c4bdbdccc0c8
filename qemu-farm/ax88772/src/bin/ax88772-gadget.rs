//! `ax88772-gadget`: a usbredir device model (ax88772-emu) as a real USB
//! device function, through Linux configfs and FunctionFS.
//!
//! It connects to the model as QEMU's `usb-redir` would, learns the model's
//! identity, interface and endpoints, creates a configfs gadget with one
//! FunctionFS function, and binds it to a USB device controller (`dummy_hcd`
//! in phyfarm's exporter guest). From then on every control request the
//! host sends on ep0, and every bulk and interrupt transfer, goes to the
//! model and back. The model's unplug unbinds the gadget; its plug binds it
//! again. Byte layouts live in `ax88772::gadget`.
//!
//! Whatever ends the gadget, on the main thread or on any of its threads,
//! takes back what it made in configfs (binding, FunctionFS mount,
//! directories) once, before the process exits: 1 when a worker thread
//! failed (the model's reader, a pump, the relay), 2 otherwise.
//!
//! This file holds the arguments, the model's identity and the gadget's
//! life; beside it, in `ax88772-gadget/`: `conn` (byte streams to the
//! model), `relay` (`--relay`), `configfs` (building and taking back
//! the gadget), `endpoints` (the model's reader, ep0's events, the bulk
//! and interrupt pumps), `failure` (the threads, and how one failing ends
//! the gadget) and `aio`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ax88772::gadget::{self, Endpoint};
use clap::Parser;
use usbredir::proto::{cap, ep_type};
use usbredir::{
    Caps, Codec, ControlPacket, DeviceConnect, EpInfo, InterfaceInfo, Message, Packet, Role,
};

const ABOUT: &str = "A usbredir device model as a USB gadget (configfs + FunctionFS).";

#[derive(Parser, Debug)]
#[command(name = "ax88772-gadget", about = ABOUT, long_about = None)]
struct Args {
    /// The model's usbredir stream: HOST:PORT (ax88772-emu --listen
    /// HOST:PORT) or port:NAME, the virtio-serial port NAME (a QEMU chardev
    /// connected to ax88772-emu --listen unix:PATH).
    #[arg(long, value_name = "HOST:PORT|port:NAME")]
    model: String,
    /// Relay the virtio-serial port NAME to a TCP server (usbredirect --as
    /// HOST:PORT) once the port's far end has spoken: QEMU's usb-redir on
    /// the host reaches usbredirect without a network. When usbredirect
    /// ends (its device went away), the next one listening at HOST:PORT is
    /// spliced into QEMU's session.
    #[arg(long, value_name = "NAME=HOST:PORT")]
    relay: Option<String>,
    /// Give up if the model cannot be reached within this many seconds
    /// (at most 3600).
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=MAX_CONNECT_TIMEOUT_S))]
    connect_timeout: u64,
    /// The USB device controller to bind to [first in /sys/class/udc].
    #[arg(long, value_name = "NAME")]
    udc: Option<String>,
    /// Where configfs is mounted.
    #[arg(long, default_value = "/sys/kernel/config", value_name = "DIR")]
    configfs: PathBuf,
    /// Where the FunctionFS instance is mounted.
    #[arg(long, default_value = "/dev/ffs-ax88772", value_name = "DIR")]
    ffs: PathBuf,
    /// Bytes asked of the model per bulk IN transfer (512 to 65536).
    #[arg(long, default_value_t = 16384, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(512..=i64::from(MAX_BULK_IN_LEN)))]
    bulk_in_len: u32,
    /// Transfers in flight per bulk endpoint (1 to 64).
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_IN_FLIGHT as u64))]
    in_flight: usize,
}

/// Longest `--connect-timeout`, in seconds.
const MAX_CONNECT_TIMEOUT_S: u64 = 3600;
/// Largest `--bulk-in-len`: the model fills at most 2048 bytes of each.
const MAX_BULK_IN_LEN: u32 = 65536;
/// Most `--in-flight` transfers per endpoint: the model holds 64 bulk OUTs
/// waiting (`ax88772::device::OUT_WAIT_MAX`).
const MAX_IN_FLIGHT: usize = 64;

macro_rules! say {
    ($($a:tt)*) => { $crate::say_line(format_args!($($a)*)) };
}

/// One line on stderr (in unit tests, also kept in the thread's log).
fn say_line(a: std::fmt::Arguments) {
    #[cfg(test)]
    tests::said(&a);
    eprintln!("ax88772-gadget: {a}");
}

#[path = "ax88772-gadget/aio.rs"]
mod aio;
#[path = "ax88772-gadget/configfs.rs"]
mod configfs;
#[path = "ax88772-gadget/conn.rs"]
mod conn;
#[path = "ax88772-gadget/endpoints.rs"]
mod endpoints;
#[path = "ax88772-gadget/failure.rs"]
mod failure;
#[path = "ax88772-gadget/relay.rs"]
mod relay;

use configfs::{build, first_udc, mount_ffs, Made, Step};
use conn::{connect, readable, Conn};
use endpoints::{bulk_in, bulk_out, ep0_events, interrupt_in, reader, Shared};
use failure::{exit_code, failures, Failures};
use relay::relay;

/// The connection to the model: one codec, one writer, ids handed out here.
struct Link {
    codec: Mutex<Codec>,
    out: Mutex<Conn>,
    next_id: AtomicU64,
}

impl Link {
    fn send(&self, msg: Message) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut buf = Vec::new();
        self.codec
            .lock()
            .unwrap()
            .encode(&Packet::new(id, msg), &mut buf)
            .context("encoding a usbredir packet")?;
        self.out
            .lock()
            .unwrap()
            .write_all(&buf)
            .context("writing to the model")?;
        Ok(id)
    }
}

/// Read packets until `done` says the list is enough (before the reader
/// thread exists).
fn read_until(
    s: &mut Conn,
    link: &Link,
    deadline: Instant,
    mut done: impl FnMut(&Packet) -> bool,
) -> Result<()> {
    let mut buf = vec![0u8; 65536];
    loop {
        loop {
            let p = link.codec.lock().unwrap().next_packet();
            match p {
                Some(Ok(p)) => {
                    if done(&p) {
                        return Ok(());
                    }
                }
                Some(Err(e)) => bail!("the model sent a bad packet: {e}"),
                None => break,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("the model did not announce a device in time");
        }
        if !readable(s, left)? {
            continue;
        }
        let n = s.read(&mut buf).context("reading from the model")?;
        if n == 0 {
            bail!("the model closed the connection before announcing a device");
        }
        link.codec.lock().unwrap().feed(&buf[..n]);
    }
}

struct Identity {
    connect: DeviceConnect,
    iface: InterfaceInfo,
    eps: EpInfo,
    strings: [String; 3],
}

fn learn(s: &mut Conn, link: &Link) -> Result<Identity> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut connect, mut iface, mut eps) = (None, None, None);
    read_until(s, link, deadline, |p| {
        match &p.msg {
            Message::DeviceConnect(c) => connect = Some(*c),
            Message::InterfaceInfo(i) => iface = Some((**i).clone()),
            Message::EpInfo(e) => eps = Some((**e).clone()),
            _ => {}
        }
        connect.is_some() && iface.is_some() && eps.is_some()
    })?;
    let mut strings: [String; 3] = Default::default();
    for (i, slot) in strings.iter_mut().enumerate() {
        let id = link.send(Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            request: 6,
            requesttype: 0x80,
            value: 0x0300 | (i as u16 + 1),
            index: 0x0409,
            length: 255,
            ..Default::default()
        }))?;
        let mut got = None;
        read_until(s, link, deadline, |p| {
            if let (true, Message::ControlPacket(c)) = (p.id == id, &p.msg) {
                got = Some(c.clone());
                true
            } else {
                false
            }
        })?;
        if let Some(c) = got.filter(|c| c.status.is_success()) {
            *slot = gadget::configfs_text(&gadget::string_text(&c.data).unwrap_or_default());
        }
    }
    Ok(Identity {
        connect: connect.unwrap(),
        iface: iface.unwrap(),
        eps: eps.unwrap(),
        strings,
    })
}

fn run(args: Args) -> Result<()> {
    let mut s = connect(&args.model, Duration::from_secs(args.connect_timeout))?;
    let caps = Caps::XHCI_HOST.with(cap::DEVICE_DISCONNECT_ACK);
    let link = Link {
        codec: Mutex::new(Codec::new(Role::Guest, caps)),
        out: Mutex::new(s.try_clone()?),
        next_id: AtomicU64::new(1),
    };
    {
        let mut hello = Vec::new();
        link.codec
            .lock()
            .unwrap()
            .encode_hello("ax88772-gadget", &mut hello)?;
        s.write_all(&hello)?;
    }
    let id = learn(&mut s, &link)?;
    let eps = gadget::endpoints(&id.eps)?;
    say!(
        "I: model {:04x}:{:04x} ({}, {}), endpoints {}",
        id.connect.vendor_id,
        id.connect.product_id,
        id.strings[0],
        id.strings[1],
        eps.iter()
            .map(|e| format!("{:#04x}", e.address))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let descriptors = gadget::descriptors(&id.iface, &eps)?;
    let udc = match &args.udc {
        Some(u) => u.clone(),
        None => first_udc(Path::new("/sys/class/udc"))?,
    };
    life(
        &args,
        &id,
        &eps,
        &descriptors,
        link,
        s,
        udc,
        &mut Made::default(),
        mount_ffs,
    )
}

/// The gadget's life once the model is known: built (FunctionFS mounted
/// with `mount`), bound and served until something fails, on this thread
/// or on any of the gadget's; everything `made` records is then taken
/// back, once.
#[allow(clippy::too_many_arguments)]
fn life(
    args: &Args,
    id: &Identity,
    eps: &[Endpoint],
    descriptors: &[u8],
    link: Link,
    s: Conn,
    udc: String,
    made: &mut Made,
    mount: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let r = build(args, id, descriptors, made, mount)
        .and_then(|(g, ep0)| serve(args, eps, link, s, g, udc, ep0, made));
    if r.is_err() {
        made.undo();
    }
    r
}

/// The bound gadget's life: endpoint pumps, the model's reader, ep0's
/// events, each on a thread of its own, and the relay's; this thread waits
/// for the first of them to fail. `made` gets the binding. Once this
/// returns, the gadget is left to the clean-up: nothing binds it any more.
#[allow(clippy::too_many_arguments)]
fn serve(
    args: &Args,
    eps: &[Endpoint],
    link: Link,
    s: Conn,
    g: PathBuf,
    udc: String,
    ep0: File,
    made: &mut Made,
) -> Result<()> {
    let sh = Arc::new(Shared {
        link,
        epoch: AtomicU64::new(0),
        enabled: AtomicBool::new(false),
        plugged: AtomicBool::new(true),
        gadget: g,
        udc,
        ended: Mutex::new(false),
    });
    let (failures, failed) = failures();
    let e = match start(args, eps, &sh, s, ep0, made, &failures) {
        // `failures` is held here: the wait ends only with a failure.
        Ok(()) => failed.recv().expect("a sender is held"),
        Err(e) => e,
    };
    sh.end();
    Err(e)
}

/// Start the gadget's threads, each reporting its failure to `failures`,
/// and bind the gadget.
fn start(
    args: &Args,
    eps: &[Endpoint],
    sh: &Arc<Shared>,
    s: Conn,
    ep0: File,
    made: &mut Made,
    failures: &Failures,
) -> Result<()> {
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let mut pumps = HashMap::new();
    for (i, ep) in eps.iter().enumerate() {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(args.ffs.join(format!("ep{}", i + 1)))
            .with_context(|| format!("opening ep{}", i + 1))?;
        let (tx, rx) = mpsc::sync_channel(64);
        pumps.insert(ep.address, tx);
        let (sh, ep) = (sh.clone(), *ep);
        let (len, fl) = (args.bulk_in_len, args.in_flight.max(1));
        let name = format!("ep {:#04x}", ep.address);
        failures.worker(&name, move || {
            match (ep.kind, ep.is_in()) {
                (ep_type::BULK, true) => bulk_in(sh, ep, file, rx, (len, fl)),
                (ep_type::BULK, false) => bulk_out(sh, ep, file, rx, fl)?,
                (_, true) => interrupt_in(ep, file, rx),
                // An interrupt OUT endpoint: nothing of the AX88772A's.
                (_, false) => drop((file, rx)),
            }
            Ok(())
        });
    }
    {
        let sh = sh.clone();
        failures.worker("model reader", move || reader(s, sh, ctrl_tx, pumps));
    }
    sh.bind(true);
    made.steps.push(Step::Bound(sh.gadget.clone()));
    if let Some(spec) = args.relay.clone() {
        let f = failures.clone();
        failures.worker("relay", move || relay(&spec, &f));
    }
    let int_ep = eps
        .iter()
        .find(|e| e.kind == ep_type::INTERRUPT && e.is_in())
        .map(|e| e.address);
    let sh = sh.clone();
    failures.main_path("ep0", move || ep0_events(&sh, ep0, &ctrl_rx, int_ep));
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("E: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

// The tests drive the gadget's transport with socketpairs, pipes, files
// and a temporary configfs tree in place of FunctionFS and /sys.
#[cfg(test)]
#[path = "ax88772-gadget/tests.rs"]
mod tests;
