//! The adapter as seen over usbredir: the session (hello, announce,
//! configuration, control requests, pending bulk transfers, the interrupt
//! endpoint, unplug and replug) around the NIC datapath (`nic`). It takes
//! decoded usbredir packets and wire frames and produces usbredir packets
//! and wire frames. No I/O; time is passed in, so tests and the benchmark
//! drive it directly. Counters and the capture are the device's
//! [`NicEvents`](crate::nic::NicEvents).
//!
//! This file holds the session (its settings, [`DeviceConfig`], are the
//! leaf `crate::config`); beside it: `stats` ([`Counters`], the capture), `transfers` (control requests, bulk
//! queues) and `controls` (knobs for the control socket).

use std::time::{Duration, Instant};

use usbredir::proto::cap;
use usbredir::{BulkPacket, Caps, Message, Packet, SmallDataPacket, Status};

use crate::descriptors::{self, EP_BULK_IN, EP_BULK_OUT, EP_INTERRUPT};
use crate::ep0::UsbState;
use crate::faults::MdioFaults;
use crate::mac::Mac;
use crate::nic::Nic;
use crate::pending::Pending;
use crate::phy::Phy;
use crate::{log_i, log_t, log_w};

mod controls;
mod stats;
mod transfers;

pub use crate::config::{format_mac, DeviceConfig, DEFAULT_PACE_BURST, DEFAULT_PHY_TIMING};
pub use stats::Counters;
use stats::Stats;
use transfers::cancelled;

/// Capabilities the model announces: connect_device_version,
/// device_disconnect_ack, ep_info_max_packet_size, 64-bit ids, 32-bit bulk
/// length. qemu-xhci needs the last three.
pub const OUR_CAPS: Caps = Caps(0x7a);

pub use crate::nic::{DELAY_FRAMES, TX_QUEUE_FRAMES};
/// Bulk OUT transfers waiting for room in the TX queue. The event loop
/// stops reading from QEMU at [`OUT_WAIT_HIGH`], so a peer that keeps
/// sending meets back-pressure, not loss.
pub const OUT_WAIT_MAX: usize = 64;
pub const OUT_WAIT_HIGH: usize = 48;
/// Bytes of bulk OUT data held (waiting, and the transfer being parsed)
/// above which the event loop stops reading from QEMU. One more transfer
/// may arrive past it (a usbredir packet is at most 4 MiB).
pub const OUT_WAIT_BYTES_HIGH: usize = 1 << 20;
/// Bulk IN requests held at once; more are answered with an I/O error
/// (Linux's usbnet keeps about 60 in flight).
pub const BULK_IN_MAX: usize = 1024;

/// A bulk OUT transfer taken in part: its frames up to `pos` are queued.
struct OutHead {
    id: u64,
    data: Vec<u8>,
    pos: usize,
    /// When the last frame queued so far leaves the MAC.
    ready: Instant,
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
    /// Bytes in `out_wait`.
    out_wait_bytes: usize,
    /// The bulk OUT being parsed, frame by frame as the TX queue has room.
    out_head: Option<OutHead>,
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
            out_wait_bytes: 0,
            out_head: None,
            out_done: Pending::new(OUT_WAIT_MAX + TX_QUEUE_FRAMES),
            mdio_faults: MdioFaults::default(),
            replug_at: None,
            stats: Stats {
                counters: Counters::default(),
                pcap: None,
                tcp_tx: Default::default(),
                tcp_rx: Default::default(),
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
    pub fn announced(&self) -> bool {
        self.announced
    }

    /// usbredir packets to send, in order.
    pub fn take_usb(&mut self) -> Vec<Packet> {
        std::mem::take(&mut self.usb_out)
    }

    /// Frames to put on the wire, in order.
    pub fn take_wire(&mut self) -> Vec<Vec<u8>> {
        self.nic.take_wire()
    }

    /// Whether the partner may send now (callers stop reading the wire
    /// when false): see [`Nic::partner_may_send`].
    pub fn partner_may_send(&self) -> bool {
        self.nic.partner_may_send()
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
            .chain(self.out_head.take().map(|h| h.id))
            .chain(self.out_wait.drain().into_iter().map(|(id, _)| id))
            .collect();
        self.out_wait_bytes = 0;
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

    // Long: one arm per usbredir message QEMU sends.
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
                    // USB 2.0 §9.4.5: SET_CONFIGURATION clears every halt.
                    let before = std::mem::take(&mut self.usb.halted);
                    self.halts_changed(before);
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
                    // SET_INTERFACE clears the interface's halts too.
                    let before = std::mem::take(&mut self.usb.halted);
                    self.halts_changed(before);
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
        if self.int_receiving && self.announced && !self.usb.is_halted(EP_INTERRUPT) {
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
}

#[cfg(test)]
mod tests;
