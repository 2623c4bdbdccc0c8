//! The adapter as seen over usbredir: the session (hello, announce,
//! configuration, control requests, pending bulk transfers, the interrupt
//! endpoint, unplug and replug) around the NIC datapath (`nic`). It takes
//! decoded usbredir packets and wire frames and produces usbredir packets
//! and wire frames. No I/O; time is passed in, so tests and the benchmark
//! drive it directly. Counters and the capture are the device's
//! [`NicEvents`].

use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

use usbredir::proto::cap;
use usbredir::{BulkPacket, Caps, ControlPacket, Message, Packet, SmallDataPacket, Status};

use crate::descriptors::{self, Variant, EP_BULK_IN, EP_BULK_OUT, EP_INTERRUPT};
use crate::ep0::{Ep0, UsbState};
use crate::faults::MdioFaults;
use crate::impair::ImpairConfig;
use crate::mac::{cmd, Addr0, Effects, Mac, Reply, Setup};
use crate::nic::{Drop, Nic, NicEvents, RxData};
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

pub use crate::nic::{DELAY_FRAMES, TX_QUEUE_FRAMES};
/// Bulk OUT transfers waiting for room in the TX queue. The event loop
/// stops reading from QEMU at [`OUT_WAIT_HIGH`], so a peer that keeps
/// sending meets back-pressure, not loss.
pub const OUT_WAIT_MAX: usize = 64;
pub const OUT_WAIT_HIGH: usize = 48;
/// Bulk IN requests held at once; more are answered with an I/O error
/// (Linux's usbnet keeps about 60 in flight).
pub const BULK_IN_MAX: usize = 1024;

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

/// Counters and the wire capture: what the datapath reports lands here.
struct Stats {
    counters: Counters,
    pcap: Option<Pcap>,
}

impl NicEvents for Stats {
    fn tx_frame(&mut self, len: usize) {
        self.counters.tx_frames += 1;
        self.counters.tx_bytes += len as u64;
    }
    fn rx_frame(&mut self, len: usize) {
        self.counters.rx_frames += 1;
        self.counters.rx_bytes += len as u64;
    }
    fn on_wire(&mut self, frame: &[u8]) {
        if let Some(p) = &mut self.pcap {
            if let Err(e) = p.write(frame) {
                log_w!("pcap: {}: {e}; capture stopped", p.path().display());
                self.pcap = None;
            }
        }
    }
    fn dropped(&mut self, why: Drop, n: u64) {
        let c = &mut self.counters;
        *match why {
            Drop::TxNoLink => &mut c.tx_dropped_no_link,
            Drop::TxBadHeader | Drop::TxOversized => &mut c.tx_errors,
            Drop::RxNoLink => &mut c.rx_dropped_no_link,
            Drop::RxLength => &mut c.rx_length_errors,
            Drop::RxGated => &mut c.rx_dropped_gated,
            Drop::RxFiltered => &mut c.rx_filtered,
            Drop::RxOverflow => &mut c.rx_overflow,
            Drop::RxTooBigForRequest => &mut c.rx_too_big_for_request,
            Drop::Impaired => &mut c.impair_dropped,
            Drop::DelayOverflow => &mut c.delay_overflow,
        } += n;
    }
    fn corrupted(&mut self) {
        self.counters.impair_corrupted += 1;
    }
    fn warn(&mut self, msg: std::fmt::Arguments<'_>) {
        log_w!("{msg}");
    }
}

pub struct Device {
    cfg: DeviceConfig,
    serial: String,
    nic: Nic,
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
    mdio_faults: MdioFaults,
    replug_at: Option<Instant>,
    stats: Stats,
    usb_out: Vec<Packet>,
}

