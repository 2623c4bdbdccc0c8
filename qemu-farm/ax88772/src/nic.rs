//! The NIC datapath: the MAC's registers and the PHY, ASIX TX framing,
//! the paced TX and RX queues, the wire's latency, and RX records for bulk
//! IN requests. It knows nothing of usbredir; the session (`device`) feeds
//! it transfer data and asks it for RX data.
//!
//! Side channels go through [`NicEvents`] (counters, warnings, the wire
//! capture), so the datapath itself stays pure, as vm-superio's serial
//! device reports through `SerialEvents`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::DeviceConfig;
pub use crate::config::{DuplexMismatch, RxMode};
use crate::framing::{self, TxOutcome, TxParser, MAX_FRAME, MAX_RX_TRANSFER};
use crate::impair::{Fate, Impair, ImpairConfig};
use crate::mac::{Effects, Mac};
use crate::phy::Phy;

/// Frames the MAC holds for the wire (about 190 kB, 15 ms at 100 Mbit/s,
/// more than the pacer's default burst). A bulk OUT is taken in only when
/// its frames find room here; until then it waits, unparsed.
pub const TX_QUEUE_FRAMES: usize = 128;
/// Frames held on a delayed wire (latency and jitter), each direction.
pub const DELAY_FRAMES: usize = 8192;
/// Bytes held on a delayed wire, each direction (100 ms at 100 Mbit/s is
/// 1.25 MB; a stream wire may carry frames of up to 64 KiB before the MAC
/// drops them).
pub const DELAY_BYTES: usize = 2 << 20;

/// Frames on a delayed wire, with their arrival times, bounded in frames
/// and bytes.
#[derive(Default)]
struct DelayLine {
    q: VecDeque<(Instant, Vec<u8>)>,
    bytes: usize,
}

impl DelayLine {
    fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    fn has_room(&self, len: usize) -> bool {
        self.q.len() < DELAY_FRAMES && self.bytes + len <= DELAY_BYTES
    }

    fn push(&mut self, due: Instant, f: Vec<u8>) {
        let due = self.q.back().map_or(due, |(t, _)| (*t).max(due));
        self.bytes += f.len();
        self.q.push_back((due, f));
    }

    fn next_due(&self) -> Option<Instant> {
        self.q.front().map(|(t, _)| *t)
    }

    fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if !self.q.front().is_some_and(|(t, _)| *t <= now) {
            return None;
        }
        let (_, f) = self.q.pop_front()?;
        self.bytes -= f.len();
        Some(f)
    }
}

/// Why the datapath let a frame go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    /// Guest frame while the link is down.
    TxNoLink,
    /// A TX header failed its complement check (the rest of the transfer).
    TxBadHeader,
    /// A TX frame longer than 1518 bytes.
    TxOversized,
    /// Wire frame while the link is down or in loopback.
    RxNoLink,
    /// Wire frame shorter than a header or longer than 1518 bytes.
    RxLength,
    /// RX_CTL.SO or MEDIUM.RE closed.
    RxGated,
    /// The RX filter did not pass the destination.
    RxFiltered,
    /// The RX queue was full.
    RxOverflow,
    /// The RX queue was full while the link had negotiated flow control
    /// but MEDIUM.TFC was off: a frame the MAC should have held off with
    /// PAUSE (a driver that did not program the negotiated pause).
    RxOverflowTfcOff,
    /// A bulk IN request too short for the next record.
    RxTooBigForRequest,
    /// Lost by the impairment (either direction).
    Impaired,
    /// A wire frame whose bits were flipped on the way: its FCS does not
    /// match, and the MAC drops it as the chip does.
    RxCrc,
    /// BMCR.ISOLATE cuts the PHY off the MAC's MII: no data either way.
    Isolated,
    /// A collision of a duplex mismatch (MEDIUM.FD against the link's
    /// duplex) lost the frame (`DuplexMismatch::Lose`).
    Collision,
    /// The delayed wire was full.
    DelayOverflow,
}

