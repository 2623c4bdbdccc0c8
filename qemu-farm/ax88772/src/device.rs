//! The adapter as seen over usbredir: takes decoded usbredir packets and
//! wire frames, produces usbredir packets and wire frames. No I/O; time is
//! passed in, so tests and the benchmark drive it directly.

use serde::Serialize;
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use usbredir::proto::cap;
use usbredir::{BulkPacket, Caps, ControlPacket, Message, Packet, SmallDataPacket, Status};

use crate::descriptors::{self, Variant, EP_BULK_IN, EP_BULK_OUT, EP_INTERRUPT};
use crate::ep0::{Ep0, UsbState};
use crate::faults::MdioFaults;
use crate::framing::{self, TxParser, MAX_FRAME, MAX_RX_TRANSFER};
use crate::impair::{Fate, Impair, ImpairConfig};
use crate::mac::{cmd, Addr0, Effects, Mac, Reply, Setup};
use crate::pcap::Pcap;
use crate::pending::{Pending, Refused};
use crate::phy::{Partner, Phy, Quirks};
use crate::{log_i, log_t, log_w};

/// Capabilities the model announces: connect_device_version,
/// device_disconnect_ack, ep_info_max_packet_size, 64-bit ids, 32-bit bulk
/// length. qemu-xhci needs the last three.
pub const OUR_CAPS: Caps = Caps(0x7a);

/// Default depth of the pacer's token bucket (see [`DeviceConfig::pace_burst`]):
/// 10 ms, 125 kB at 100 Mbit/s, about a switch port's buffer. With strict
/// spacing (0) every stall of the one-vCPU TCG guest or of the loaded host
/// left the wire idle: in-guest TCP reached 80-88% of the line rate, against
/// 95-100% with 10 ms (bench/guest-throughput.sh, 2 loaded cores).
pub const DEFAULT_PACE_BURST: Duration = Duration::from_millis(10);

/// Frames the MAC holds for the wire (about 190 kB, 15 ms at 100 Mbit/s,
/// more than the pacer's default burst). A bulk OUT is taken in only when
/// its frames find room here; until then it waits, unparsed.
pub const TX_QUEUE_FRAMES: usize = 128;
/// Bulk OUT transfers waiting for room in the TX queue. The event loop
/// stops reading from QEMU at [`OUT_WAIT_HIGH`], so a peer that keeps
/// sending meets back-pressure, not loss.
pub const OUT_WAIT_MAX: usize = 64;
pub const OUT_WAIT_HIGH: usize = 48;
/// Bulk IN requests held at once; more are answered with an I/O error
/// (Linux's usbnet keeps about 60 in flight).
pub const BULK_IN_MAX: usize = 1024;
/// Frames held on a delayed wire (latency and jitter), each direction.
pub const DELAY_FRAMES: usize = 8192;

#[derive(Clone, Debug, Serialize)]
pub struct DeviceConfig {
    pub variant: Variant,
    #[serde(serialize_with = "ser_mac")]
    pub mac: [u8; 6],
    pub phy_id: u32,
    pub addr0: Addr0,
    /// Pace frames to the line rate of the MAC's medium mode.
    pub paced: bool,
    /// Depth of the pacer's token bucket: after the wire sat idle, up to
    /// this much of the idle time can be caught up at once. Scheduling
    /// hiccups of the host, QEMU or a TCG guest then cost no line rate,
    /// while over any window W the wire carries at most (W + burst) of it.
    #[serde(serialize_with = "ser_us")]
    pub pace_burst: Duration,
    /// Frames held between the wire and the guest's bulk IN requests.
    pub rx_queue_frames: usize,
    #[serde(serialize_with = "ser_ms")]
    pub autoneg: Duration,
    pub partner: Partner,
    pub quirks: Quirks,
}

fn ser_mac<S: serde::Serializer>(m: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_mac(m))
}

fn ser_us<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl DeviceConfig {
    pub fn new(variant: Variant, mac: [u8; 6]) -> DeviceConfig {
        DeviceConfig {
            variant,
            mac,
            phy_id: variant.phy_id(),
            addr0: Addr0::Alias,
            paced: true,
            pace_burst: DEFAULT_PACE_BURST,
            rx_queue_frames: 256,
            autoneg: Duration::ZERO,
            partner: Partner::default(),
            quirks: Quirks::default(),
        }
    }
}