impl Device {
    pub fn new(cfg: DeviceConfig, now: Instant) -> Device {
        let serial = cfg.mac[3..].iter().map(|b| format!("{b:02X}")).collect();
        Device {
            nic: Nic::new(&cfg, now),
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
            mdio_faults: MdioFaults::default(),
            replug_at: None,
            stats: Stats {
                counters: Counters::default(),
                pcap: None,
            },
            usb_out: Vec::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }
    pub fn phy(&self) -> &Phy {
        &self.nic.phy
    }
    pub fn phy_mut(&mut self) -> &mut Phy {
        &mut self.nic.phy
    }
    pub fn mac(&self) -> &Mac {
        &self.nic.mac
    }
    pub fn counters(&self) -> &Counters {
        &self.stats.counters
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
        self.nic.tx_queued()
    }

    /// Whether the device takes more packets from QEMU now; the event loop
    /// stops reading while it does not.
    pub fn usb_room(&self) -> bool {
        self.out_wait.len() < OUT_WAIT_HIGH
    }

    pub fn reset_counters(&mut self) {
        self.stats.counters = Counters::default();
        self.nic.phy.reset_counters();
    }

    /// usbredir packets to send, in order.
    pub fn take_usb(&mut self) -> Vec<Packet> {
        std::mem::take(&mut self.usb_out)
    }

    /// Frames to put on the wire, in order.
    pub fn take_wire(&mut self) -> Vec<Vec<u8>> {
        self.nic.take_wire()
    }

    /// Room for frames from the wire (callers stop reading when false).
    pub fn rx_room(&self) -> bool {
        self.nic.rx_room()
    }

    fn tick(&mut self, now: Instant) {
        self.nic.tick(now);
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
        self.nic.reset();
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
        self.replug_at = Some(self.nic.now() + down);
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
        self.stats.counters.usbredir_errors += 1;
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
                self.stats.counters.usb_resets += 1;
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
        self.poll(self.nic.now());
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
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_IN));
        } else if self.out_done.cancel(id) || self.out_wait.cancel(id) {
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_OUT));
        } else {
            log_t!("usb: cancel of unknown id {id:#x} (already completed)");
        }
    }

    fn control(&mut self, id: u64, cp: ControlPacket) {
        self.stats.counters.control_requests += 1;
        let mdio = match (cp.requesttype, cp.request) {
            (0xc0, cmd::READ_MII_REG) => Some(false),
            (0x40, cmd::WRITE_MII_REG) => Some(true),
            _ => None,
        };
        if let Some(write) = mdio {
            if cp.index <= 31 && self.mdio_faults.fires(write, cp.index as u8) {
                self.stats.counters.mdio_faults_injected += 1;
                self.stats.counters.control_stalls += 1;
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
            mac: &mut self.nic.mac,
            phy: &mut self.nic.phy,
            effects: &mut effects,
        }
        .handle(&s, &cp.data);
        self.nic.apply(effects);
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
                self.stats.counters.control_stalls += 1;
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
            self.stats.counters.bulk_refused += 1;
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
        while self.nic.tx_room() && !self.out_done.is_full() {
            let Some((id, data)) = self.out_wait.pop_front() else {
                break;
            };
            self.stats.counters.bulk_out_transfers += 1;
            let ready = self.nic.bulk_out(&data, &mut self.stats);
            let pushed = self.out_done.push(id, (data.len() as u32, ready));
            debug_assert!(pushed.is_ok(), "ids are unique across the OUT queues");
            any = true;
        }
        any
    }

    /// A frame arrived from the link partner.
    pub fn wire_frame(&mut self, now: Instant, frame: Vec<u8>) {
        self.tick(now);
        self.nic.wire_frame(frame, &mut self.stats);
        self.poll(self.nic.now());
    }

    /// Run timers: frames leaving, OUT completions, bulk IN completions,
    /// link-change interrupts. Returns when it next has something to do.
    pub fn poll(&mut self, now: Instant) -> Option<Instant> {
        self.tick(now);
        let now = self.nic.now();
        if self.int_receiving && self.announced {
            let link = self.nic.phy.link_up();
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
                self.stats.counters.interrupt_packets += 1;
                self.send(id, Message::InterruptPacket(p));
            }
        }
        loop {
            self.nic.send_due(&mut self.stats);
            if !self.admit_outs() {
                break;
            }
        }
        self.nic.wire_due(&mut self.stats);
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
        self.fill_bulk_in();
        let mut next = self.nic.next_event(!self.bulk_in.is_empty());
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some(t) = self.replug_at {
            consider(t);
        }
        if let Some((_, (_, t))) = self.out_done.front() {
            consider(*t);
        }
        next
    }

    /// Answer bulk IN requests, oldest first, while frames are ready.
    fn fill_bulk_in(&mut self) {
        while let Some((id, &len)) = self.bulk_in.front() {
            let Some(rx) = self.nic.take_rx(len, &mut self.stats) else {
                break;
            };
            self.bulk_in.pop_front();
            let m = match rx {
                RxData::Records(data) => {
                    self.stats.counters.bulk_in_transfers += 1;
                    BulkPacket {
                        endpoint: EP_BULK_IN,
                        length: data.len() as u32,
                        data,
                        ..Default::default()
                    }
                }
                RxData::Babble => BulkPacket {
                    endpoint: EP_BULK_IN,
                    status: Status::BABBLE,
                    ..Default::default()
                },
            };
            self.send(id, Message::BulkPacket(m));
        }
    }

    // Controls used by the control socket.

    pub fn set_impair(&mut self, cfg: ImpairConfig) {
        self.nic.set_impair(cfg);
    }

    pub fn impair_config(&self) -> &ImpairConfig {
        self.nic.impair_config()
    }

    pub fn mdio_faults(&self) -> &MdioFaults {
        &self.mdio_faults
    }

    pub fn mdio_faults_mut(&mut self) -> &mut MdioFaults {
        &mut self.mdio_faults
    }

    pub fn pcap_start(&mut self, path: &Path) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.stats.pcap = Some(Pcap::create(path)?);
        Ok(())
    }

    /// Capture into a file the caller opened (the control socket opens it
    /// inside the capture directory).
    pub fn pcap_start_file(&mut self, file: std::fs::File, path: &Path) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.stats.pcap = Some(Pcap::new(file, path)?);
        Ok(())
    }

    /// Stop capturing; returns the number of frames written.
    pub fn pcap_stop(&mut self) -> std::io::Result<u64> {
        match self.stats.pcap.take() {
            Some(p) => {
                if p.dropped > 0 {
                    log_w!(
                        "pcap: {}: {} frames dropped (the writer fell behind)",
                        p.path().display(),
                        p.dropped
                    );
                }
                p.finish()
            }
            None => Ok(0),
        }
    }

    pub fn pcap_path(&self) -> Option<&Path> {
        self.stats.pcap.as_ref().map(|p| p.path())
    }

    pub fn set_partner(&mut self, now: Instant, p: Partner) {
        self.tick(now);
        self.cfg.partner = p.clone();
        self.nic.phy.set_partner(p);
    }

    pub fn set_quirks(&mut self, now: Instant, q: Quirks) {
        self.tick(now);
        self.cfg.quirks = q;
        self.nic.phy.set_quirks(q);
    }

    /// Depth of the pacer's token bucket (see [`DeviceConfig::pace_burst`]).
    pub fn set_pace_burst(&mut self, d: Duration) {
        self.cfg.pace_burst = d;
        self.nic.set_pace_burst(d);
    }

    pub fn set_autoneg_delay(&mut self, d: Duration) {
        self.cfg.autoneg = d;
        self.nic.phy.set_autoneg_delay(d);
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