/// What the datapath reports. Every method defaults to nothing.
pub trait NicEvents {
    /// A frame left the MAC for the wire.
    fn tx_frame(&mut self, _frame: &[u8]) {}
    /// A frame went to the guest in a bulk IN transfer (its last byte did).
    fn rx_frame(&mut self, _frame: &[u8]) {}
    /// A frame on the wire (either direction), for captures.
    fn on_wire(&mut self, _frame: &[u8]) {}
    fn dropped(&mut self, _why: Drop, _frames: u64) {}
    /// The impairment flipped a bit.
    fn corrupted(&mut self) {}
    /// A frame collided under a duplex mismatch (lost or not).
    fn collision(&mut self) {}
    /// Two frames crossed on a link whose ends run different duplexes
    /// (lost or not).
    fn wire_collision(&mut self) {}
    /// A MAC control PAUSE frame: `sent` by the MAC (XOFF when the RX
    /// queue fills, XON when it has room again), or received from the
    /// partner (`honoured` with MEDIUM.RFC, else dropped).
    fn pause(&mut self, _sent: bool, _honoured: bool) {}
    /// Odd input worth a log line.
    fn warn(&mut self, _msg: std::fmt::Arguments<'_>) {}
}

/// Reports nothing.
pub struct NoEvents;
impl NicEvents for NoEvents {}

/// What a bulk IN request gets.
#[derive(Debug, PartialEq, Eq)]
pub enum RxData {
    /// RX records, at most the request's length (and 2048 bytes).
    Records(Vec<u8>),
    /// The request cannot hold what the chip sends next. With whole
    /// frames, that frame is lost; as a byte stream, a request shorter than
    /// one 16-bit FIFO word, and nothing is lost.
    Babble,
}

/// The unsent end of a record whose start already went to the guest.
#[derive(Debug, Default)]
struct RxTail {
    bytes: Vec<u8>,
    pos: usize,
    frame_len: usize,
}

impl RxTail {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

pub struct Nic {
    pub(crate) mac: Mac,
    pub(crate) phy: Phy,
    paced: bool,
    pace_burst: Duration,
    pace_percent: u32,
    rx_queue_frames: usize,
    rx_mode: RxMode,
    rx_tail: RxTail,
    duplex_mismatch: DuplexMismatch,
    /// Until then a frame from the partner occupies the wire.
    rx_busy_until: Instant,
    /// Until then a frame of ours occupies the wire.
    tx_busy_until: Instant,
    tx_parser: TxParser,
    tx_queue: VecDeque<(Instant, Vec<u8>)>,
    rx_queue: VecDeque<(Instant, Vec<u8>)>,
    tx_delay: DelayLine,
    rx_delay: DelayLine,
    tx_clock: Instant,
    rx_clock: Instant,
    /// The MAC's XOFF holds the partner (until its XON).
    xoff: bool,
    /// Until then the partner's PAUSE holds our TX (MEDIUM.RFC).
    tx_paused_until: Instant,
    impair: Impair,
    wire_out: Vec<Vec<u8>>,
    now: Instant,
}

impl Nic {
    pub fn new(cfg: &DeviceConfig, now: Instant) -> Nic {
        let mut phy = Phy::new(cfg.phy_id, now);
        phy.set_autoneg_delay(cfg.autoneg);
        phy.set_autoneg_jitter(cfg.autoneg_jitter, cfg.autoneg_seed);
        phy.set_timing(cfg.phy_timing);
        phy.set_partner(cfg.partner.clone());
        phy.set_quirks(cfg.quirks);
        Nic {
            mac: {
                let mut m = Mac::new(cfg.variant, cfg.mac, cfg.addr0);
                m.mii_delay = cfg.mii_delay;
                m
            },
            phy,
            paced: cfg.paced,
            pace_burst: cfg.pace_burst,
            pace_percent: cfg.pace_percent.clamp(1, 100),
            rx_queue_frames: cfg.rx_queue_frames,
            rx_mode: cfg.rx_mode,
            rx_tail: RxTail::default(),
            duplex_mismatch: cfg.duplex_mismatch,
            rx_busy_until: now,
            tx_busy_until: now,
            tx_parser: TxParser::default(),
            tx_queue: VecDeque::new(),
            rx_queue: VecDeque::new(),
            tx_delay: DelayLine::default(),
            rx_delay: DelayLine::default(),
            tx_clock: now,
            rx_clock: now,
            xoff: false,
            tx_paused_until: now,
            impair: Impair::new(ImpairConfig::default()),
            wire_out: Vec::new(),
            now,
        }
    }