/// Frame and request counters (MDIO counts live in the PHY snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub tx_dropped_no_link: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_length_errors: u64,
    pub rx_dropped_no_link: u64,
    pub rx_dropped_gated: u64,
    pub rx_filtered: u64,
    pub rx_overflow: u64,
    pub rx_too_big_for_request: u64,
    pub impair_dropped: u64,
    pub impair_corrupted: u64,
    pub bulk_out_transfers: u64,
    pub bulk_in_transfers: u64,
    pub bulk_cancelled: u64,
    pub bulk_refused: u64,
    pub control_requests: u64,
    pub control_stalls: u64,
    pub mdio_faults_injected: u64,
    pub delay_overflow: u64,
    pub interrupt_packets: u64,
    pub usb_resets: u64,
    pub usbredir_errors: u64,
}

pub struct Device {
    cfg: DeviceConfig,
    serial: String,
    mac: Mac,
    phy: Phy,
    usb: UsbState,
    peer_caps: Option<Caps>,
    announced: bool,
    plugged: bool,
    awaiting_ack: bool,
    int_receiving: bool,
    int_id: u64,
    reported_link: Option<bool>,
    bulk_in: Pending<u32>,
    out_wait: Pending<Vec<u8>>,
    out_done: Pending<(u32, Instant)>,
    tx_parser: TxParser,
    tx_queue: VecDeque<(Instant, Vec<u8>)>,
    rx_queue: VecDeque<(Instant, Vec<u8>)>,
    tx_clock: Instant,
    rx_clock: Instant,
    impair: Impair,
    mdio_faults: MdioFaults,
    replug_at: Option<Instant>,
    tx_delay: VecDeque<(Instant, Vec<u8>)>,
    rx_delay: VecDeque<(Instant, Vec<u8>)>,
    counters: Counters,
    pcap: Option<Pcap>,
    usb_out: Vec<Packet>,
    wire_out: Vec<Vec<u8>>,
    now: Instant,
}

impl Device {
    pub fn new(cfg: DeviceConfig, now: Instant) -> Device {
        let mut phy = Phy::new(cfg.phy_id, now);
        phy.set_autoneg_delay(cfg.autoneg);
        phy.set_partner(cfg.partner.clone());
        phy.set_quirks(cfg.quirks);
        let serial = cfg.mac[3..].iter().map(|b| format!("{b:02X}")).collect();
        Device {
            mac: Mac::new(cfg.variant, cfg.mac, cfg.addr0),
            phy,
            serial,
            usb: UsbState::default(),
            peer_caps: None,
            announced: false,
            plugged: true,
            awaiting_ack: false,
            int_receiving: false,
            int_id: 0,
            reported_link: None,
            bulk_in: Pending::new(BULK_IN_MAX),
            out_wait: Pending::new(OUT_WAIT_MAX),
            out_done: Pending::new(OUT_WAIT_MAX + TX_QUEUE_FRAMES),
            tx_parser: TxParser::default(),
            tx_queue: VecDeque::new(),
            rx_queue: VecDeque::new(),
            tx_clock: now,
            rx_clock: now,
            impair: Impair::new(ImpairConfig::default()),
            mdio_faults: MdioFaults::default(),
            replug_at: None,
            tx_delay: VecDeque::new(),
            rx_delay: VecDeque::new(),
            counters: Counters::default(),
            pcap: None,
            usb_out: Vec::new(),
            wire_out: Vec::new(),
            now,
            cfg,
        }
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }
    pub fn phy(&self) -> &Phy {
        &self.phy
    }
    pub fn phy_mut(&mut self) -> &mut Phy {
        &mut self.phy
    }
    pub fn mac(&self) -> &Mac {
        &self.mac
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn announced(&self) -> bool {
        self.announced
    }
    /// Outstanding bulk IN requests.
    pub fn pending_bulk_in(&self) -> usize {
        self.bulk_in.len()
    }

    /// Bulk OUT transfers not yet completed (waiting or on their way).
    pub fn pending_bulk_out(&self) -> usize {
        self.out_wait.len() + self.out_done.len()
    }

    /// Frames queued towards the wire.
    pub fn tx_queued(&self) -> usize {
        self.tx_queue.len()
    }

    /// Whether the device takes more packets from QEMU now; the event loop
    /// stops reading while it does not.
    pub fn usb_room(&self) -> bool {
        self.out_wait.len() < OUT_WAIT_HIGH
    }

    pub fn reset_counters(&mut self) {
        self.counters = Counters::default();
        self.phy.reset_counters();
    }

    /// usbredir packets to send, in order.
    pub fn take_usb(&mut self) -> Vec<Packet> {
        std::mem::take(&mut self.usb_out)
    }

    /// Frames to put on the wire, in order.
    pub fn take_wire(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.wire_out)
    }

