//! What passes between the host's endpoints and the model: the reader of
//! the model's stream routing each packet, the bulk and interrupt pumps,
//! and ep0's events, its setup requests answered through the model.

use std::collections::HashMap;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ax88772::gadget::{self, Endpoint, Event, Setup};
use usbredir::{BulkPacket, ControlPacket, Message, Packet, SmallDataPacket};

use crate::aio;
use crate::configfs::write_attr;
use crate::conn::Conn;
use crate::Link;

/// Bulk IN data gathered into one write, at most (plus one transfer).
pub(crate) const COALESCE: usize = 16 * 1024;
/// The size of each queued bulk OUT read: more than any transfer the host's
/// driver sends (a transfer ends with a short packet).
const OUT_READ: usize = 32 * 1024;

/// What the reader thread hands each endpoint's pump.
pub(crate) enum ToPump {
    Bulk(BulkPacket),
    Interrupt(SmallDataPacket),
}

pub(crate) struct Shared {
    pub(crate) link: Link,
    /// Counts Enable events: pumps drop what they had in flight when it moves.
    pub(crate) epoch: AtomicU64,
    pub(crate) enabled: AtomicBool,
    pub(crate) plugged: AtomicBool,
    pub(crate) gadget: PathBuf,
    pub(crate) udc: String,
    /// Set when a failure ends the gadget: from then on nothing binds or
    /// unbinds it and ep0's events are left alone, the clean-up's own.
    pub(crate) ended: Mutex<bool>,
}

impl Shared {
    pub(crate) fn bind(&self, on: bool) {
        // Held while writing: no binding lands after the clean-up's unbinding.
        let ended = self.ended();
        if *ended {
            return;
        }
        let v = if on { self.udc.as_str() } else { "\n" };
        match write_attr(&self.gadget, "UDC", v) {
            Ok(()) => say!("I: gadget {}", if on { "bound" } else { "unbound" }),
            Err(e) => say!("W: {e:#}"),
        }
    }

    /// The gadget is ending: leave its binding and ep0 to the clean-up.
    pub(crate) fn end(&self) {
        *self.ended() = true;
    }

    pub(crate) fn has_ended(&self) -> bool {
        *self.ended()
    }

    fn ended(&self) -> MutexGuard<'_, bool> {
        self.ended.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Read the model's stream and route each packet, until the model hangs
/// up or its stream fails: that error ends the gadget.
pub(crate) fn reader(
    mut s: Conn,
    sh: Arc<Shared>,
    ctrl: Sender<Packet>,
    pumps: HashMap<u8, SyncSender<ToPump>>,
) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => bail!("the model closed the connection"),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("reading from the model: {e}"),
        };
        let mut packets = Vec::new();
        {
            let mut c = sh.link.codec.lock().unwrap();
            c.feed(&buf[..n]);
            while let Some(p) = c.next_packet() {
                match p {
                    Ok(p) => packets.push(p),
                    Err(e) => bail!("the model sent a bad packet: {e}"),
                }
            }
        }
        for p in packets {
            route(&sh, &ctrl, &pumps, p);
        }
    }
}

/// Hand one packet from the model to whoever waits for it.
pub(crate) fn route(
    sh: &Shared,
    ctrl: &Sender<Packet>,
    pumps: &HashMap<u8, SyncSender<ToPump>>,
    p: Packet,
) {
    match p.msg {
        Message::ControlPacket(_) => {
            let _ = ctrl.send(p);
        }
        Message::BulkPacket(b) => {
            if let Some(t) = pumps.get(&b.endpoint) {
                let _ = t.send(ToPump::Bulk(b));
            }
        }
        Message::InterruptPacket(i) => {
            // A host that does not poll loses status, as with the chip.
            if let Some(t) = pumps.get(&i.endpoint) {
                let _ = t.try_send(ToPump::Interrupt(i));
            }
        }
        Message::DeviceDisconnect => {
            say!("I: the model unplugged the device");
            sh.plugged.store(false, Ordering::SeqCst);
            let _ = sh.link.send(Message::DeviceDisconnectAck);
            sh.bind(false);
        }
        Message::DeviceConnect(_) if !sh.plugged.swap(true, Ordering::SeqCst) => {
            say!("I: the model plugged the device in");
            sh.bind(true);
        }
        _ => {}
    }
}

pub(crate) fn is_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ESHUTDOWN) | Some(libc::EIO) | Some(libc::ENODEV) | Some(libc::EINTR)
    )
}