    /// Advance the clock (never backwards) and the PHY with it.
    pub fn tick(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
        self.phy.set_time(self.now);
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    /// Power-on state: queues empty, MAC and PHY reset. Frames already on
    /// the wire (the delay lines) keep going.
    pub fn reset(&mut self) {
        self.tx_parser.reset();
        self.tx_queue.clear();
        self.rx_queue.clear();
        self.rx_tail = RxTail::default();
        self.tx_clock = self.now;
        self.rx_clock = self.now;
        self.xoff = false;
        self.tx_paused_until = self.now;
        self.mac.reset();
        self.phy.power_on_reset();
    }

    /// Carry out SW_RESET's queue flushes.
    pub fn apply(&mut self, fx: Effects) {
        if fx.flush_rx {
            self.rx_queue.clear();
            self.rx_tail = RxTail::default();
            self.xoff = false;
        }
        if fx.flush_tx {
            self.tx_queue.clear();
            self.tx_parser.reset();
        }
    }

    /// Room in the TX queue for another transfer's frames.
    pub fn tx_room(&self) -> bool {
        self.tx_queue.len() < TX_QUEUE_FRAMES
    }

    pub fn tx_queued(&self) -> usize {
        self.tx_queue.len()
    }

    /// Whether the partner may send now (callers stop reading the wire
    /// when false). It may unless the MAC's XOFF holds it: a frame that
    /// finds the RX queue full is lost (RxOverflow), as in the chip's FIFO,
    /// unless flow control is in force.
    pub fn partner_may_send(&self) -> bool {
        !(self.xoff && self.holds_partner())
    }

    fn rx_full(&self) -> bool {
        self.rx_queue.len() >= self.rx_queue_frames
    }

    /// Flow control towards the partner: MEDIUM.TFC on a link that
    /// negotiated PAUSE (full duplex, both ends advertising it), so the
    /// partner honours the MAC's PAUSE frames.
    fn holds_partner(&self) -> bool {
        self.mac.medium & crate::mac::medium::TFC != 0 && self.phy.pause_negotiated()
    }

    /// The RX queue is full: hold the partner off with XOFF if flow control
    /// is in force. The chip refreshes XOFF before its quanta run out while
    /// the FIFO stays full; only the first goes on the wire here.
    fn rx_filled(&mut self, ev: &mut dyn NicEvents) {
        if !self.xoff && self.holds_partner() {
            self.xoff = true;
            self.send_pause(PAUSE_QUANTA_MAX, ev);
        }
    }

    /// Room again in the RX queue (half of it): XON releases the partner.
    fn rx_drained(&mut self, ev: &mut dyn NicEvents) {
        if self.xoff && self.rx_queue.len() <= self.rx_queue_frames / 2 {
            self.xoff = false;
            if self.holds_partner() {
                self.send_pause(0, ev);
            }
        }
    }

    /// A MAC control PAUSE frame leaves at once, ahead of queued data.
    fn send_pause(&mut self, quanta: u16, ev: &mut dyn NicEvents) {
        let f = pause_frame(self.mac.node_id, quanta);
        ev.pause(true, true);
        ev.on_wire(&f);
        self.wire_out.push(f);
    }

    /// A PAUSE frame from the partner: with MEDIUM.RFC our TX holds for its
    /// quanta (512 bit times each at the line rate; 0 releases at once),
    /// without it the MAC drops it. Either way it never reaches the guest.
    fn pause_received(&mut self, quanta: u16, ev: &mut dyn NicEvents) {
        let honoured = self.mac.medium & crate::mac::medium::RFC != 0;
        ev.pause(false, honoured);
        if honoured {
            let ns = u64::from(quanta) * 512 * 1_000_000_000 / self.wire_rate();
            self.tx_paused_until = self.now + Duration::from_nanos(ns);
        }
    }

    /// Frames to put on the wire, in order.
    pub fn take_wire(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.wire_out)
    }