    /// Room for frames from the wire (callers stop reading when false).
    pub fn rx_room(&self) -> bool {
        self.rx_queue.len() < self.cfg.rx_queue_frames
    }

    fn tick(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
        self.phy.set_time(self.now);
    }

    fn send(&mut self, id: u64, msg: Message) {
        self.usb_out.push(Packet::new(id, msg));
    }

    /// A new usbredir connection: everything from the previous one is gone,
    /// and the adapter is freshly plugged in.
    pub fn transport_opened(&mut self, now: Instant) {
        self.tick(now);
        self.peer_caps = None;
        self.announced = false;
        self.awaiting_ack = false;
        self.int_id = 0;
        self.power_on(false);
        self.usb_out.clear();
    }

    pub fn transport_closed(&mut self, now: Instant) {
        self.transport_opened(now);
    }

    /// Power-on state of the chip; pending transfers are answered as
    /// cancelled when `answer` is set.
    fn power_on(&mut self, answer: bool) {
        for (id, _) in self.bulk_in.drain() {
            if answer {
                self.send(id, cancelled(EP_BULK_IN));
            }
        }
        let outs: Vec<u64> = (self.out_done.drain().into_iter().map(|(id, _)| id))
            .chain(self.out_wait.drain().into_iter().map(|(id, _)| id))
            .collect();
        for id in outs {
            if answer {
                self.send(id, cancelled(EP_BULK_OUT));
            }
        }
        self.tx_parser.reset();
        self.tx_queue.clear();
        self.rx_queue.clear();
        self.tx_clock = self.now;
        self.rx_clock = self.now;
        self.mac.reset();
        self.phy.power_on_reset();
        self.usb = UsbState::default();
        self.int_receiving = false;
        self.reported_link = None;
    }

    fn announce(&mut self) {
        self.send(
            0,
            Message::InterfaceInfo(Box::new(descriptors::interface_info())),
        );
        self.send(0, Message::EpInfo(Box::new(descriptors::ep_info())));
        self.send(
            0,
            Message::DeviceConnect(descriptors::device_connect(self.cfg.variant)),
        );
        self.announced = true;
        log_i!(
            "usb: device_connect {:04x}:{:04x} ({})",
            descriptors::VENDOR_ASIX,
            self.cfg.variant.product_id(),
            self.cfg.variant.product()
        );
    }

    fn both_have(&self, bit: u32) -> bool {
        self.peer_caps.is_some_and(|c| c.common(OUR_CAPS).has(bit))
    }

    /// Simulate unplugging the adapter (device_disconnect).
    pub fn unplug(&mut self, now: Instant) {
        self.tick(now);
        self.plugged = false;
        if self.announced {
            self.send(0, Message::DeviceDisconnect);
            self.announced = false;
            self.awaiting_ack = self.both_have(cap::DEVICE_DISCONNECT_ACK);
            self.power_on(false);
            log_i!("usb: device_disconnect");
        }
    }

    /// Unplug now and plug back in after `down` (a USB disconnect and
    /// reconnect of the adapter).
    pub fn replug(&mut self, now: Instant, down: Duration) {
        self.unplug(now);
        self.replug_at = Some(self.now + down);
    }

    /// When a scheduled replug happens.
    pub fn replug_at(&self) -> Option<Instant> {
        self.replug_at
    }

    /// Plug the adapter back in (after the peer acknowledged the unplug).
    pub fn plug(&mut self, now: Instant) {
        self.tick(now);
        self.replug_at = None;
        self.plugged = true;
        if self.peer_caps.is_some() && !self.announced && !self.awaiting_ack {
            self.power_on(false);
            self.announce();
        }
    }

