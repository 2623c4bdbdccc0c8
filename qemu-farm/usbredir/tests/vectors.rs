//! Byte-exact vectors (generated with libusbredirparser 0.13.0; QEMU-side
//! caps 0xff, device-side caps 0x72).

mod common;
use common::*;
use usbredir::*;

fn decode_one(c: &mut Codec, bytes: &[u8]) -> Packet {
    c.feed(bytes);
    let p = c.next_packet().expect("a packet").expect("valid");
    assert_eq!(c.buffered(), 0);
    p
}

fn encode_one(c: &mut Codec, p: &Packet) -> Vec<u8> {
    let mut out = Vec::new();
    c.encode(p, &mut out).unwrap();
    out
}

#[test]
fn our_hello() {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut out = Vec::new();
    c.encode_hello("fakedev", &mut out).unwrap();
    assert_eq!(out, hello_bytes("fakedev", 0x72));
    assert_eq!(out.len(), 12 + 68);
}

#[test]
fn peer_hello_switches_to_64bit_header() {
    let c = host_after_hello();
    assert_eq!(c.header_len(), 16);
    assert_eq!(c.common_caps(), Caps(0x72));
    assert_eq!(
        c.peer_hello().unwrap().version,
        "qemu usb-redir guest 7.2.22"
    );
}

#[test]
fn device_connect() {
    let mut c = host_after_hello();
    let p = Packet::new(
        0,
        Message::DeviceConnect(DeviceConnect {
            speed: proto::speed::HIGH,
            device_class: 0xff,
            device_subclass: 0xff,
            device_protocol: 0,
            vendor_id: 0x0b95,
            product_id: 0x772a,
            device_version_bcd: 0x0001,
        }),
    );
    let want = hex("01 00 00 00  0a 00 00 00  00*8 | 02 ff ff 00 95 0b 2a 77 01 00");
    assert_eq!(encode_one(&mut c, &p), want);
    assert_eq!(decode_one(&mut guest_after_hello(), &want), p);
}

#[test]
fn interface_info() {
    let mut c = host_after_hello();
    let mut i = InterfaceInfo {
        interface_count: 1,
        ..Default::default()
    };
    i.interface_class[0] = 0xff;
    i.interface_subclass[0] = 0xff;
    let p = Packet::new(0, Message::InterfaceInfo(Box::new(i)));
    let want =
        hex("04 00 00 00  84 00 00 00  00*8 | 01 00 00 00 | 00*32 | ff 00*31 | ff 00*31 | 00*32");
    assert_eq!(encode_one(&mut c, &p), want);
    assert_eq!(decode_one(&mut guest_after_hello(), &want), p);
}

#[test]
fn ep_info() {
    let mut c = host_after_hello();
    let mut e = EpInfo::default();
    e.ep_type[ep_index(0x00)] = 0;
    e.ep_type[ep_index(0x80)] = 0;
    e.ep_type[ep_index(0x03)] = 2;
    e.ep_type[ep_index(0x81)] = 3;
    e.ep_type[ep_index(0x82)] = 2;
    e.interval[ep_index(0x81)] = 11;
    e.max_packet_size[0] = 64;
    e.max_packet_size[3] = 512;
    e.max_packet_size[16] = 64;
    e.max_packet_size[17] = 8;
    e.max_packet_size[18] = 512;
    let p = Packet::new(0, Message::EpInfo(Box::new(e)));
    let mut want = hex("05 00 00 00  a0 00 00 00  00*8");
    want.extend(hex("00 ff ff 02 ff*12 00 03 02 ff*13"));
    want.extend(hex("00*17 0b 00*14"));
    want.extend(hex("00*32"));
    let mut mps = [0u8; 64];
    mps[0] = 0x40;
    mps[6..8].copy_from_slice(&[0x00, 0x02]);
    mps[32] = 0x40;
    mps[34] = 0x08;
    mps[36..38].copy_from_slice(&[0x00, 0x02]);
    want.extend(mps);
    assert_eq!(want.len(), 16 + 160);
    assert_eq!(encode_one(&mut c, &p), want);
    assert_eq!(decode_one(&mut guest_after_hello(), &want), p);
}