    pub fn set_duplex_mismatch(&mut self, d: DuplexMismatch) {
        self.duplex_mismatch = d;
    }

    /// The MAC, set up for a link (MEDIUM.RE), runs at another duplex than
    /// the PHY linked at.
    pub fn duplex_mismatched(&self) -> bool {
        let mac_full = self.mac.medium & crate::mac::medium::FD != 0;
        self.mac.medium & crate::mac::medium::RE != 0
            && self.phy.full_duplex().is_some_and(|full| full != mac_full)
    }

    /// A frame starting at `start` meets one coming the other way that
    /// occupies the wire until `busy_until` (`ours`: the starting frame is
    /// ours). Under a MAC/PHY duplex mismatch they collide either way. On
    /// a link whose ends run different duplexes, the full-duplex end sends
    /// into the half-duplex end's frame: a late collision there, an FCS
    /// error at the other end (the half-duplex end defers to a frame it
    /// hears first). True when the frame is lost.
    fn collides(
        &mut self,
        busy_until: Instant,
        start: Instant,
        ours: bool,
        ev: &mut dyn NicEvents,
    ) -> bool {
        if start >= busy_until {
            return false;
        }
        let mac = self.duplex_mismatched();
        let wire = match (self.phy.full_duplex(), self.phy.partner_full_duplex()) {
            (Some(phy), Some(partner)) => phy != partner && phy == ours,
            _ => false,
        };
        if mac {
            ev.collision();
        }
        if wire {
            ev.wire_collision();
        }
        if (mac || wire) && self.duplex_mismatch == DuplexMismatch::Lose {
            ev.dropped(Drop::Collision, 1);
            return true;
        }
        false
    }

    pub fn set_rx_mode(&mut self, m: RxMode) {
        self.rx_mode = m;
    }

    pub fn rx_mode(&self) -> RxMode {
        self.rx_mode
    }

    pub fn set_pace_burst(&mut self, d: Duration) {
        self.pace_burst = d;
    }

    pub fn set_impair(&mut self, cfg: ImpairConfig) {
        self.impair = Impair::new(cfg);
    }

    pub fn impair_config(&self) -> &ImpairConfig {
        self.impair.config()
    }

    /// Parse one bulk OUT transfer and queue its frames; returns when the
    /// last of them leaves the MAC. The TX queue's bound does not apply:
    /// the session takes transfers in with [`Nic::bulk_out_some`].
    pub fn bulk_out(&mut self, data: &[u8], ev: &mut dyn NicEvents) -> Instant {
        let o = self.tx_parser.push(data);
        self.queue_parsed(o, data.len(), ev)
    }

    /// Parse as much of a bulk OUT transfer as the TX queue has room for,
    /// frame by frame; returns the bytes taken and when the last frame
    /// queued leaves the MAC. The TX queue never holds more than
    /// [`TX_QUEUE_FRAMES`] frames (each at most [`MAX_FRAME`] bytes).
    pub fn bulk_out_some(&mut self, data: &[u8], ev: &mut dyn NicEvents) -> (usize, Instant) {
        let room = TX_QUEUE_FRAMES.saturating_sub(self.tx_queue.len());
        let (n, o) = self.tx_parser.push_limit(data, room);
        (n, self.queue_parsed(o, data.len(), ev))
    }

    fn queue_parsed(&mut self, o: TxOutcome, len: usize, ev: &mut dyn NicEvents) -> Instant {
        if o.bad_header {
            ev.dropped(Drop::TxBadHeader, 1);
            ev.warn(format_args!(
                "tx: bad ASIX header in a {len}-byte transfer; rest dropped"
            ));
        }
        if o.oversized > 0 {
            ev.dropped(Drop::TxOversized, u64::from(o.oversized));
        }
        let mut ready = self.now;
        for f in o.frames {
            if let Some(t) = self.transmit(f, ev) {
                ready = ready.max(t);
            }
        }
        ready
    }

