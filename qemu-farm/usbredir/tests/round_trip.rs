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
        Message::ControlPacket(ControlPacket {
            endpoint: 0,
            request: 0x10,
            requesttype: 0x40,
            status: status(0),
            value: 0x88,
            index: 0,
            length: 4,
            data: vec![1, 2, 3, 4],
        }),
        Message::ControlPacket(ControlPacket {
            endpoint: 0x80,
            request: 6,
            requesttype: 0x80,
            status: status(0),
            value: 0x100,
            index: 0,
            length: 18,
            data: vec![],
        }),
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

#[test]
fn every_type_code_has_its_protocol_name() {
    let names = [
        "hello",
        "device_connect",
        "device_disconnect",
        "reset",
        "interface_info",
        "ep_info",
        "set_configuration",
        "get_configuration",
        "configuration_status",
        "set_alt_setting",
        "get_alt_setting",
        "alt_setting_status",
        "start_iso_stream",
        "stop_iso_stream",
        "iso_stream_status",
        "start_interrupt_receiving",
        "stop_interrupt_receiving",
        "interrupt_receiving_status",
        "alloc_bulk_streams",
        "free_bulk_streams",
        "bulk_streams_status",
        "cancel_data_packet",
        "filter_reject",
        "filter_filter",
        "device_disconnect_ack",
        "start_bulk_receiving",
        "stop_bulk_receiving",
        "bulk_receiving_status",
    ];
    for (code, name) in names.iter().enumerate() {
        assert_eq!(type_name(code as u32), Some(*name), "type {code}");
    }
    let data = [
        "control_packet",
        "bulk_packet",
        "iso_packet",
        "interrupt_packet",
        "buffered_bulk_packet",
    ];
    for (i, name) in data.iter().enumerate() {
        assert_eq!(type_name(100 + i as u32), Some(*name));
    }
    assert_eq!(type_name(28), None);
    assert_eq!(type_name(99), None);
    assert_eq!(type_name(105), None);
}

#[test]
fn a_bulk_length_beyond_16_bits_round_trips_with_32bit_lengths() {
    // 0xff on both sides includes 32bits_bulk_length.
    let mut g = Codec::new(Role::Guest, Caps(0xff));
    let mut h = Codec::new(Role::Host, Caps(0xff));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    h.encode_hello("dev", &mut a).unwrap();
    g.encode(
        &Packet::new(
            0,
            Message::Hello(Hello {
                version: "qemu".into(),
                caps: Caps(0xff),
                extra_caps: vec![],
            }),
        ),
        &mut b,
    )
    .unwrap();
    g.feed(&a);
    g.next_packet().unwrap().unwrap();
    h.feed(&b);
    h.next_packet().unwrap().unwrap();
    let p = Packet::new(
        0x1_2345_6789,
        Message::BulkPacket(BulkPacket {
            endpoint: 0x03,
            status: status(0),
            length: 0x1_1170,
            stream_id: 0,
            data: vec![0x5a; 0x1_1170],
        }),
    );
    round_trip(&mut g, &mut h, &p);
    let ask = Packet::new(
        7,
        Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            status: status(0),
            length: 0x2_0000,
            stream_id: 0,
            data: vec![],
        }),
    );
    round_trip(&mut g, &mut h, &ask);
}

#[test]
fn only_an_oversized_packet_is_fatal() {
    assert!(Error::Oversized {
        type_code: 101,
        length: 1 << 30,
        max: 1 << 22
    }
    .is_fatal());
    assert!(!Error::UnknownType {
        type_code: 77,
        length: 0
    }
    .is_fatal());
    assert!(!Error::BadLength {
        name: "reset",
        length: 1,
        expected: 0
    }
    .is_fatal());
}

#[test]
fn the_default_bound_is_exactly_4_mib() {
    let hdr = |len: u32| {
        let mut v = 101u32.to_le_bytes().to_vec();
        v.extend(len.to_le_bytes());
        v.extend(9u64.to_le_bytes());
        v
    };
    let mut h = host_after_hello();
    h.feed(&hdr(4 * 1024 * 1024));
    assert!(
        h.next_packet().is_none(),
        "4 MiB is allowed: waits for the body"
    );
    assert!(!h.is_poisoned());
    let mut h = host_after_hello();
    h.feed(&hdr(4 * 1024 * 1024 + 1));
    assert!(matches!(
        h.next_packet(),
        Some(Err(Error::Oversized { max: 0x40_0000, .. }))
    ));
}

#[test]
fn endpoint_indexes_caps_status_and_roles() {
    assert_eq!(ep_index(0x00), 0);
    assert_eq!(ep_index(0x03), 3);
    assert_eq!(ep_index(0x81), 17);
    assert_eq!(ep_index(0x8f), 31);
    assert_eq!(ep_index(0x70), 0, "only the number and direction count");
    let c = Caps(0).with(3).with(35);
    assert_eq!(c, Caps(0b1000 | 0b1000));
    assert!(c.has(3) && !c.has(2) && !c.has(40));
    assert!(!Caps(u32::MAX).has(32), "bit 32 is past the word");
    assert!(Caps(u32::MAX).has(31));
    assert_eq!(Caps(0b0110).common(Caps(0b1100)), Caps(0b0100));
    assert_eq!(Caps::XHCI_HOST, Caps(0x72));
    assert!(Status::SUCCESS.is_success() && !Status::STALL.is_success());
    assert_eq!(Role::Host.peer(), Role::Guest);
    assert_eq!(Role::Guest.peer(), Role::Host);
}

#[test]
fn a_drained_buffer_starts_over_on_the_next_input() {
    let (mut g, mut h) = (guest_after_hello(), host_after_hello());
    let mut bytes = Vec::new();
    for i in 0..10 {
        g.encode(&Packet::new(i, Message::Reset), &mut bytes)
            .unwrap();
    }
    h.feed(&bytes);
    assert_eq!(h.held(), bytes.len());
    assert_eq!(h.buffered(), bytes.len());
    while let Some(p) = h.next_packet() {
        p.unwrap();
    }
    assert_eq!(h.buffered(), 0);
    // Everything was decoded: the next input does not sit behind it.
    h.feed(&bytes[..5]);
    assert_eq!((h.held(), h.buffered()), (5, 5));
}
