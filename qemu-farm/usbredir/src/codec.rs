//! Sans-IO encoder/decoder: bytes in, [`Packet`]s out, and back.

use crate::error::Error;
use crate::message::*;
use crate::proto::{cap, msg_type as t, Caps, Role, Status, HEADER_LEN_32, HEADER_LEN_64};
use crate::proto::{DEFAULT_MAX_PACKET_LEN, HELLO_VERSION_LEN};

/// How the data after a type header is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataRule {
    /// Fixed-size message: no data.
    None,
    /// Hello capability words or filter rules: any length.
    Free,
    /// A transfer: data present in one direction only (see `expects_data`).
    Transfer,
}

fn layout(code: u32, common: Caps) -> Option<(u32, DataRule)> {
    use DataRule::*;
    let bulk_len = if common.has(cap::BULK_LENGTH_32BIT) {
        10
    } else {
        8
    };
    let ep_info_len = if common.has(cap::BULK_STREAMS) {
        288
    } else if common.has(cap::EP_INFO_MAX_PACKET_SIZE) {
        160
    } else {
        96
    };
    let connect_len = if common.has(cap::CONNECT_DEVICE_VERSION) {
        10
    } else {
        8
    };
    Some(match code {
        t::HELLO => (HELLO_VERSION_LEN as u32, Free),
        t::DEVICE_CONNECT => (connect_len, None),
        t::DEVICE_DISCONNECT | t::RESET | t::GET_CONFIGURATION => (0, None),
        t::CANCEL_DATA_PACKET | t::FILTER_REJECT | t::DEVICE_DISCONNECT_ACK => (0, None),
        t::INTERFACE_INFO => (132, None),
        t::EP_INFO => (ep_info_len, None),
        t::SET_CONFIGURATION | t::GET_ALT_SETTING => (1, None),
        t::STOP_ISO_STREAM | t::START_INTERRUPT_RECEIVING | t::STOP_INTERRUPT_RECEIVING => {
            (1, None)
        }
        t::CONFIGURATION_STATUS | t::SET_ALT_SETTING => (2, None),
        t::ISO_STREAM_STATUS | t::INTERRUPT_RECEIVING_STATUS => (2, None),
        t::ALT_SETTING_STATUS | t::START_ISO_STREAM => (3, None),
        t::ALLOC_BULK_STREAMS => (8, None),
        t::FREE_BULK_STREAMS => (4, None),
        t::BULK_STREAMS_STATUS => (9, None),
        t::FILTER_FILTER => (0, Free),
        t::START_BULK_RECEIVING => (10, None),
        t::STOP_BULK_RECEIVING => (5, None),
        t::BULK_RECEIVING_STATUS => (6, None),
        t::CONTROL_PACKET => (10, Transfer),
        t::BULK_PACKET => (bulk_len, Transfer),
        t::ISO_PACKET | t::INTERRUPT_PACKET => (4, Transfer),
        t::BUFFERED_BULK_PACKET => (10, Transfer),
        _ => return Option::None,
    })
}

/// Whether a role may receive a message type.
fn receives(role: Role, code: u32) -> bool {
    let both = matches!(
        code,
        t::HELLO
            | t::FILTER_FILTER
            | t::CONTROL_PACKET
            | t::BULK_PACKET
            | t::ISO_PACKET
            | t::INTERRUPT_PACKET
    );
    let host_only = matches!(
        code,
        t::RESET
            | t::SET_CONFIGURATION
            | t::GET_CONFIGURATION
            | t::SET_ALT_SETTING
            | t::GET_ALT_SETTING
            | t::START_ISO_STREAM
            | t::STOP_ISO_STREAM
            | t::START_INTERRUPT_RECEIVING
            | t::STOP_INTERRUPT_RECEIVING
            | t::ALLOC_BULK_STREAMS
            | t::FREE_BULK_STREAMS
            | t::CANCEL_DATA_PACKET
            | t::FILTER_REJECT
            | t::DEVICE_DISCONNECT_ACK
            | t::START_BULK_RECEIVING
            | t::STOP_BULK_RECEIVING
    );
    both || (role == Role::Host) == host_only
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Host => "host",
        Role::Guest => "guest",
    }
}