    /// Send a guest frame towards the wire; returns when it leaves.
    fn transmit(&mut self, mut frame: Vec<u8>, ev: &mut dyn NicEvents) -> Option<Instant> {
        if self.phy.isolated() {
            ev.dropped(Drop::Isolated, 1);
            return None;
        }
        if self.phy.loopback() {
            self.receive(frame, ev);
            return None;
        }
        if !self.phy.link_up() {
            ev.dropped(Drop::TxNoLink, 1);
            return None;
        }
        let wt = framing::wire_time(frame.len(), self.wire_rate());
        let (start, depart) = if self.paced {
            let start = self
                .tx_clock
                .max(self.pace_floor())
                .max(self.tx_paused_until);
            self.tx_clock = start + wt;
            (start, self.tx_clock)
        } else {
            let start = self.now.max(self.tx_paused_until);
            (start, start)
        };
        self.tx_busy_until = self.tx_busy_until.max(start + wt);
        if self.collides(self.rx_busy_until, start, true, ev) {
            return Some(depart);
        }
        match self.impair.apply(true, &mut frame) {
            Fate::Dropped => ev.dropped(Drop::Impaired, 1),
            fate => {
                if fate == Fate::Corrupted {
                    ev.corrupted();
                }
                self.tx_queue.push_back((depart, frame));
            }
        }
        Some(depart)
    }

    /// The bits per second a frame occupies the wire at: the negotiated line
    /// rate, times `pace_percent` when the link is modelled slower.
    fn wire_rate(&self) -> u64 {
        (self.mac.line_rate() * u64::from(self.pace_percent) / 100).max(1)
    }

    /// The earliest a paced frame may start: an idle wire earns credit for
    /// at most `pace_burst` of its idle time.
    fn pace_floor(&self) -> Instant {
        self.now.checked_sub(self.pace_burst).unwrap_or(self.now)
    }

    /// A frame arrived from the link partner (at the current time).
    pub fn wire_frame(&mut self, frame: Vec<u8>, ev: &mut dyn NicEvents) {
        let d = self.impair.delay(false);
        if d.is_zero() && self.rx_delay.is_empty() {
            self.arrive(frame, ev);
            return;
        }
        if !self.rx_delay.has_room(frame.len()) {
            ev.dropped(Drop::DelayOverflow, 1);
            return;
        }
        self.rx_delay.push(self.now + d, frame);
    }

    /// A frame reaches the PHY after its time on the wire.
    fn arrive(&mut self, mut frame: Vec<u8>, ev: &mut dyn NicEvents) {
        ev.on_wire(&frame);
        if !self.phy.link_up() || self.phy.loopback() {
            ev.dropped(Drop::RxNoLink, 1);
            return;
        }
        if frame.len() < 14 || frame.len() > MAX_FRAME {
            ev.dropped(Drop::RxLength, 1);
            return;
        }
        let start = self.now.max(self.rx_busy_until);
        self.rx_busy_until = start + framing::wire_time(frame.len(), self.wire_rate());
        if self.collides(self.tx_busy_until, start, false, ev) {
            return;
        }
        match self.impair.apply(false, &mut frame) {
            Fate::Dropped => return ev.dropped(Drop::Impaired, 1),
            Fate::Corrupted => {
                ev.corrupted();
                return ev.dropped(Drop::RxCrc, 1);
            }
            Fate::Pass => {}
        }
        if self.phy.isolated() {
            return ev.dropped(Drop::Isolated, 1);
        }
        if let Some(quanta) = pause_quanta(&frame) {
            return self.pause_received(quanta, ev);
        }
        self.receive(frame, ev);
    }

