//! Every malformed input comes back as an error value, and the stream stays
//! usable afterwards (except for the fatal oversized case).

mod common;
use common::*;
use usbredir::*;

fn hdr(code: u32, length: u32, id: u64) -> Vec<u8> {
    let mut v = code.to_le_bytes().to_vec();
    v.extend(length.to_le_bytes());
    v.extend(id.to_le_bytes());
    v
}

fn reset() -> Vec<u8> {
    hdr(3, 0, 5)
}

/// After an error the next valid packet still decodes.
fn assert_resyncs(c: &mut Codec) {
    c.feed(&reset());
    assert_eq!(c.next_packet(), Some(Ok(Packet::new(5, Message::Reset))));
}

#[test]
fn unknown_type_is_skipped() {
    let mut c = host_after_hello();
    let mut b = hdr(77, 5, 1);
    b.extend([1, 2, 3, 4, 5]);
    c.feed(&b);
    assert_eq!(
        c.next_packet(),
        Some(Err(Error::UnknownType {
            type_code: 77,
            length: 5
        }))
    );
    assert_resyncs(&mut c);
}

#[test]
fn oversized_length_is_fatal() {
    let mut c = host_after_hello().with_max_packet_len(1024);
    c.feed(&hdr(101, 2000, 1));
    let e = c.next_packet().unwrap().unwrap_err();
    assert_eq!(
        e,
        Error::Oversized {
            type_code: 101,
            length: 2000,
            max: 1024
        }
    );
    assert!(e.is_fatal());
    assert!(c.is_poisoned());
    c.feed(&reset());
    assert_eq!(c.next_packet(), None);
}

#[test]
fn default_bound_refuses_4gib() {
    let mut c = host_after_hello();
    c.feed(&hdr(101, u32::MAX, 1));
    assert!(matches!(
        c.next_packet(),
        Some(Err(Error::Oversized { .. }))
    ));
}

#[test]
fn fixed_size_message_with_wrong_length() {
    let mut c = host_after_hello();
    let mut b = hdr(6, 2, 1); // set_configuration is 1 byte
    b.extend([1, 1]);
    c.feed(&b);
    let want = Error::BadLength {
        name: "set_configuration",
        length: 2,
        expected: 1,
    };
    assert_eq!(c.next_packet(), Some(Err(want)));
    assert_resyncs(&mut c);
}

#[test]
fn length_shorter_than_type_header() {
    let mut c = host_after_hello();
    let mut b = hdr(100, 4, 1);
    b.extend([0x80, 6, 0x80, 0]);
    c.feed(&b);
    let want = Error::ShortPacket {
        name: "control_packet",
        length: 4,
        expected: 10,
    };
    assert_eq!(c.next_packet(), Some(Err(want)));
    assert_resyncs(&mut c);
}

#[test]
fn in_request_with_data_is_refused() {
    let mut c = host_after_hello();
    let mut b = hdr(101, 12, 1);
    b.extend([0x82, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb]);
    c.feed(&b);
    let want = Error::DataLength {
        name: "bulk_packet",
        data_len: 2,
        expected: 0,
    };
    assert_eq!(c.next_packet(), Some(Err(want)));
    assert_resyncs(&mut c);
}

#[test]
fn out_data_shorter_than_length() {
    let mut c = host_after_hello();
    let mut b = hdr(100, 12, 1);
    b.extend([0, 0x14, 0x40, 0, 0, 0, 0, 0, 6, 0, 1, 2]);
    c.feed(&b);
    let want = Error::DataLength {
        name: "control_packet",
        data_len: 2,
        expected: 6,
    };
    assert_eq!(c.next_packet(), Some(Err(want)));
    assert_resyncs(&mut c);
}

#[test]
fn packet_before_hello() {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut b = 3u32.to_le_bytes().to_vec();
    b.extend([0; 8]); // 12-byte header: reset, length 0
    c.feed(&b);
    assert_eq!(
        c.next_packet(),
        Some(Err(Error::HelloExpected { name: "reset" }))
    );
    c.feed(&hello_bytes("q", 0xff));
    assert!(matches!(
        c.next_packet(),
        Some(Ok(Packet {
            msg: Message::Hello(_),
            ..
        }))
    ));
}

#[test]
fn duplicate_hello() {
    let mut c = host_after_hello();
    let mut b = hdr(0, 68, 0);
    b.extend([0; 68]);
    c.feed(&b);
    assert_eq!(c.next_packet(), Some(Err(Error::DuplicateHello)));
    assert_resyncs(&mut c);
}