    pub fn plugged(&self) -> bool {
        self.plugged
    }

    /// Count a decoding error reported by the codec.
    pub fn usbredir_error(&mut self) {
        self.counters.usbredir_errors += 1;
    }

    /// Handle one packet from QEMU.
    pub fn handle(&mut self, now: Instant, pkt: Packet) {
        self.tick(now);
        let id = pkt.id;
        log_t!("usb: <- {} id {id:#x}", pkt.msg.name());
        let configured = self.usb.configuration != 0;
        match pkt.msg {
            Message::Hello(h) => {
                log_i!("usb: peer hello '{}' caps {:#x}", h.version, h.caps.0);
                self.peer_caps = Some(h.caps);
                if self.plugged {
                    self.announce();
                }
            }
            Message::Reset => {
                self.counters.usb_resets += 1;
                self.power_on(true);
            }
            Message::SetConfiguration { configuration } => {
                let status = if configuration <= 1 {
                    self.usb.configuration = configuration;
                    self.send_infos();
                    Status::SUCCESS
                } else {
                    log_w!("usb: set_configuration {configuration} refused");
                    Status::INVAL
                };
                let configuration = self.usb.configuration;
                self.send(
                    id,
                    Message::ConfigurationStatus {
                        status,
                        configuration,
                    },
                );
            }
            Message::GetConfiguration => {
                let configuration = self.usb.configuration;
                self.send(
                    id,
                    Message::ConfigurationStatus {
                        status: Status::SUCCESS,
                        configuration,
                    },
                );
            }
            Message::SetAltSetting { interface, alt } => {
                if configured && interface == 0 && alt == 0 {
                    self.send_infos();
                    let m = Message::AltSettingStatus {
                        status: Status::SUCCESS,
                        interface,
                        alt,
                    };
                    self.send(id, m);
                } else {
                    log_w!(
                        "usb: set_alt_setting {interface}/{alt} refused (configuration {})",
                        self.usb.configuration
                    );
                    let m = Message::AltSettingStatus {
                        status: Status::INVAL,
                        interface,
                        alt: 255,
                    };
                    self.send(id, m);
                }
            }
            Message::GetAltSetting { interface } => {
                let (status, alt) = if configured && interface == 0 {
                    (Status::SUCCESS, 0)
                } else {
                    (Status::INVAL, 255)
                };
                self.send(
                    id,
                    Message::AltSettingStatus {
                        status,
                        interface,
                        alt,
                    },
                );
            }
            Message::StartInterruptReceiving { endpoint } => {
                let ok = configured && endpoint == EP_INTERRUPT;
                if ok {
                    self.int_receiving = true;
                    self.reported_link = None;
                }
                let status = if ok { Status::SUCCESS } else { Status::INVAL };
                self.send(id, Message::InterruptReceivingStatus { status, endpoint });
            }
            Message::StopInterruptReceiving { endpoint } => {
                let ok = endpoint == EP_INTERRUPT;
                if ok {
                    self.int_receiving = false;
                }
                let status = if ok { Status::SUCCESS } else { Status::INVAL };
                self.send(id, Message::InterruptReceivingStatus { status, endpoint });
            }
            Message::StartIsoStream { endpoint, .. } | Message::StopIsoStream { endpoint } => {
                self.send(
                    id,
                    Message::IsoStreamStatus {
                        status: Status::INVAL,
                        endpoint,
                    },
                );
            }
            Message::AllocBulkStreams { endpoints, .. }
            | Message::FreeBulkStreams { endpoints } => {
                let m = Message::BulkStreamsStatus {
                    endpoints,
                    no_streams: 0,
                    status: Status::INVAL,
                };
                self.send(id, m);
            }
            Message::StartBulkReceiving {
                stream_id,
                endpoint,
                ..
            }
            | Message::StopBulkReceiving {
                stream_id,
                endpoint,
            } => {
                let m = Message::BulkReceivingStatus {
                    stream_id,
                    endpoint,
                    status: Status::INVAL,
                };
                self.send(id, m);
            }
            Message::CancelDataPacket => self.cancel(id),
            Message::FilterReject => {
                log_w!("usb: QEMU's filter rejected the device; staying disconnected");
                self.announced = false;
                self.plugged = false;
            }
            Message::FilterFilter { rules } => {
                log_i!("usb: peer filter '{}'", String::from_utf8_lossy(&rules));
            }
            Message::DeviceDisconnectAck => {
                self.awaiting_ack = false;
                if self.plugged && self.peer_caps.is_some() && !self.announced {
                    self.power_on(false);
                    self.announce();
                }
            }
            Message::ControlPacket(cp) => self.control(id, cp),
            Message::BulkPacket(bp) => self.bulk(id, bp, configured),
            Message::InterruptPacket(p) => {
                log_w!(
                    "usb: interrupt_packet for endpoint {:#04x} refused",
                    p.endpoint
                );
                let m = SmallDataPacket {
                    endpoint: p.endpoint,
                    status: Status::STALL,
                    ..Default::default()
                };
                self.send(id, Message::InterruptPacket(m));
            }
            Message::IsoPacket(p) => {
                let m = SmallDataPacket {
                    endpoint: p.endpoint,
                    status: Status::INVAL,
                    ..Default::default()
                };
                self.send(id, Message::IsoPacket(m));
            }
            other => log_w!("usb: unexpected {} ignored", other.name()),
        }
        self.poll(self.now);
    }