/// Wait until the host has enabled the function; the epoch it did so in.
fn wait_enabled(sh: &Shared) -> u64 {
    while !sh.enabled.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    sh.epoch.load(Ordering::SeqCst)
}

/// Bulk IN: keep `in_flight` requests at the model; write what it returns.
pub(crate) fn bulk_in(
    sh: Arc<Shared>,
    ep: Endpoint,
    mut file: File,
    rx: Receiver<ToPump>,
    a: (u32, usize),
) {
    let (len, in_flight) = a;
    let mut outstanding = 0usize;
    let mut epoch = wait_enabled(&sh);
    loop {
        let now = sh.epoch.load(Ordering::SeqCst);
        if !sh.enabled.load(Ordering::SeqCst) || now != epoch {
            epoch = wait_enabled(&sh);
            outstanding = 0;
        }
        while outstanding < in_flight {
            let m = Message::BulkPacket(BulkPacket {
                endpoint: ep.address,
                length: len,
                ..Default::default()
            });
            if sh.link.send(m).is_err() {
                return;
            }
            outstanding += 1;
        }
        let first = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // What the model has returned so far goes out in one write, as the
        // chip streams its RX FIFO: the host's driver splits frames across
        // its transfers itself. One write is one controller request.
        let mut data = Vec::new();
        let mut next = Some(first);
        while let Some(m) = next.take() {
            if let ToPump::Bulk(b) = m {
                outstanding = outstanding.saturating_sub(1);
                if b.status.is_success() {
                    data.extend_from_slice(&b.data);
                }
            }
            if data.len() < COALESCE {
                next = rx.try_recv().ok();
            }
        }
        if !data.is_empty() {
            if let Err(e) = file.write_all(&data) {
                if !is_gone(&e) {
                    say!("W: ep {:#04x}: {e}", ep.address);
                }
            }
        }
    }
}

/// Bulk OUT: keep `in_flight` reads queued on the endpoint (Linux AIO, so
/// that the controller can complete several of the host's transfers at
/// once), and pass each transfer to the model, at most `in_flight`
/// unanswered there. It ends quietly when the model's answers stop coming
/// (the reader is gone); an AIO call failing ends the gadget.
pub(crate) fn bulk_out(
    sh: Arc<Shared>,
    ep: Endpoint,
    file: File,
    rx: Receiver<ToPump>,
    in_flight: usize,
) -> Result<()> {
    let fail = |call: &str, e: std::io::Error| anyhow!("ep {:#04x}: {call}: {e}", ep.address);
    let ctx = aio::Ctx::new(in_flight as u32).map_err(|e| fail("io_setup", e))?;
    let fd = file.as_raw_fd();
    let mut slots: Vec<aio::Read> = (0..in_flight)
        .map(|i| aio::Read::new(fd, i as u64, OUT_READ))
        .collect();
    for s in &mut slots {
        ctx.submit(s).map_err(|e| fail("io_submit", e))?;
    }
    let mut events = vec![aio::Event::default(); in_flight];
    let mut outstanding = 0usize;
    let mut epoch = sh.epoch.load(Ordering::SeqCst);
    loop {
        let n = match ctx.wait(&mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail("io_getevents", e)),
        };
        for ev in &events[..n] {
            let slot = &mut slots[ev.data as usize];
            if ev.res > 0 {
                let now = sh.epoch.load(Ordering::SeqCst);
                if now != epoch {
                    epoch = now;
                    outstanding = 0;
                }
                while let Ok(ToPump::Bulk(_)) = rx.try_recv() {
                    outstanding = outstanding.saturating_sub(1);
                }
                while outstanding >= in_flight {
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(_) => outstanding -= 1,
                        Err(RecvTimeoutError::Timeout) => {
                            if sh.epoch.load(Ordering::SeqCst) != epoch {
                                outstanding = 0;
                            }
                        }
                        Err(RecvTimeoutError::Disconnected) => return Ok(()),
                    }
                }
                let data = slot.buf[..ev.res as usize].to_vec();
                let m = Message::BulkPacket(BulkPacket {
                    endpoint: ep.address,
                    length: data.len() as u32,
                    data,
                    ..Default::default()
                });
                if sh.link.send(m).is_err() {
                    return Ok(());
                }
                outstanding += 1;
            } else if ev.res < 0 {
                let e = std::io::Error::from_raw_os_error(-ev.res as i32);
                if !is_gone(&e) {
                    say!("W: ep {:#04x}: {e}", ep.address);
                }
                // Disabled: the next read waits in io_submit until enabled.
                std::thread::sleep(Duration::from_millis(5));
            }
            ctx.submit(slot).map_err(|e| fail("io_submit", e))?;
        }
    }
}