#[test]
fn message_for_the_other_role() {
    let mut c = host_after_hello();
    let mut b = hdr(8, 2, 0); // configuration_status goes to the guest
    b.extend([0, 1]);
    c.feed(&b);
    let want = Error::WrongDirection {
        name: "configuration_status",
        receiver: "host",
    };
    assert_eq!(c.next_packet(), Some(Err(want)));
    assert_resyncs(&mut c);
}

#[test]
fn hello_with_partial_caps_word() {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut b = hello_bytes("q", 0xff);
    b[4] = 0x46; // length 70
    b.extend([0, 0]);
    c.feed(&b);
    assert_eq!(
        c.next_packet(),
        Some(Err(Error::DataLength {
            name: "hello",
            data_len: 6,
            expected: 4
        }))
    );
}

#[test]
fn filter_without_nul() {
    let mut c = host_after_hello();
    let mut b = hdr(23, 3, 0);
    b.extend(b"abc");
    c.feed(&b);
    assert_eq!(c.next_packet(), Some(Err(Error::FilterNotTerminated)));
    let mut b = hdr(23, 4, 0);
    b.extend(b"abc\0");
    c.feed(&b);
    let want = Packet::new(
        0,
        Message::FilterFilter {
            rules: b"abc".to_vec(),
        },
    );
    assert_eq!(c.next_packet(), Some(Ok(want)));
}

#[test]
fn encode_refusals() {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut out = Vec::new();
    let reset = Packet::new(0, Message::DeviceDisconnect);
    assert_eq!(
        c.encode(&reset, &mut out),
        Err(Error::HelloNotSent {
            name: "device_disconnect"
        })
    );
    c.encode_hello("x", &mut out).unwrap();
    assert_eq!(c.encode_hello("x", &mut out), Err(Error::DuplicateHello));
    out.clear();
    let want = Err(Error::PeerHelloPending {
        name: "device_disconnect",
    });
    assert_eq!(c.encode(&reset, &mut out), want);
    let long = "v".repeat(64);
    let mut d = Codec::new(Role::Host, Caps(0));
    assert_eq!(
        d.encode_hello(&long, &mut out),
        Err(Error::VersionTooLong(64))
    );
    assert!(out.is_empty());
    // A host never sends reset; an OUT reply carries no data.
    let mut c = host_after_hello();
    let want = Err(Error::WrongDirection {
        name: "reset",
        receiver: "guest",
    });
    assert_eq!(c.encode(&Packet::new(0, Message::Reset), &mut out), want);
    let bad = BulkPacket {
        endpoint: 3,
        length: 2,
        data: vec![1, 2],
        ..Default::default()
    };
    let r = c.encode(&Packet::new(1, Message::BulkPacket(bad)), &mut out);
    assert!(matches!(r, Err(Error::DataLength { .. })));
    assert!(out.is_empty());
}

#[test]
fn narrow_peer_limits_ids_and_bulk_length() {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut out = Vec::new();
    c.encode_hello("x", &mut out).unwrap();
    c.feed(&hello_bytes("old", 0x02));
    c.next_packet().unwrap().unwrap();
    assert_eq!(c.header_len(), 12);
    out.clear();
    let big_id = Packet::new(1 << 40, Message::DeviceDisconnect);
    assert_eq!(c.encode(&big_id, &mut out), Err(Error::IdTooWide(1 << 40)));
    let p = BulkPacket {
        endpoint: 0x03,
        length: 70000,
        ..Default::default()
    };
    let r = c.encode(&Packet::new(1, Message::BulkPacket(p)), &mut out);
    assert_eq!(r, Err(Error::BulkTooLong(70000)));
    // The largest id and bulk length a narrow header holds still go out.
    out.clear();
    let widest = Packet::new(u64::from(u32::MAX), Message::DeviceDisconnect);
    c.encode(&widest, &mut out).unwrap();
    assert_eq!(&out[8..12], &[0xff; 4]);
    let p = BulkPacket {
        endpoint: 0x82,
        length: 0xffff,
        data: vec![1; 0xffff],
        ..Default::default()
    };
    out.clear();
    c.encode(&Packet::new(2, Message::BulkPacket(p)), &mut out)
        .unwrap();
    assert_eq!(&out[14..16], &[0xff, 0xff]);
    out.clear();
    // ep_info without max packet sizes is 96 bytes.
    c.encode(&Packet::new(0, Message::EpInfo(Box::default())), &mut out)
        .unwrap();
    assert_eq!(out.len(), 12 + 96);
}