    fn receive(&mut self, frame: Vec<u8>, ev: &mut dyn NicEvents) {
        if !self.mac.rx_enabled() {
            return ev.dropped(Drop::RxGated, 1);
        }
        if !self.mac.accepts(&frame) {
            return ev.dropped(Drop::RxFiltered, 1);
        }
        if self.rx_full() {
            self.rx_filled(ev);
            let tfc = self.mac.medium & crate::mac::medium::TFC != 0;
            let why = if self.phy.pause_negotiated() && !tfc {
                Drop::RxOverflowTfcOff
            } else {
                Drop::RxOverflow
            };
            return ev.dropped(why, 1);
        }
        let ready = if self.paced {
            let start = self.rx_clock.max(self.pace_floor());
            self.rx_clock = start + framing::wire_time(frame.len(), self.wire_rate());
            self.rx_clock
        } else {
            self.now
        };
        self.rx_queue.push_back((ready, frame));
        if self.rx_full() {
            self.rx_filled(ev);
        }
    }

    /// A frame leaves the MAC at `t`; with latency it reaches the wire later.
    fn depart(&mut self, t: Instant, f: Vec<u8>, ev: &mut dyn NicEvents) {
        let d = self.impair.delay(true);
        if d.is_zero() && self.tx_delay.is_empty() {
            ev.on_wire(&f);
            self.wire_out.push(f);
        } else if !self.tx_delay.has_room(f.len()) {
            ev.dropped(Drop::DelayOverflow, 1);
        } else {
            self.tx_delay.push(t + d, f);
        }
    }

    /// Frames whose departure time has come leave the MAC.
    pub fn send_due(&mut self, ev: &mut dyn NicEvents) {
        if self.now < self.tx_paused_until {
            return;
        }
        while self.tx_queue.front().is_some_and(|(t, _)| *t <= self.now) {
            if let Some((t, f)) = self.tx_queue.pop_front() {
                ev.tx_frame(&f);
                self.depart(t, f, ev);
            }
        }
    }

    /// Frames whose time on a delayed wire is over arrive.
    pub fn wire_due(&mut self, ev: &mut dyn NicEvents) {
        while let Some(f) = self.rx_delay.pop_due(self.now) {
            self.arrive(f, ev);
        }
        while let Some(f) = self.tx_delay.pop_due(self.now) {
            ev.on_wire(&f);
            self.wire_out.push(f);
        }
    }

    /// RX data for a bulk IN request of `len` bytes, if a frame is ready.
    /// The RX gate (RX_CTL.SO, MEDIUM.RE) applies here too: frames queued
    /// before the guest closed it never reach it, nor does the rest of a
    /// record already begun (the driver resynchronises on the next header).
    pub fn take_rx(&mut self, len: u32, ev: &mut dyn NicEvents) -> Option<RxData> {
        if !self.mac.rx_enabled() && (!self.rx_queue.is_empty() || self.rx_tail.left() > 0) {
            let n = self.rx_queue.len() as u64 + u64::from(self.rx_tail.left() > 0);
            ev.dropped(Drop::RxGated, n);
            self.rx_queue.clear();
            self.rx_tail = RxTail::default();
            // A partner held off by XOFF would otherwise wait for an XON
            // that no later take ever sends.
            self.rx_drained(ev);
            return None;
        }
        if !self.rx_ready() {
            return None;
        }
        let data = match self.rx_mode {
            RxMode::Whole => self.take_whole(len, ev),
            RxMode::Stream => self.take_stream(len, ev),
        };
        self.rx_drained(ev);
        Some(data)
    }

    /// Whether a bulk IN request would get data now.
    fn rx_ready(&self) -> bool {
        self.rx_tail.left() > 0 || self.rx_queue.front().is_some_and(|(t, _)| *t <= self.now)
    }

    fn take_whole(&mut self, len: u32, ev: &mut dyn NicEvents) -> RxData {
        let now = self.now;
        let cap = (len as usize).min(MAX_RX_TRANSFER);
        let mut buf = Vec::with_capacity(cap);
        while let Some((t, f)) = self.rx_queue.front() {
            if *t > now || buf.len() + framing::rx_record_len(f.len()) > cap {
                break;
            }
            if let Some((_, f)) = self.rx_queue.pop_front() {
                framing::push_rx_record(&mut buf, &f);
                ev.rx_frame(&f);
            }
        }
        if !buf.is_empty() {
            return RxData::Records(buf);
        }
        if let Some((_, f)) = self.rx_queue.pop_front() {
            ev.warn(format_args!(
                "rx: {}-byte frame does not fit a {len}-byte request; request babbles, frame dropped",
                f.len()
            ));
        }
        ev.dropped(Drop::RxTooBigForRequest, 1);
        RxData::Babble
    }

