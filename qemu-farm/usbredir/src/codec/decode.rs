//! Decoding: received bytes to [`Packet`]s, each header checked against
//! the hello exchange, the role and the type's size before its body is
//! parsed; a refused packet's body is skipped.

use super::{expects_data, layout, name_of, receives, role_name, Codec, DataRule};
use crate::error::Error;
use crate::message::*;
use crate::proto::{cap, msg_type as t, Caps, Status, HEADER_LEN_32, HEADER_LEN_64};

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

impl Codec {
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
}
