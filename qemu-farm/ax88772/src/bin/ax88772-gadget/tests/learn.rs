//! Tests of learning the model's identity: its announcement, its strings,
//! and the ways that fails.

use super::*;

fn string_descriptor(s: &str) -> Vec<u8> {
    let mut d = vec![0, 3];
    for u in s.encode_utf16() {
        d.extend(u.to_le_bytes());
    }
    d[0] = d.len() as u8;
    d
}

/// The gadget's side before `learn`: hello sent, as `run` does.
fn gadget_side(a: UnixStream) -> (Conn, Link) {
    let mut s = port(a);
    let link = Link {
        codec: Mutex::new(Codec::new(Role::Guest, gadget_caps())),
        out: Mutex::new(s.try_clone().unwrap()),
        next_id: AtomicU64::new(1),
    };
    let mut hello = Vec::new();
    link.codec
        .lock()
        .unwrap()
        .encode_hello("ax88772-gadget", &mut hello)
        .unwrap();
    s.write_all(&hello).unwrap();
    (s, link)
}

#[test]
fn learn_gathers_the_models_identity_and_strings() {
    let (a, b) = UnixStream::pair().unwrap();
    let (connect, iface, eps) = sample_identity();
    let (i2, e2) = (iface.clone(), eps.clone());
    let model = std::thread::spawn(move || {
        let mut m = Model::new(b);
        assert!(matches!(m.next().msg, Message::Hello(_)));
        m.hello();
        m.send(
            0,
            Message::ConfigurationStatus {
                status: Status::SUCCESS,
                configuration: 0,
            },
        );
        m.send(0, Message::EpInfo(Box::new(e2)));
        m.send(0, Message::InterfaceInfo(Box::new(i2)));
        m.send(0, Message::DeviceConnect(connect));
        let mut asked = Vec::new();
        for _ in 0..3 {
            let p = m.next();
            let Message::ControlPacket(c) = p.msg else {
                panic!("expected a control packet, got {:?}", p.msg);
            };
            asked.push((c.endpoint, c.request, c.requesttype, c.value, c.index));
            assert_eq!((c.length, c.data.len()), (255, 0));
            // An answer to another request first.
            let decoy = string_descriptor("decoy");
            m.send(
                p.id + 1000,
                Message::ControlPacket(ControlPacket {
                    length: decoy.len() as u16,
                    data: decoy,
                    ..c.clone()
                }),
            );
            let text = match c.value {
                0x0301 => Some("ASIX Elec. Corp.\n"),
                0x0302 => Some("AX88772A"),
                _ => None,
            };
            let reply = match text {
                Some(t) => {
                    let d = string_descriptor(t);
                    ControlPacket {
                        length: d.len() as u16,
                        data: d,
                        ..c
                    }
                }
                None => ControlPacket {
                    status: Status::STALL,
                    length: 0,
                    ..c
                },
            };
            m.send(p.id, Message::ControlPacket(reply));
        }
        asked
    });
    let (mut s, link) = gadget_side(a);
    let id = learn(&mut s, &link).unwrap();
    assert_eq!(id.connect, connect);
    assert_eq!(id.iface, iface);
    assert_eq!(id.eps, eps);
    assert_eq!(
        id.strings,
        [
            "ASIX Elec. Corp.".to_string(),
            "AX88772A".into(),
            String::new()
        ]
    );
    let asked = model.join().unwrap();
    assert_eq!(
        asked,
        [
            (0x80, 6, 0x80, 0x0301, 0x0409),
            (0x80, 6, 0x80, 0x0302, 0x0409),
            (0x80, 6, 0x80, 0x0303, 0x0409),
        ]
    );
}

#[test]
fn learn_fails_when_the_model_hangs_up_early() {
    let (a, b) = UnixStream::pair().unwrap();
    let model = std::thread::spawn(move || {
        let mut m = Model::new(b);
        m.next();
        m.hello();
        m.send(0, Message::DeviceConnect(sample_identity().0));
    });
    let (mut s, link) = gadget_side(a);
    let e = learn(&mut s, &link).err().unwrap();
    assert!(
        e.to_string()
            .contains("closed the connection before announcing"),
        "{e}"
    );
    model.join().unwrap();
}

#[test]
fn learn_fails_on_a_bad_packet() {
    let (a, mut b) = UnixStream::pair().unwrap();
    // A device_connect header before any hello.
    b.write_all(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let (mut s, link) = gadget_side(a);
    let e = learn(&mut s, &link).err().unwrap();
    assert!(e.to_string().contains("bad packet"), "{e}");
}

#[test]
fn read_until_gives_up_at_its_deadline() {
    let (link, mut s, m) = link_pair();
    let e = in_thread(move || {
        let _m = m;
        let deadline = Instant::now() + Duration::from_millis(20);
        read_until(&mut s, &link, deadline, |_| false).map_err(|e| e.to_string())
    })
    .unwrap_err();
    assert!(e.to_string().contains("in time"), "{e}");
}

#[test]
fn learn_reads_the_ax88772_models_identity() {
    use ax88772::descriptors::{Variant, VENDOR_ASIX};
    use ax88772::device::{Device, DeviceConfig};
    use ax88772::server::{OnDisconnect, Server, UsbRole};

    let (a, b) = UnixStream::pair().unwrap();
    let (wire, handle) = ax88772::wire::mock::pair();
    let cfg = DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0xaa, 0xbb, 0xcc]);
    let mut server = Server::new(
        Device::new(cfg, Instant::now()),
        Box::new(wire),
        UsbRole::Connected,
        OnDisconnect::Exit,
        None,
    )
    .unwrap();
    server.attach(ax88772::net::Conn::Unix(b));
    let model = std::thread::spawn(move || server.run().map_err(|e| e.to_string()));
    let (mut s, link) = gadget_side(a);
    let id = learn(&mut s, &link).unwrap();
    assert_eq!(id.connect.vendor_id, VENDOR_ASIX);
    assert_eq!(id.iface.interface_count, 1);
    let eps = gadget::endpoints(&id.eps).unwrap();
    assert_eq!(
        eps.iter().map(|e| e.address).collect::<Vec<_>>(),
        [0x81, 0x82, 0x03]
    );
    assert!(gadget::descriptors(&id.iface, &eps).is_ok());
    assert!(!id.strings[0].is_empty() && !id.strings[1].is_empty());
    drop((s, link));
    in_thread(move || model.join().unwrap()).unwrap();
    drop(handle);
}