    fn send_infos(&mut self) {
        self.send(
            0,
            Message::InterfaceInfo(Box::new(descriptors::interface_info())),
        );
        self.send(0, Message::EpInfo(Box::new(descriptors::ep_info())));
    }

    fn cancel(&mut self, id: u64) {
        if self.bulk_in.cancel(id) {
            self.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_IN));
        } else if self.out_done.cancel(id) || self.out_wait.cancel(id) {
            self.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_OUT));
        } else {
            log_t!("usb: cancel of unknown id {id:#x} (already completed)");
        }
    }

    fn control(&mut self, id: u64, cp: ControlPacket) {
        self.counters.control_requests += 1;
        let mdio = match (cp.requesttype, cp.request) {
            (0xc0, cmd::READ_MII_REG) => Some(false),
            (0x40, cmd::WRITE_MII_REG) => Some(true),
            _ => None,
        };
        if let Some(write) = mdio {
            if cp.index <= 31 && self.mdio_faults.fires(write, cp.index as u8) {
                self.counters.mdio_faults_injected += 1;
                self.counters.control_stalls += 1;
                log_i!(
                    "mdio: injected {} fault on register {:#04x}",
                    if write { "write" } else { "read" },
                    cp.index
                );
                let m = ControlPacket {
                    data: Vec::new(),
                    length: 0,
                    status: Status::STALL,
                    ..cp
                };
                self.send(id, Message::ControlPacket(m));
                return;
            }
        }
        let s = Setup {
            requesttype: cp.requesttype,
            request: cp.request,
            value: cp.value,
            index: cp.index,
            length: cp.length,
        };
        let mut effects = Effects::default();
        let reply = Ep0 {
            variant: self.cfg.variant,
            serial: &self.serial,
            usb: &mut self.usb,
            mac: &mut self.mac,
            phy: &mut self.phy,
            effects: &mut effects,
        }
        .handle(&s, &cp.data);
        if effects.flush_rx {
            self.rx_queue.clear();
        }
        if effects.flush_tx {
            self.tx_queue.clear();
            self.tx_parser.reset();
        }
        let base = ControlPacket {
            data: Vec::new(),
            length: 0,
            status: Status::SUCCESS,
            ..cp
        };
        let reply = match reply {
            Reply::Data(d) => ControlPacket {
                length: d.len() as u16,
                data: d,
                ..base
            },
            Reply::Done(n) => ControlPacket { length: n, ..base },
            Reply::Stall => {
                self.counters.control_stalls += 1;
                ControlPacket {
                    status: Status::STALL,
                    ..base
                }
            }
        };
        self.send(id, Message::ControlPacket(reply));
    }

    fn bulk(&mut self, id: u64, bp: BulkPacket, configured: bool) {
        let ok_ep = bp.endpoint == EP_BULK_IN || bp.endpoint == EP_BULK_OUT;
        if !configured || !ok_ep {
            log_w!(
                "usb: bulk_packet ep {:#04x} len {} refused (configuration {})",
                bp.endpoint,
                bp.length,
                self.usb.configuration
            );
            let m = BulkPacket {
                endpoint: bp.endpoint,
                status: Status::STALL,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
            return;
        }
        let pushed = if bp.endpoint == EP_BULK_IN {
            self.bulk_in.push(id, bp.length)
        } else {
            self.out_wait.push(id, bp.data)
        };
        if let Err(why) = pushed {
            self.counters.bulk_refused += 1;
            let status = match why {
                Refused::Full => {
                    log_w!(
                        "usb: bulk_packet ep {:#04x} id {id:#x} refused: {} transfers already pending",
                        bp.endpoint,
                        if bp.endpoint == EP_BULK_IN { BULK_IN_MAX } else { OUT_WAIT_MAX }
                    );
                    Status::IOERROR
                }
                Refused::DuplicateId => {
                    log_w!(
                        "usb: bulk_packet ep {:#04x} id {id:#x} refused: that id is already pending",
                        bp.endpoint
                    );
                    Status::INVAL
                }
            };
            let m = BulkPacket {
                endpoint: bp.endpoint,
                status,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
            return;
        }
        if bp.endpoint == EP_BULK_OUT {
            self.admit_outs();
        }
    }

    /// Take waiting bulk OUTs in while the TX queue has room; each
    /// completes once its last frame has left. Returns whether any was.
    fn admit_outs(&mut self) -> bool {
        let mut any = false;
        while self.tx_queue.len() < TX_QUEUE_FRAMES && !self.out_done.is_full() {
            let Some((id, data)) = self.out_wait.pop_front() else {
                break;
            };
            let ready = self.bulk_out(&data);
            let pushed = self.out_done.push(id, (data.len() as u32, ready));
            debug_assert!(pushed.is_ok(), "ids are unique across the OUT queues");
            any = true;
        }
        any
    }

    /// Parse one bulk OUT transfer and queue its frames; returns when the
    /// last of them leaves.
    fn bulk_out(&mut self, data: &[u8]) -> Instant {
        self.counters.bulk_out_transfers += 1;
        let o = self.tx_parser.push(data);
        if o.bad_header {
            self.counters.tx_errors += 1;
            log_w!(
                "tx: bad ASIX header in a {}-byte transfer; rest dropped",
                data.len()
            );
        }
        self.counters.tx_errors += u64::from(o.oversized);
        let mut ready = self.now;
        for f in o.frames {
            if let Some(t) = self.transmit(f) {
                ready = ready.max(t);
            }
        }
        ready
    }

    /// Send a guest frame towards the wire; returns when it has left.
    fn transmit(&mut self, mut frame: Vec<u8>) -> Option<Instant> {
        if self.phy.loopback() {
            self.receive(frame);
            return None;
        }
        if !self.phy.link_up() {
            self.counters.tx_dropped_no_link += 1;
            return None;
        }
        let depart = if self.cfg.paced {
            let start = self.tx_clock.max(self.pace_floor());
            self.tx_clock = start + framing::wire_time(frame.len(), self.mac.line_rate());
            self.tx_clock
        } else {
            self.now
        };
        match self.impair.apply(true, &mut frame) {
            Fate::Dropped => self.counters.impair_dropped += 1,
            fate => {
                if fate == Fate::Corrupted {
                    self.counters.impair_corrupted += 1;
                }
                self.tx_queue.push_back((depart, frame));
            }
        }
        Some(depart)
    }

    /// The earliest a paced frame may start: an idle wire earns credit for
    /// at most `pace_burst` of its idle time.
    fn pace_floor(&self) -> Instant {
        self.now
            .checked_sub(self.cfg.pace_burst)
            .unwrap_or(self.now)
    }

    /// A frame arrived from the link partner.
    pub fn wire_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.tick(now);
        let d = self.impair.delay(false);
        if d.is_zero() && self.rx_delay.is_empty() {
            self.arrive(frame);
            self.poll(self.now);
            return;
        }
        if self.rx_delay.len() >= DELAY_FRAMES {
            self.counters.delay_overflow += 1;
            return;
        }
        let due = self
            .rx_delay
            .back()
            .map_or(self.now + d, |(t, _)| (*t).max(self.now + d));
        self.rx_delay.push_back((due, frame));
        self.poll(self.now);
    }

    /// A frame reaches the PHY after its time on the wire.
    fn arrive(&mut self, mut frame: Vec<u8>) {
        self.capture(&frame);
        if !self.phy.link_up() || self.phy.loopback() {
            self.counters.rx_dropped_no_link += 1;
            return;
        }
        if frame.len() < 14 || frame.len() > MAX_FRAME {
            self.counters.rx_length_errors += 1;
            return;
        }
        match self.impair.apply(false, &mut frame) {
            Fate::Dropped => {
                self.counters.impair_dropped += 1;
                return;
            }
            Fate::Corrupted => self.counters.impair_corrupted += 1,
            Fate::Pass => {}
        }
        self.receive(frame);
    }

    fn receive(&mut self, frame: Vec<u8>) {
        if !self.mac.rx_enabled() {
            self.counters.rx_dropped_gated += 1;
            return;
        }
        if !self.mac.accepts(&frame) {
            self.counters.rx_filtered += 1;
            return;
        }
        if !self.rx_room() {
            self.counters.rx_overflow += 1;
            return;
        }
        let ready = if self.cfg.paced {
            let start = self.rx_clock.max(self.pace_floor());
            self.rx_clock = start + framing::wire_time(frame.len(), self.mac.line_rate());
            self.rx_clock
        } else {
            self.now
        };
        self.rx_queue.push_back((ready, frame));
    }

    fn capture(&mut self, frame: &[u8]) {
        if let Some(p) = &mut self.pcap {
            if let Err(e) = p.write(frame) {
                log_w!("pcap: {}: {e}; capture stopped", p.path().display());
                self.pcap = None;
            }
        }
    }

    /// A frame leaves the MAC at `t`; with latency it reaches the wire later.
    fn depart(&mut self, t: Instant, f: Vec<u8>) {
        let d = self.impair.delay(true);
        if d.is_zero() && self.tx_delay.is_empty() {
            self.capture(&f);
            self.wire_out.push(f);
        } else if self.tx_delay.len() >= DELAY_FRAMES {
            self.counters.delay_overflow += 1;
        } else {
            let due = self.tx_delay.back().map_or(t + d, |(b, _)| (*b).max(t + d));
            self.tx_delay.push_back((due, f));
        }
    }

    /// Run timers: frames leaving, OUT completions, bulk IN completions,
    /// link-change interrupts. Returns when it next has something to do.
    pub fn poll(&mut self, now: Instant) -> Option<Instant> {
        self.tick(now);
        let now = self.now;
        if self.int_receiving && self.announced {
            let link = self.phy.link_up();
            if self.reported_link != Some(link) {
                self.reported_link = Some(link);
                let data = vec![0xa1, 0x00, u8::from(link), 0, 0, 0, 0, 0];
                let p = SmallDataPacket {
                    endpoint: EP_INTERRUPT,
                    status: Status::SUCCESS,
                    length: 8,
                    data,
                };
                let id = self.int_id;
                self.int_id += 1;
                self.counters.interrupt_packets += 1;
                self.send(id, Message::InterruptPacket(p));
            }
        }
        loop {
            while self.tx_queue.front().is_some_and(|(t, _)| *t <= now) {
                if let Some((t, f)) = self.tx_queue.pop_front() {
                    self.counters.tx_frames += 1;
                    self.counters.tx_bytes += f.len() as u64;
                    self.depart(t, f);
                }
            }
            if !self.admit_outs() {
                break;
            }
        }
        while self.rx_delay.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, f)) = self.rx_delay.pop_front() {
                self.arrive(f);
            }
        }
        while self.tx_delay.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, f)) = self.tx_delay.pop_front() {
                self.capture(&f);
                self.wire_out.push(f);
            }
        }
        if self.replug_at.is_some_and(|t| t <= now) {
            self.plug(now);
        }
        while let Some((id, &(len, t))) = self.out_done.front() {
            if t > now {
                break;
            }
            self.out_done.pop_front();
            let m = BulkPacket {
                endpoint: EP_BULK_OUT,
                length: len,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
        }
        self.fill_bulk_in(now);
        let mut next = self.phy.next_event();
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some((t, _)) = self.tx_queue.front() {
            consider(*t);
        }
        if let Some((t, _)) = self.tx_delay.front() {
            consider(*t);
        }
        if let Some((t, _)) = self.rx_delay.front() {
            consider(*t);
        }
        if let Some(t) = self.replug_at {
            consider(t);
        }
        if let Some((_, (_, t))) = self.out_done.front() {
            consider(*t);
        }
        if !self.bulk_in.is_empty() {
            if let Some((t, _)) = self.rx_queue.front() {
                consider(*t);
            }
        }
        next
    }

    fn fill_bulk_in(&mut self, now: Instant) {
        // The RX gate (RX_CTL.SO, MEDIUM.RE) applies at delivery too:
        // frames queued before the guest closed it never reach it.
        if !self.mac.rx_enabled() && !self.rx_queue.is_empty() {
            self.counters.rx_dropped_gated += self.rx_queue.len() as u64;
            self.rx_queue.clear();
            return;
        }
        while let Some((id, &len)) = self.bulk_in.front() {
            if !self.rx_queue.front().is_some_and(|(t, _)| *t <= now) {
                break;
            }
            let cap = (len as usize).min(MAX_RX_TRANSFER);
            let mut buf = Vec::with_capacity(cap);
            while let Some((t, f)) = self.rx_queue.front() {
                if *t > now {
                    break;
                }
                let rl = framing::rx_record_len(f.len());
                if buf.len() + rl > cap {
                    break;
                }
                if let Some((_, f)) = self.rx_queue.pop_front() {
                    framing::push_rx_record(&mut buf, &f);
                    self.counters.rx_frames += 1;
                    self.counters.rx_bytes += f.len() as u64;
                }
            }
            self.bulk_in.pop_front();
            if buf.is_empty() {
                // The request cannot hold the next record: the chip's
                // packet overflows it (babble), and that frame is gone.
                if let Some((_, f)) = self.rx_queue.pop_front() {
                    log_w!(
                        "rx: {}-byte frame does not fit a {len}-byte request; request babbles, frame dropped",
                        f.len()
                    );
                }
                self.counters.rx_too_big_for_request += 1;
                let m = BulkPacket {
                    endpoint: EP_BULK_IN,
                    status: Status::BABBLE,
                    ..Default::default()
                };
                self.send(id, Message::BulkPacket(m));
                continue;
            }
            self.counters.bulk_in_transfers += 1;
            let m = BulkPacket {
                endpoint: EP_BULK_IN,
                length: buf.len() as u32,
                data: buf,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
        }
    }

    // Controls used by the control socket.

    pub fn set_impair(&mut self, cfg: ImpairConfig) {
        self.impair = Impair::new(cfg);
    }

    pub fn impair_config(&self) -> &ImpairConfig {
        self.impair.config()
    }

    pub fn mdio_faults(&self) -> &MdioFaults {
        &self.mdio_faults
    }

    pub fn mdio_faults_mut(&mut self) -> &mut MdioFaults {
        &mut self.mdio_faults
    }

    pub fn pcap_start(&mut self, path: &Path) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.pcap = Some(Pcap::create(path)?);
        Ok(())
    }

    /// Capture into a file the caller opened (the control socket opens it
    /// inside the capture directory).
    pub fn pcap_start_file(&mut self, file: std::fs::File, path: &Path) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.pcap = Some(Pcap::new(file, path)?);
        Ok(())
    }

    /// Stop capturing; returns the number of frames written.
    pub fn pcap_stop(&mut self) -> std::io::Result<u64> {
        match self.pcap.take() {
            Some(p) => p.finish(),
            None => Ok(0),
        }
    }

    pub fn pcap_path(&self) -> Option<&Path> {
        self.pcap.as_ref().map(|p| p.path())
    }

    pub fn set_partner(&mut self, now: Instant, p: Partner) {
        self.tick(now);
        self.cfg.partner = p.clone();
        self.phy.set_partner(p);
    }

    pub fn set_quirks(&mut self, now: Instant, q: Quirks) {
        self.tick(now);
        self.cfg.quirks = q;
        self.phy.set_quirks(q);
    }

    pub fn set_autoneg_delay(&mut self, d: Duration) {
        self.cfg.autoneg = d;
        self.phy.set_autoneg_delay(d);
    }
}

fn cancelled(endpoint: u8) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint,
        status: Status::CANCELLED,
        ..Default::default()
    })
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