/// Whether a transfer travelling to `receiver` carries data: commands to the
/// host carry OUT data, replies to the guest carry IN data.
fn expects_data(receiver: Role, is_in: bool) -> bool {
    match receiver {
        Role::Host => !is_in,
        Role::Guest => is_in,
    }
}

fn name_of(code: u32) -> &'static str {
    type_name(code).unwrap_or("unknown")
}

/// A little-endian cursor over a type header.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn u8(&mut self) -> u8 {
        let v = self.0[0];
        self.0 = &self.0[1..];
        v
    }
    fn u16(&mut self) -> u16 {
        let v = u16::from_le_bytes([self.0[0], self.0[1]]);
        self.0 = &self.0[2..];
        v
    }
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes([self.0[0], self.0[1], self.0[2], self.0[3]]);
        self.0 = &self.0[4..];
        v
    }
    fn arr32(&mut self) -> [u8; 32] {
        let mut a = [0u8; 32];
        a.copy_from_slice(&self.0[..32]);
        self.0 = &self.0[32..];
        a
    }
}

/// One end of a usbredir connection, without any I/O.
///
/// Feed received bytes with [`Codec::feed`] and pull messages with
/// [`Codec::next_packet`]; turn messages into bytes with [`Codec::encode`].
/// The codec tracks the hello exchange, because header and message sizes
/// depend on the capabilities both peers announced.
#[derive(Debug)]
pub struct Codec {
    role: Role,
    our_caps: Caps,
    peer: Option<Hello>,
    hello_sent: bool,
    max_len: u32,
    buf: Vec<u8>,
    pos: usize,
    skip: u64,
    poisoned: bool,
}

impl Codec {
    /// A codec for `role` announcing `caps` in its hello.
    pub fn new(role: Role, caps: Caps) -> Codec {
        Codec {
            role,
            our_caps: caps,
            peer: None,
            hello_sent: false,
            max_len: DEFAULT_MAX_PACKET_LEN,
            buf: Vec::new(),
            pos: 0,
            skip: 0,
            poisoned: false,
        }
    }

