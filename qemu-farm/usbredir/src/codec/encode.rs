//! Encoding: [`Packet`]s to bytes, refused where the protocol does not
//! allow them (direction, hello order, id width, data length).

use super::{expects_data, name_of, receives, role_name, Codec};
use crate::error::Error;
use crate::message::*;
use crate::proto::HELLO_VERSION_LEN;
use crate::proto::{cap, msg_type as t, Caps, Role, HEADER_LEN_32, HEADER_LEN_64};

impl Codec {
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