pub(crate) fn interrupt_in(ep: Endpoint, mut file: File, rx: Receiver<ToPump>) {
    while let Ok(m) = rx.recv() {
        if let ToPump::Interrupt(i) = m {
            if i.status.is_success() && !i.data.is_empty() {
                if let Err(e) = file.write_all(&i.data) {
                    if !is_gone(&e) {
                        say!("W: ep {:#04x}: {e}", ep.address);
                    }
                }
            }
        }
    }
}

/// ep0's events until reading them fails: setup requests answered through
/// the model, the host enabling and disabling the function passed on to
/// it. Once the gadget has ended, ep0 is left to the clean-up.
pub(crate) fn ep0_events(
    sh: &Shared,
    mut ep0: File,
    ctrl: &Receiver<Packet>,
    int_ep: Option<u8>,
) -> Result<()> {
    let mut buf = [0u8; gadget::EVENT_LEN * 4];
    loop {
        let n = match ep0.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => bail!("reading ep0 events: {e}"),
        };
        if sh.has_ended() {
            return Ok(());
        }
        for ev in gadget::parse_events(&buf[..n]) {
            match ev {
                Event::Setup(s) => setup(sh, &mut ep0, ctrl, s)?,
                Event::Enable => {
                    say!("I: the host enabled the function");
                    sh.link
                        .send(Message::SetConfiguration { configuration: 1 })?;
                    if let Some(ep) = int_ep {
                        sh.link
                            .send(Message::StartInterruptReceiving { endpoint: ep })?;
                    }
                    sh.epoch.fetch_add(1, Ordering::SeqCst);
                    sh.enabled.store(true, Ordering::SeqCst);
                }
                Event::Disable => {
                    say!("I: the host disabled the function (reset or unplug)");
                    sh.enabled.store(false, Ordering::SeqCst);
                    if sh.plugged.load(Ordering::SeqCst) {
                        sh.link.send(Message::Reset)?;
                    }
                }
                Event::Bind | Event::Unbind | Event::Suspend | Event::Resume => {}
                Event::Unknown(t) => say!("W: unknown FunctionFS event {t}"),
            }
        }
    }
}

/// Answer one setup request through the model.
pub(crate) fn setup(sh: &Shared, ep0: &mut File, ctrl: &Receiver<Packet>, s: Setup) -> Result<()> {
    let mut data = Vec::new();
    if !s.is_in() && s.length > 0 {
        data = vec![0u8; s.length as usize];
        let n = ep0
            .read(&mut data)
            .context("reading a control request's data")?;
        data.truncate(n);
    }
    let id = sh.link.send(Message::ControlPacket(ControlPacket {
        endpoint: s.request_type & 0x80,
        request: s.request,
        requesttype: s.request_type,
        value: s.value,
        index: s.index,
        length: s.length,
        data,
        ..Default::default()
    }))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let reply = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctrl.recv_timeout(left) {
            Ok(p) if p.id == id => match p.msg {
                Message::ControlPacket(c) => break Some(c),
                _ => unreachable!("only control packets are routed here"),
            },
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    let ok = reply.as_ref().is_some_and(|c| c.status.is_success());
    let r = match (s.is_in(), ok) {
        (true, true) => {
            let c = reply.as_ref().unwrap();
            let n = c.data.len().min(s.length as usize);
            ep0.write(&c.data[..n]).map(|_| ())
        }
        // Stall: a read on an IN request, a write on an OUT one.
        (true, false) => ep0.read(&mut []).map(|_| ()),
        (false, true) if s.length == 0 => ep0.read(&mut []).map(|_| ()),
        (false, true) => Ok(()),
        (false, false) if s.length == 0 => ep0.write(&[]).map(|_| ()),
        (false, false) => {
            // FunctionFS acknowledged the data stage when it handed over the
            // data: a refusal the model decides on after seeing it (an
            // injected MII write fault) cannot reach the host as a STALL.
            say!(
                "W: the model refused OUT request {:#04x}/{:#04x} after its data stage; \
                 FunctionFS had acknowledged it already",
                s.request_type,
                s.request
            );
            Ok(())
        }
    };
    match r {
        Ok(()) => {}
        // A stall is reported as an error; so is a request the host gave up on.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EL2HLT) | Some(libc::EIDRM)) => {}
        Err(e) => say!("W: ep0: {e}"),
    }
    if reply.is_none() {
        say!(
            "W: the model did not answer request {:#04x}/{:#04x} in 5 s",
            s.request_type,
            s.request
        );
    }
    Ok(())
}