    /// Refuse packets whose `header.length` exceeds `max` (fatal error).
    pub fn with_max_packet_len(mut self, max: u32) -> Codec {
        self.max_len = max;
        self
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn our_caps(&self) -> Caps {
        self.our_caps
    }

    /// The peer's hello, once received.
    pub fn peer_hello(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// Capabilities both sides have; empty until the peer's hello arrived.
    pub fn common_caps(&self) -> Caps {
        match &self.peer {
            Some(h) => self.our_caps.common(h.caps),
            None => Caps(0),
        }
    }

    /// Size of `usb_redir_header` for the next packet.
    pub fn header_len(&self) -> usize {
        if self.common_caps().has(cap::IDS_64BIT) {
            HEADER_LEN_64
        } else {
            HEADER_LEN_32
        }
    }

    /// True after a fatal decoding error; further input is discarded.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes held in memory: undecoded ones and decoded ones not yet
    /// reclaimed (input is compacted as it streams through).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Append received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        if self.poisoned {
            return;
        }
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Start skipping the body of a refused packet whose header was consumed.
    fn refuse(&mut self, body: u32, err: Error) -> Option<Result<Packet, Error>> {
        self.skip = u64::from(body);
        Some(Err(err))
    }

    /// Decode the next complete packet, if any. `None` means more bytes are
    /// needed (or the codec is poisoned). Errors consume the bad packet.
    pub fn next_packet(&mut self) -> Option<Result<Packet, Error>> {
        if self.poisoned {
            return None;
        }
        if self.skip > 0 {
            let n = (self.buffered() as u64).min(self.skip);
            self.consume(n as usize);
            self.skip -= n;
            if self.skip > 0 {
                return None;
            }
        }
        let hlen = if self.peer.is_some() {
            self.header_len()
        } else {
            HEADER_LEN_32
        };
        let avail = &self.buf[self.pos..];
        if avail.len() < hlen {
            return None;
        }
        let code = u32::from_le_bytes([avail[0], avail[1], avail[2], avail[3]]);
        let length = u32::from_le_bytes([avail[4], avail[5], avail[6], avail[7]]);
        let id = if hlen == HEADER_LEN_64 {
            u64::from_le_bytes(avail[8..16].try_into().unwrap_or([0; 8]))
        } else {
            u64::from(u32::from_le_bytes([
                avail[8], avail[9], avail[10], avail[11],
            ]))
        };
        if length > self.max_len {
            self.poisoned = true;
            self.buf = Vec::new();
            self.pos = 0;
            return Some(Err(Error::Oversized {
                type_code: code,
                length,
                max: self.max_len,
            }));
        }
        let Some((th, rule)) = layout(code, self.common_caps()) else {
            self.consume(hlen);
            return self.refuse(
                length,
                Error::UnknownType {
                    type_code: code,
                    length,
                },
            );
        };
        let name = name_of(code);
        if self.peer.is_none() && code != t::HELLO {
            self.consume(hlen);
            return self.refuse(length, Error::HelloExpected { name });
        }
        if self.peer.is_some() && code == t::HELLO {
            self.consume(hlen);
            return self.refuse(length, Error::DuplicateHello);
        }
        if !receives(self.role, code) {
            self.consume(hlen);
            let receiver = role_name(self.role);
            return self.refuse(length, Error::WrongDirection { name, receiver });
        }
        if length < th {
            self.consume(hlen);
            return self.refuse(
                length,
                Error::ShortPacket {
                    name,
                    length,
                    expected: th,
                },
            );
        }
        if rule == DataRule::None && length != th {
            self.consume(hlen);
            return self.refuse(
                length,
                Error::BadLength {
                    name,
                    length,
                    expected: th,
                },
            );
        }
        let total = hlen + length as usize;
        if avail.len() < total {
            return None;
        }
        let body = &avail[hlen..total];
        let result = self.parse(code, id, &body[..th as usize], &body[th as usize..]);
        self.consume(total);
        if let Ok(Packet {
            msg: Message::Hello(h),
            ..
        }) = &result
        {
            self.peer = Some(h.clone());
        }
        Some(result)
    }

    // Long: one arm per usbredir packet type, in the protocol's order.
    fn parse(&self, code: u32, id: u64, th: &[u8], data: &[u8]) -> Result<Packet, Error> {
        let mut r = Rd(th);
        let name = name_of(code);
        let data_len = data.len() as u32;
        let check = |is_in: bool, length: u32| -> Result<(), Error> {
            let expected = if expects_data(self.role, is_in) {
                length
            } else {
                0
            };
            if data_len != expected {
                return Err(Error::DataLength {
                    name,
                    data_len,
                    expected,
                });
            }
            Ok(())
        };
        let common = self.common_caps();
        let msg = match code {
            t::HELLO => {
                if data.len() % 4 != 0 {
                    let expected = data_len & !3;
                    return Err(Error::DataLength {
                        name,
                        data_len,
                        expected,
                    });
                }
                let end = th.iter().position(|&b| b == 0).unwrap_or(th.len());
                let version = String::from_utf8_lossy(&th[..end]).into_owned();
                let mut words = data
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                let caps = Caps(words.next().unwrap_or(0));
                Message::Hello(Hello {
                    version,
                    caps,
                    extra_caps: words.collect(),
                })
            }
            t::DEVICE_CONNECT => Message::DeviceConnect(DeviceConnect {
                speed: r.u8(),
                device_class: r.u8(),
                device_subclass: r.u8(),
                device_protocol: r.u8(),
                vendor_id: r.u16(),
                product_id: r.u16(),
                device_version_bcd: if th.len() >= 10 { r.u16() } else { 0 },
            }),
            t::DEVICE_DISCONNECT => Message::DeviceDisconnect,
            t::RESET => Message::Reset,
            t::INTERFACE_INFO => Message::InterfaceInfo(Box::new(InterfaceInfo {
                interface_count: r.u32(),
                interface: r.arr32(),
                interface_class: r.arr32(),
                interface_subclass: r.arr32(),
                interface_protocol: r.arr32(),
            })),
            t::EP_INFO => {
                let mut e = EpInfo {
                    ep_type: r.arr32(),
                    interval: r.arr32(),
                    interface: r.arr32(),
                    ..EpInfo::default()
                };
                if common.has(cap::EP_INFO_MAX_PACKET_SIZE) || common.has(cap::BULK_STREAMS) {
                    for m in e.max_packet_size.iter_mut() {
                        *m = r.u16();
                    }
                }
                if common.has(cap::BULK_STREAMS) {
                    for s in e.max_streams.iter_mut() {
                        *s = r.u32();
                    }
                }
                Message::EpInfo(Box::new(e))
            }
            t::SET_CONFIGURATION => Message::SetConfiguration {
                configuration: r.u8(),
            },
            t::GET_CONFIGURATION => Message::GetConfiguration,
            t::CONFIGURATION_STATUS => Message::ConfigurationStatus {
                status: Status(r.u8()),
                configuration: r.u8(),
            },
            t::SET_ALT_SETTING => Message::SetAltSetting {
                interface: r.u8(),
                alt: r.u8(),
            },
            t::GET_ALT_SETTING => Message::GetAltSetting { interface: r.u8() },
            t::ALT_SETTING_STATUS => Message::AltSettingStatus {
                status: Status(r.u8()),
                interface: r.u8(),
                alt: r.u8(),
            },
            t::START_ISO_STREAM => Message::StartIsoStream {
                endpoint: r.u8(),
                pkts_per_urb: r.u8(),
                no_urbs: r.u8(),
            },
            t::STOP_ISO_STREAM => Message::StopIsoStream { endpoint: r.u8() },
            t::ISO_STREAM_STATUS => Message::IsoStreamStatus {
                status: Status(r.u8()),
                endpoint: r.u8(),
            },
            t::START_INTERRUPT_RECEIVING => Message::StartInterruptReceiving { endpoint: r.u8() },
            t::STOP_INTERRUPT_RECEIVING => Message::StopInterruptReceiving { endpoint: r.u8() },
            t::INTERRUPT_RECEIVING_STATUS => Message::InterruptReceivingStatus {
                status: Status(r.u8()),
                endpoint: r.u8(),
            },
            t::ALLOC_BULK_STREAMS => Message::AllocBulkStreams {
                endpoints: r.u32(),
                no_streams: r.u32(),
            },
            t::FREE_BULK_STREAMS => Message::FreeBulkStreams { endpoints: r.u32() },
            t::BULK_STREAMS_STATUS => Message::BulkStreamsStatus {
                endpoints: r.u32(),
                no_streams: r.u32(),
                status: Status(r.u8()),
            },
            t::CANCEL_DATA_PACKET => Message::CancelDataPacket,
            t::FILTER_REJECT => Message::FilterReject,
            t::FILTER_FILTER => match data.split_last() {
                Some((0, rules)) => Message::FilterFilter {
                    rules: rules.to_vec(),
                },
                _ => return Err(Error::FilterNotTerminated),
            },
            t::DEVICE_DISCONNECT_ACK => Message::DeviceDisconnectAck,
            t::START_BULK_RECEIVING => Message::StartBulkReceiving {
                stream_id: r.u32(),
                bytes_per_transfer: r.u32(),
                endpoint: r.u8(),
                no_transfers: r.u8(),
            },
            t::STOP_BULK_RECEIVING => Message::StopBulkReceiving {
                stream_id: r.u32(),
                endpoint: r.u8(),
            },
            t::BULK_RECEIVING_STATUS => Message::BulkReceivingStatus {
                stream_id: r.u32(),
                endpoint: r.u8(),
                status: Status(r.u8()),
            },
            t::CONTROL_PACKET => {
                let mut p = ControlPacket {
                    endpoint: r.u8(),
                    request: r.u8(),
                    requesttype: r.u8(),
                    status: Status(r.u8()),
                    value: r.u16(),
                    index: r.u16(),
                    length: r.u16(),
                    data: Vec::new(),
                };
                check(p.requesttype & 0x80 != 0, u32::from(p.length))?;
                p.data = data.to_vec();
                Message::ControlPacket(p)
            }
            t::BULK_PACKET => {
                let endpoint = r.u8();
                let status = Status(r.u8());
                let low = r.u16();
                let stream_id = r.u32();
                let high = if th.len() >= 10 { r.u16() } else { 0 };
                let length = u32::from(low) | u32::from(high) << 16;
                check(endpoint & 0x80 != 0, length)?;
                let data = data.to_vec();
                Message::BulkPacket(BulkPacket {
                    endpoint,
                    status,
                    length,
                    stream_id,
                    data,
                })
            }
            t::ISO_PACKET | t::INTERRUPT_PACKET => {
                let endpoint = r.u8();
                let status = Status(r.u8());
                let length = r.u16();
                check(endpoint & 0x80 != 0, u32::from(length))?;
                let p = SmallDataPacket {
                    endpoint,
                    status,
                    length,
                    data: data.to_vec(),
                };
                if code == t::ISO_PACKET {
                    Message::IsoPacket(p)
                } else {
                    Message::InterruptPacket(p)
                }
            }
            t::BUFFERED_BULK_PACKET => {
                let stream_id = r.u32();
                let length = r.u32();
                let endpoint = r.u8();
                let status = Status(r.u8());
                check(true, length)?;
                Message::BufferedBulkPacket(BufferedBulkPacket {
                    stream_id,
                    length,
                    endpoint,
                    status,
                    data: data.to_vec(),
                })
            }
            _ => {
                return Err(Error::UnknownType {
                    type_code: code,
                    length: th.len() as u32,
                })
            }
        };
        Ok(Packet { id, msg })
    }

    /// Our hello with `version` and our capabilities (id 0).
    pub fn encode_hello(&mut self, version: &str, out: &mut Vec<u8>) -> Result<(), Error> {
        let hello = Hello {
            version: version.to_string(),
            caps: self.our_caps,
            extra_caps: vec![],
        };
        self.encode(&Packet::new(0, Message::Hello(hello)), out)
    }

    /// Append the wire form of `pkt` to `out`. Nothing is appended on error.
    pub fn encode(&mut self, pkt: &Packet, out: &mut Vec<u8>) -> Result<(), Error> {
        let code = pkt.msg.type_code();
        let name = name_of(code);
        let receiver = self.role.peer();
        if !receives(receiver, code) {
            return Err(Error::WrongDirection {
                name,
                receiver: role_name(receiver),
            });
        }
        let is_hello = code == t::HELLO;
        if is_hello && self.hello_sent {
            return Err(Error::DuplicateHello);
        }
        if !is_hello && !self.hello_sent {
            return Err(Error::HelloNotSent { name });
        }
        if !is_hello && self.peer.is_none() {
            return Err(Error::PeerHelloPending { name });
        }
        let hlen = if is_hello {
            HEADER_LEN_32
        } else {
            self.header_len()
        };
        if hlen == HEADER_LEN_32 && pkt.id > u64::from(u32::MAX) {
            return Err(Error::IdTooWide(pkt.id));
        }
        let common = self.common_caps();
        let start = out.len();
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        if hlen == HEADER_LEN_64 {
            out.extend_from_slice(&pkt.id.to_le_bytes());
        } else {
            out.extend_from_slice(&(pkt.id as u32).to_le_bytes());
        }
        if let Err(e) = write_body(&pkt.msg, common, receiver, out) {
            out.truncate(start);
            return Err(e);
        }
        let length = (out.len() - start - hlen) as u32;
        out[start + 4..start + 8].copy_from_slice(&length.to_le_bytes());
        if is_hello {
            self.hello_sent = true;
        }
        Ok(())
    }
}

fn data_check(
    name: &'static str,
    receiver: Role,
    is_in: bool,
    length: u32,
    data: &[u8],
) -> Result<(), Error> {
    let expected = if expects_data(receiver, is_in) {
        length
    } else {
        0
    };
    if data.len() as u64 != u64::from(expected) {
        return Err(Error::DataLength {
            name,
            data_len: data.len() as u32,
            expected,
        });
    }
    Ok(())
}

// Long: one arm per usbredir packet type, in the protocol's order.
fn write_body(msg: &Message, common: Caps, receiver: Role, out: &mut Vec<u8>) -> Result<(), Error> {
    let name = msg.name();
    match msg {
        Message::Hello(h) => {
            let v = h.version.as_bytes();
            if v.len() >= HELLO_VERSION_LEN {
                return Err(Error::VersionTooLong(v.len()));
            }
            let mut field = [0u8; HELLO_VERSION_LEN];
            field[..v.len()].copy_from_slice(v);
            out.extend_from_slice(&field);
            out.extend_from_slice(&h.caps.0.to_le_bytes());
            for w in &h.extra_caps {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        Message::DeviceConnect(d) => {
            out.extend_from_slice(&[
                d.speed,
                d.device_class,
                d.device_subclass,
                d.device_protocol,
            ]);
            out.extend_from_slice(&d.vendor_id.to_le_bytes());
            out.extend_from_slice(&d.product_id.to_le_bytes());
            if common.has(cap::CONNECT_DEVICE_VERSION) {
                out.extend_from_slice(&d.device_version_bcd.to_le_bytes());
            }
        }
        Message::DeviceDisconnect
        | Message::Reset
        | Message::GetConfiguration
        | Message::CancelDataPacket
        | Message::FilterReject
        | Message::DeviceDisconnectAck => {}
        Message::InterfaceInfo(i) => {
            out.extend_from_slice(&i.interface_count.to_le_bytes());
            out.extend_from_slice(&i.interface);
            out.extend_from_slice(&i.interface_class);
            out.extend_from_slice(&i.interface_subclass);
            out.extend_from_slice(&i.interface_protocol);
        }
        Message::EpInfo(e) => {
            out.extend_from_slice(&e.ep_type);
            out.extend_from_slice(&e.interval);
            out.extend_from_slice(&e.interface);
            if common.has(cap::EP_INFO_MAX_PACKET_SIZE) || common.has(cap::BULK_STREAMS) {
                for m in &e.max_packet_size {
                    out.extend_from_slice(&m.to_le_bytes());
                }
            }
            if common.has(cap::BULK_STREAMS) {
                for s in &e.max_streams {
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
        Message::SetConfiguration { configuration } => out.push(*configuration),
        Message::ConfigurationStatus {
            status,
            configuration,
        } => out.extend_from_slice(&[status.0, *configuration]),
        Message::SetAltSetting { interface, alt } => out.extend_from_slice(&[*interface, *alt]),
        Message::GetAltSetting { interface } => out.push(*interface),
        Message::AltSettingStatus {
            status,
            interface,
            alt,
        } => out.extend_from_slice(&[status.0, *interface, *alt]),
        Message::StartIsoStream {
            endpoint,
            pkts_per_urb,
            no_urbs,
        } => out.extend_from_slice(&[*endpoint, *pkts_per_urb, *no_urbs]),
        Message::StopIsoStream { endpoint }
        | Message::StartInterruptReceiving { endpoint }
        | Message::StopInterruptReceiving { endpoint } => out.push(*endpoint),
        Message::IsoStreamStatus { status, endpoint }
        | Message::InterruptReceivingStatus { status, endpoint } => {
            out.extend_from_slice(&[status.0, *endpoint])
        }
        Message::AllocBulkStreams {
            endpoints,
            no_streams,
        } => {
            out.extend_from_slice(&endpoints.to_le_bytes());
            out.extend_from_slice(&no_streams.to_le_bytes());
        }
        Message::FreeBulkStreams { endpoints } => out.extend_from_slice(&endpoints.to_le_bytes()),
        Message::BulkStreamsStatus {
            endpoints,
            no_streams,
            status,
        } => {
            out.extend_from_slice(&endpoints.to_le_bytes());
            out.extend_from_slice(&no_streams.to_le_bytes());
            out.push(status.0);
        }
        Message::FilterFilter { rules } => {
            out.extend_from_slice(rules);
            out.push(0);
        }
        Message::StartBulkReceiving {
            stream_id,
            bytes_per_transfer,
            endpoint,
            no_transfers,
        } => {
            out.extend_from_slice(&stream_id.to_le_bytes());
            out.extend_from_slice(&bytes_per_transfer.to_le_bytes());
            out.extend_from_slice(&[*endpoint, *no_transfers]);
        }
        Message::StopBulkReceiving {
            stream_id,
            endpoint,
        } => {
            out.extend_from_slice(&stream_id.to_le_bytes());
            out.push(*endpoint);
        }
        Message::BulkReceivingStatus {
            stream_id,
            endpoint,
            status,
        } => {
            out.extend_from_slice(&stream_id.to_le_bytes());
            out.extend_from_slice(&[*endpoint, status.0]);
        }
        Message::ControlPacket(p) => {
            data_check(
                name,
                receiver,
                p.requesttype & 0x80 != 0,
                p.length.into(),
                &p.data,
            )?;
            out.extend_from_slice(&[p.endpoint, p.request, p.requesttype, p.status.0]);
            out.extend_from_slice(&p.value.to_le_bytes());
            out.extend_from_slice(&p.index.to_le_bytes());
            out.extend_from_slice(&p.length.to_le_bytes());
            out.extend_from_slice(&p.data);
        }
        Message::BulkPacket(p) => {
            data_check(name, receiver, p.endpoint & 0x80 != 0, p.length, &p.data)?;
            let wide = common.has(cap::BULK_LENGTH_32BIT);
            if !wide && p.length > 0xffff {
                return Err(Error::BulkTooLong(p.length));
            }
            out.extend_from_slice(&[p.endpoint, p.status.0]);
            out.extend_from_slice(&(p.length as u16).to_le_bytes());
            out.extend_from_slice(&p.stream_id.to_le_bytes());
            if wide {
                out.extend_from_slice(&((p.length >> 16) as u16).to_le_bytes());
            }
            out.extend_from_slice(&p.data);
        }
        Message::IsoPacket(p) | Message::InterruptPacket(p) => {
            data_check(
                name,
                receiver,
                p.endpoint & 0x80 != 0,
                p.length.into(),
                &p.data,
            )?;
            out.extend_from_slice(&[p.endpoint, p.status.0]);
            out.extend_from_slice(&p.length.to_le_bytes());
            out.extend_from_slice(&p.data);
        }
        Message::BufferedBulkPacket(p) => {
            data_check(name, receiver, true, p.length, &p.data)?;
            out.extend_from_slice(&p.stream_id.to_le_bytes());
            out.extend_from_slice(&p.length.to_le_bytes());
            out.extend_from_slice(&[p.endpoint, p.status.0]);
            out.extend_from_slice(&p.data);
        }
    }
    Ok(())
}
