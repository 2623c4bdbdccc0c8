//! Every message type survives encode and decode in the direction the
//! protocol sends it, with the exact length its type header declares.

mod common;

use common::{guest_after_hello, host_after_hello};
use usbredir::*;

fn round_trip(from: &mut Codec, to: &mut Codec, p: &Packet) {
    let mut bytes = Vec::new();
    from.encode(p, &mut bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", p.msg.name()));
    // Fed one byte at a time: nothing decodes before the last byte.
    for (i, b) in bytes.iter().enumerate() {
        to.feed(&[*b]);
        if i + 1 < bytes.len() {
            assert!(to.next_packet().is_none(), "{} decoded early", p.msg.name());
        }
    }
    let got = to
        .next_packet()
        .unwrap_or_else(|| panic!("{} not decoded", p.msg.name()))
        .unwrap_or_else(|e| panic!("{}: {e}", p.msg.name()));
    assert_eq!(&got, p);
    assert_eq!(to.buffered(), 0, "{} left bytes behind", p.msg.name());
}

fn status(s: u8) -> Status {
    Status(s)
}

#[test]
fn every_message_from_qemu_round_trips() {
    let (mut g, mut h) = (guest_after_hello(), host_after_hello());
    let msgs = vec![
        Message::Reset,
        Message::SetConfiguration { configuration: 1 },
        Message::GetConfiguration,
        Message::SetAltSetting {
            interface: 2,
            alt: 3,
        },
        Message::GetAltSetting { interface: 4 },
        Message::StartIsoStream {
            endpoint: 0x81,
            pkts_per_urb: 8,
            no_urbs: 3,
        },
        Message::StopIsoStream { endpoint: 0x81 },
        Message::StartInterruptReceiving { endpoint: 0x81 },
        Message::StopInterruptReceiving { endpoint: 0x81 },
        Message::AllocBulkStreams {
            endpoints: 0x0006_0002,
            no_streams: 16,
        },
        Message::FreeBulkStreams {
            endpoints: 0x0000_0102,
        },
        Message::CancelDataPacket,
        Message::FilterReject,
        Message::FilterFilter {
            rules: b"0x03,-1,-1,-1,0|-1,-1,-1,-1,1".to_vec(),
        },
        Message::DeviceDisconnectAck,
        Message::StartBulkReceiving {
            stream_id: 7,
            bytes_per_transfer: 16384,
            endpoint: 0x82,
            no_transfers: 4,
        },
        Message::StopBulkReceiving {
            stream_id: 7,
            endpoint: 0x82,
        },
        Message::InterruptPacket(SmallDataPacket {
            endpoint: 0x01,
            status: status(0),
            length: 3,
            data: vec![1, 2, 3],
        }),
        Message::IsoPacket(SmallDataPacket {
            endpoint: 0x02,
            status: status(0),
            length: 2,
            data: vec![9, 8],
        }),
    ];
    for (i, m) in msgs.into_iter().enumerate() {
        round_trip(&mut g, &mut h, &Packet::new(0x1_0000_0000 + i as u64, m));
    }
}

#[test]
fn every_message_from_the_device_round_trips() {
    let (mut h, mut g) = (host_after_hello(), guest_after_hello());
    let msgs = vec![
        Message::DeviceDisconnect,
        Message::ConfigurationStatus {
            status: status(0),
            configuration: 1,
        },
        Message::AltSettingStatus {
            status: status(2),
            interface: 1,
            alt: 255,
        },
        Message::IsoStreamStatus {
            status: status(2),
            endpoint: 0x81,
        },
        Message::InterruptReceivingStatus {
            status: status(0),
            endpoint: 0x81,
        },
        Message::BulkStreamsStatus {
            endpoints: 6,
            no_streams: 0,
            status: status(2),
        },
        Message::BulkReceivingStatus {
            stream_id: 7,
            endpoint: 0x82,
            status: status(2),
        },
        Message::InterruptPacket(SmallDataPacket {
            endpoint: 0x81,
            status: status(0),
            length: 8,
            data: vec![0xa1, 0, 1, 0, 0, 0, 0, 0],
        }),
        Message::IsoPacket(SmallDataPacket {
            endpoint: 0x83,
            status: status(0),
            length: 1,
            data: vec![7],
        }),
        Message::BufferedBulkPacket(BufferedBulkPacket {
            stream_id: 0,
            length: 4,
            endpoint: 0x82,
            status: status(0),
            data: vec![4, 3, 2, 1],
        }),
        Message::FilterFilter {
            rules: b"-1,-1,-1,-1,1".to_vec(),
        },
    ];
    for (i, m) in msgs.into_iter().enumerate() {
        round_trip(&mut h, &mut g, &Packet::new(0x2_0000_0000 + i as u64, m));
    }
}

#[test]
fn a_fresh_codec_reports_its_caps_and_is_not_poisoned() {
    let c = Codec::new(Role::Host, Caps(0x72));
    assert_eq!(c.our_caps(), Caps(0x72));
    assert!(!c.is_poisoned());
    assert_eq!(c.role(), Role::Host);
    assert_eq!(
        c.common_caps(),
        Caps(0),
        "nothing in common before the hello"
    );
}

#[test]
fn the_input_buffer_is_reclaimed_while_packets_stream_through() {
    let (mut g, mut h) = (guest_after_hello(), host_after_hello());
    let mut stream = Vec::new();
    for i in 0..2000u64 {
        let p = Packet::new(
            i,
            Message::BulkPacket(BulkPacket {
                endpoint: 0x03,
                status: status(0),
                length: 1000,
                stream_id: 0,
                data: vec![i as u8; 1000],
            }),
        );
        g.encode(&p, &mut stream).unwrap();
    }
    // Chunks that never end on a packet boundary, so the buffer is never
    // empty when input arrives; decoded bytes must still be let go of.
    let mut n = 0;
    for chunk in stream.chunks(4099) {
        h.feed(chunk);
        while let Some(p) = h.next_packet() {
            p.unwrap();
            n += 1;
        }
        assert!(h.held() < 256 * 1024, "holds {} bytes", h.held());
    }
    assert_eq!(n, 2000);
}
