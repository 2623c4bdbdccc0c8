#![allow(dead_code)]

use usbredir::{Caps, Codec, Hello, Message, Packet, Role};

/// Build a wire hello by hand (12-byte header, 64-byte version, caps word).
pub fn hello_bytes(version: &str, caps: u32) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0, 0x44, 0, 0, 0, 0, 0, 0, 0];
    let mut field = [0u8; 64];
    field[..version.len()].copy_from_slice(version.as_bytes());
    v.extend_from_slice(&field);
    v.extend_from_slice(&caps.to_le_bytes());
    v
}

/// A device-side codec (caps 0x72) that has sent its hello and received
/// QEMU's (caps 0xff).
pub fn host_after_hello() -> Codec {
    let mut c = Codec::new(Role::Host, Caps(0x72));
    let mut out = Vec::new();
    c.encode_hello("fakedev", &mut out).unwrap();
    c.feed(&hello_bytes("qemu usb-redir guest 7.2.22", 0xff));
    let p = c.next_packet().unwrap().unwrap();
    assert!(matches!(
        p.msg,
        Message::Hello(Hello {
            caps: Caps(0xff),
            ..
        })
    ));
    c
}

/// A QEMU-side codec (caps 0xff) that has exchanged hellos with a 0x72 host.
pub fn guest_after_hello() -> Codec {
    let mut c = Codec::new(Role::Guest, Caps(0xff));
    let mut out = Vec::new();
    c.encode(
        &Packet::new(
            0,
            Message::Hello(Hello {
                version: "qemu".into(),
                caps: Caps(0xff),
                extra_caps: vec![],
            }),
        ),
        &mut out,
    )
    .unwrap();
    c.feed(&hello_bytes("fakedev", 0x72));
    c.next_packet().unwrap().unwrap();
    c
}

/// Parse "00 11 22 | 33 ..." (bars and `xx*N` repeats allowed).
pub fn hex(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for tok in s.split_whitespace().filter(|t| *t != "|") {
        if let Some((b, n)) = tok.split_once('*') {
            let b = u8::from_str_radix(b, 16).unwrap();
            v.extend(std::iter::repeat(b).take(n.parse().unwrap()));
        } else {
            v.push(u8::from_str_radix(tok, 16).unwrap());
        }
    }
    v
}