    /// Fill the request from the FIFO's byte stream: the rest of a record
    /// begun in an earlier transfer, then records while they are ready,
    /// the last one cut where the request ends. Records are even in length
    /// and the FIFO is 16 bits wide, so every cut falls on an even offset
    /// (a header splits 2 + 2, never 1 + 3).
    fn take_stream(&mut self, len: u32, ev: &mut dyn NicEvents) -> RxData {
        let cap = (len as usize).min(MAX_RX_TRANSFER) & !1;
        if cap == 0 {
            ev.warn(format_args!(
                "rx: a {len}-byte request cannot hold one FIFO word; request babbles"
            ));
            return RxData::Babble;
        }
        let now = self.now;
        let mut buf = Vec::with_capacity(cap);
        loop {
            if self.rx_tail.left() > 0 {
                let tail = &mut self.rx_tail;
                let n = tail.left().min(cap - buf.len());
                buf.extend_from_slice(&tail.bytes[tail.pos..tail.pos + n]);
                tail.pos += n;
                if tail.left() > 0 {
                    break;
                }
                // The record is the 4-byte header, the frame and a pad.
                ev.rx_frame(&tail.bytes[4..4 + tail.frame_len]);
                self.rx_tail = RxTail::default();
            }
            if buf.len() == cap || !self.rx_queue.front().is_some_and(|(t, _)| *t <= now) {
                break;
            }
            let Some((_, f)) = self.rx_queue.pop_front() else {
                break;
            };
            let mut rec = Vec::with_capacity(framing::rx_record_len(f.len()));
            framing::push_rx_record(&mut rec, &f);
            self.rx_tail = RxTail {
                bytes: rec,
                pos: 0,
                frame_len: f.len(),
            };
        }
        RxData::Records(buf)
    }

    /// When the datapath next has something to do; RX frames count only
    /// when a request waits for them.
    pub fn next_event(&self, rx_wanted: bool) -> Option<Instant> {
        let rx = self.rx_queue.front().filter(|_| rx_wanted);
        let tail = (rx_wanted && self.rx_tail.left() > 0).then_some(self.now);
        [
            tail,
            self.phy.next_event(),
            self.tx_queue
                .front()
                .map(|(t, _)| (*t).max(self.tx_paused_until)),
            self.tx_delay.next_due(),
            self.rx_delay.next_due(),
            rx.map(|(t, _)| *t),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The most pause quanta a PAUSE frame asks for (XOFF).
pub const PAUSE_QUANTA_MAX: u16 = 0xffff;
/// The MAC control multicast address PAUSE frames go to (802.3 Annex 31B).
pub const PAUSE_DST: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x01];
const MAC_CONTROL: [u8; 2] = [0x88, 0x08];
const PAUSE_OPCODE: [u8; 2] = [0x00, 0x01];

/// A PAUSE frame from `src` (60 bytes, padded; the FCS is not modelled).
pub fn pause_frame(src: [u8; 6], quanta: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&PAUSE_DST);
    f.extend_from_slice(&src);
    f.extend_from_slice(&MAC_CONTROL);
    f.extend_from_slice(&PAUSE_OPCODE);
    f.extend_from_slice(&quanta.to_be_bytes());
    f.resize(60, 0);
    f
}

/// The quanta of a PAUSE frame (to the MAC control address, type 0x8808,
/// opcode 1); None for any other frame.
pub fn pause_quanta(f: &[u8]) -> Option<u16> {
    let is_pause = f.len() >= 18
        && f[..6] == PAUSE_DST
        && f[12..14] == MAC_CONTROL
        && f[14..16] == PAUSE_OPCODE;
    is_pause.then(|| u16::from_be_bytes([f[16], f[17]]))
}

#[cfg(test)]
#[path = "nic_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "rx_stream_tests.rs"]
mod rx_stream_tests;