#[test]
fn reset_from_qemu() {
    let p = decode_one(
        &mut host_after_hello(),
        &hex("03 00 00 00  00 00 00 00  00*8"),
    );
    assert_eq!(p, Packet::new(0, Message::Reset));
}

#[test]
fn get_descriptor_and_reply() {
    let mut c = host_after_hello();
    let req =
        hex("64 00 00 00  0a 00 00 00  55 44 33 22 11 00 00 00 | 80 06 80 00 00 01 00 00 40 00");
    let p = decode_one(&mut c, &req);
    assert_eq!(p.id, 0x11_2233_4455);
    let Message::ControlPacket(cp) = &p.msg else {
        panic!("not a control packet")
    };
    assert_eq!(
        (cp.request, cp.requesttype, cp.value, cp.length),
        (6, 0x80, 0x0100, 64)
    );
    assert!(cp.data.is_empty());
    let desc = hex("12 01 00 02 ff ff 00 40 95 0b 2a 77 01 00 01 02 03 01");
    let reply = Packet::new(
        p.id,
        Message::ControlPacket(ControlPacket {
            length: 18,
            data: desc.clone(),
            ..cp.clone()
        }),
    );
    let mut want =
        hex("64 00 00 00  1c 00 00 00  55 44 33 22 11 00 00 00 | 80 06 80 00 00 01 00 00 12 00");
    want.extend(&desc);
    assert_eq!(encode_one(&mut c, &reply), want);
    assert_eq!(decode_one(&mut guest_after_hello(), &want), reply);
}

#[test]
fn vendor_write_and_identical_reply() {
    let mut c = host_after_hello();
    let req =
        hex("64 00 00 00  0a 00 00 00  2a 00 00 00 00 00 00 00 | 00 10 40 00 88 00 00 00 00 00");
    let p = decode_one(&mut c, &req);
    assert_eq!(p.id, 0x2a);
    assert_eq!(encode_one(&mut c, &p), req);
}

#[test]
fn bulk_in_request_and_reply() {
    let mut c = host_after_hello();
    let req =
        hex("65 00 00 00  0a 00 00 00  07 00 00 00 00 00 00 00 | 82 00 00 08 00 00 00 00 00 00");
    let p = decode_one(&mut c, &req);
    let Message::BulkPacket(bp) = &p.msg else {
        panic!("not bulk")
    };
    assert_eq!((bp.endpoint, bp.length), (0x82, 2048));
    let data = hex("3c 00 c3 ff 00 00 00 00");
    let reply = Packet::new(
        7,
        Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: 8,
            data,
            ..Default::default()
        }),
    );
    let want = hex(
        "65 00 00 00  12 00 00 00  07 00 00 00 00 00 00 00 | 82 00 08 00 00 00 00 00 00 00 | 3c 00 c3 ff 00 00 00 00",
    );
    assert_eq!(encode_one(&mut c, &reply), want);
}

#[test]
fn bulk_out() {
    let mut c = host_after_hello();
    let bytes = hex(
        "65 00 00 00  12 00 00 00  09 00 00 00 00 00 00 00 | 03 00 08 00 00 00 00 00 00 00 | 3c 00 c3 ff 01 02 03 04",
    );
    let p = decode_one(&mut c, &bytes);
    let Message::BulkPacket(bp) = &p.msg else {
        panic!("not bulk")
    };
    assert_eq!((p.id, bp.endpoint, bp.length), (9, 3, 8));
    assert_eq!(bp.data, hex("3c 00 c3 ff 01 02 03 04"));
    let mut g = guest_after_hello();
    assert_eq!(encode_one(&mut g, &p), bytes);
}

#[test]
fn cancel() {
    let p = decode_one(
        &mut host_after_hello(),
        &hex("15 00 00 00  00 00 00 00  08 00 00 00 00 00 00 00"),
    );
    assert_eq!(p, Packet::new(8, Message::CancelDataPacket));
}
