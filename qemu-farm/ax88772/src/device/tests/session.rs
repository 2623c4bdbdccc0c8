//! Tests of the session: hello and configuration, control requests and
//! their refusals, cancel and reset, unplug and replug, a new connection.

use super::*;

#[test]
fn hello_announces_the_device() {
    let mut t = T::new(true);
    let out = t.send(0, hello().msg);
    let names: Vec<_> = out.iter().map(|p| p.msg.name()).collect();
    assert_eq!(names, ["interface_info", "ep_info", "device_connect"]);
    let Message::DeviceConnect(dc) = &out[2].msg else {
        unreachable!()
    };
    assert_eq!((dc.vendor_id, dc.product_id, dc.speed), (0x0b95, 0x772a, 2));
    assert!(t.d.announced());
}

#[test]
fn set_configuration_sends_infos_first() {
    let mut t = T::new(true);
    t.send(0, hello().msg);
    let out = t.send(9, Message::SetConfiguration { configuration: 1 });
    let names: Vec<_> = out.iter().map(|p| p.msg.name()).collect();
    assert_eq!(names, ["interface_info", "ep_info", "configuration_status"]);
    assert_eq!(
        out[2],
        Packet::new(
            9,
            Message::ConfigurationStatus {
                status: Status::SUCCESS,
                configuration: 1
            }
        )
    );
    let out = t.send(10, Message::SetConfiguration { configuration: 7 });
    assert_eq!(
        out[0].msg,
        Message::ConfigurationStatus {
            status: Status::INVAL,
            configuration: 1
        }
    );
}

#[test]
fn descriptor_and_vendor_stall() {
    let mut t = T::up(true);
    let out = t.send(0x55, ctrl(0x80, 6, 0x0100, 0, 64, vec![]));
    let Message::ControlPacket(cp) = &out[0].msg else {
        panic!()
    };
    assert_eq!(
        (out[0].id, cp.status, cp.length, cp.data.len()),
        (0x55, Status::SUCCESS, 18, 18)
    );
    let out = t.send(0x56, ctrl(0xc0, 0x77, 1, 2, 4, vec![]));
    let Message::ControlPacket(cp) = &out[0].msg else {
        panic!()
    };
    assert_eq!((cp.status, cp.length, cp.data.len()), (Status::STALL, 0, 0));
    assert_eq!(t.d.counters().control_stalls, 1);
}

#[test]
fn cancel_answers_cancelled_and_ignores_unknown_ids() {
    let mut t = T::up(false);
    t.send(21, bulk_in(2048));
    t.send(22, bulk_in(2048));
    let out = t.send(22, Message::CancelDataPacket);
    assert_eq!(out[0].id, 22);
    assert_eq!(bulk_reply(&out[0]).status, Status::CANCELLED);
    assert!(t.send(99, Message::CancelDataPacket).is_empty());
    assert_eq!(t.d.pending_bulk_in(), 1);
}

#[test]
fn reset_cancels_pending_and_unconfigures() {
    let mut t = T::up(false);
    t.send(31, bulk_in(2048));
    let out = t.send(0, Message::Reset);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (31, Status::CANCELLED)
    );
    let out = t.send(32, bulk_in(2048));
    assert_eq!(bulk_reply(&out[0]).status, Status::STALL);
}

#[test]
fn out_of_order_requests_are_refused() {
    let mut t = T::new(false);
    t.send(0, hello().msg);
    // Bulk and alt setting before SET_CONFIGURATION.
    let out = t.send(1, bulk_out(vec![1, 2, 3, 4]));
    assert_eq!(bulk_reply(&out[0]).status, Status::STALL);
    let out = t.send(
        2,
        Message::SetAltSetting {
            interface: 0,
            alt: 0,
        },
    );
    assert_eq!(
        out[0].msg,
        Message::AltSettingStatus {
            status: Status::INVAL,
            interface: 0,
            alt: 255
        }
    );
    let out = t.send(3, Message::StartInterruptReceiving { endpoint: 0x81 });
    assert_eq!(
        out[0].msg,
        Message::InterruptReceivingStatus {
            status: Status::INVAL,
            endpoint: 0x81
        }
    );
    // Unused protocol features are refused cleanly.
    let out = t.send(
        4,
        Message::AllocBulkStreams {
            endpoints: 4,
            no_streams: 2,
        },
    );
    assert_eq!(
        out[0].msg,
        Message::BulkStreamsStatus {
            endpoints: 4,
            no_streams: 0,
            status: Status::INVAL
        }
    );
    assert_eq!(t.d.counters().tx_frames, 0);
}

#[test]
fn unplug_waits_for_ack_before_replug() {
    let mut t = T::up(false);
    t.d.unplug(t.t);
    assert_eq!(t.d.take_usb()[0].msg, Message::DeviceDisconnect);
    t.d.plug(t.t);
    assert!(t.d.take_usb().is_empty(), "waits for device_disconnect_ack");
    let out = t.send(0, Message::DeviceDisconnectAck);
    assert_eq!(out.last().map(|p| p.msg.name()), Some("device_connect"));
}

#[test]
fn interrupt_ids_restart_on_a_new_connection() {
    let mut t = T::up(false);
    t.send(
        5,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    t.d.phy_mut().set_carrier(false);
    t.d.poll(t.t);
    assert!(
        t.d.take_usb().iter().any(|p| p.id == 1),
        "second interrupt packet"
    );
    t.d.transport_opened(t.t);
    let mut t2 = T { d: t.d, t: t.t };
    t2.send(0, hello().msg);
    t2.send(1, Message::SetConfiguration { configuration: 1 });
    let out = t2.send(
        5,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    let ids: Vec<_> = out
        .iter()
        .filter(|p| p.msg.name() == "interrupt_packet")
        .map(|p| p.id)
        .collect();
    assert_eq!(ids, [0]);
}

#[test]
fn replug_disconnects_then_connects_after_the_down_time() {
    let mut t = T::up(false);
    let r = ctl(&mut t, r#"{"cmd":"usb","action":"replug","down_ms":300}"#);
    assert_eq!(r["replug_in_ms"], 300);
    let out = t.d.take_usb();
    assert_eq!(out[0].msg, Message::DeviceDisconnect);
    t.send(0, Message::DeviceDisconnectAck);
    assert_eq!(t.d.poll(t.t), Some(t.t + Duration::from_millis(300)));
    t.d.poll(t.t + Duration::from_millis(299));
    assert!(t.d.take_usb().is_empty(), "still unplugged");
    t.d.poll(t.t + Duration::from_millis(300));
    let names: Vec<_> = t.d.take_usb().iter().map(|p| p.msg.name()).collect();
    assert_eq!(names.last(), Some(&"device_connect"));
    assert_eq!(t.d.mac().rx_ctl, 0, "a freshly plugged chip");
    assert_eq!(
        ctl(&mut t, r#"{"cmd":"usb","action":"plug","down_ms":3}"#)["ok"],
        false
    );
    // Ten minutes down at most: beyond it the request is refused.
    let r = ctl(
        &mut t,
        r#"{"cmd":"usb","action":"replug","down_ms":600001}"#,
    );
    assert_eq!(r["ok"], false, "{r}");
    let r = ctl(
        &mut t,
        r#"{"cmd":"usb","action":"replug","down_ms":600000}"#,
    );
    assert_eq!(r["ok"], true, "{r}");
}

#[test]
fn session_state_accessors() {
    let mut t = T::new(false);
    assert!(!t.d.announced(), "nothing announced before QEMU's hello");
    t.send(0, hello().msg);
    assert!(t.d.announced());
    t.send(1, Message::SetConfiguration { configuration: 1 });
    assert_eq!(t.d.pending_bulk_in(), 0);
    t.send(2, bulk_in(2048));
    t.send(3, bulk_in(2048));
    assert_eq!(t.d.pending_bulk_in(), 2);
    t.d.unplug(t.t);
    assert!(!t.d.announced());
}

#[test]
fn a_closed_transport_forgets_the_session() {
    let mut t = T::up(false);
    t.send(10, bulk_in(2048));
    t.send(
        11,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    t.d.take_usb();
    t.d.transport_closed(t.t);
    assert!(!t.d.announced());
    assert_eq!(t.d.pending_bulk_in(), 0);
    assert!(t.d.take_usb().is_empty(), "nobody to answer");
    assert_eq!(t.d.mac().rx_ctl, 0, "the chip is powered anew");
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.counters().rx_dropped_gated, 1);
}

fn control_reply(out: &[Packet]) -> &ControlPacket {
    match &out[0].msg {
        Message::ControlPacket(c) => c,
        m => panic!("expected control_packet, got {}", m.name()),
    }
}

#[test]
fn session_refusals_answer_as_the_protocol_says() {
    let mut t = T::up(false);
    let alt = |t: &mut T, interface, alt| match t
        .send(1, Message::SetAltSetting { interface, alt })
        .pop()
    {
        Some(Packet {
            msg: Message::AltSettingStatus { status, alt, .. },
            ..
        }) => (status, alt),
        p => panic!("{p:?}"),
    };
    assert_eq!(alt(&mut t, 0, 0), (Status::SUCCESS, 0));
    assert_eq!(alt(&mut t, 1, 0), (Status::INVAL, 255));
    assert_eq!(alt(&mut t, 0, 1), (Status::INVAL, 255));
    let get = |t: &mut T, interface| match &t.send(2, Message::GetAltSetting { interface })[0].msg {
        Message::AltSettingStatus { status, alt, .. } => (*status, *alt),
        m => panic!("{m:?}"),
    };
    assert_eq!(get(&mut t, 0), (Status::SUCCESS, 0));
    assert_eq!(get(&mut t, 1), (Status::INVAL, 255));
    let stop =
        |t: &mut T, endpoint| match &t.send(3, Message::StopInterruptReceiving { endpoint })[0].msg
        {
            Message::InterruptReceivingStatus { status, .. } => *status,
            m => panic!("{m:?}"),
        };
    assert_eq!(stop(&mut t, 0x82), Status::INVAL);
    assert_eq!(stop(&mut t, EP_INTERRUPT), Status::SUCCESS);
    let out = t.send(
        4,
        Message::InterruptPacket(SmallDataPacket {
            endpoint: 0x01,
            status: Status::SUCCESS,
            length: 2,
            data: vec![1, 2],
        }),
    );
    assert_eq!(
        out[0].msg,
        Message::InterruptPacket(SmallDataPacket {
            endpoint: 0x01,
            status: Status::STALL,
            length: 0,
            data: vec![],
        })
    );
    let out = t.send(
        5,
        Message::IsoPacket(SmallDataPacket {
            endpoint: 0x83,
            ..Default::default()
        }),
    );
    assert_eq!(
        out[0].msg,
        Message::IsoPacket(SmallDataPacket {
            endpoint: 0x83,
            status: Status::INVAL,
            length: 0,
            data: vec![],
        })
    );
}

#[test]
fn control_replies_carry_no_out_data_and_counters_add_up() {
    let mut t = T::up(false);
    let before = t.d.counters().control_requests;
    // An OUT request: the reply says how much was taken, without the data.
    let out = t.send(
        1,
        ctrl(0x40, cmd::WRITE_NODE_ID, 0, 0, 6, vec![2, 1, 2, 3, 4, 5]),
    );
    let c = control_reply(&out);
    assert_eq!((c.status, c.length, c.data.len()), (Status::SUCCESS, 6, 0));
    // A STALL carries neither data nor a length.
    let out = t.send(2, ctrl(0xc0, 0xee, 0, 0, 4, vec![]));
    let c = control_reply(&out);
    assert_eq!((c.status, c.length, c.data.len()), (Status::STALL, 0, 0));
    ctl(&mut t, r#"{"cmd":"mdio_fault","op":"read","count":2}"#);
    for id in [3, 4] {
        let out = t.send(id, ctrl(0xc0, cmd::READ_MII_REG, 0x10, 1, 2, vec![]));
        let c = control_reply(&out);
        assert_eq!((c.status, c.length, c.data.len()), (Status::STALL, 0, 0));
        assert_eq!((c.request, c.value, c.index), (cmd::READ_MII_REG, 0x10, 1));
    }
    let c = t.d.counters().clone();
    assert_eq!(c.control_requests - before, 4);
    assert_eq!(c.control_stalls, 3);
    assert_eq!(c.mdio_faults_injected, 2);
    t.send(5, bulk_in(2048));
    t.send(6, bulk_in(2048));
    t.send(5, Message::CancelDataPacket);
    t.send(6, Message::CancelDataPacket);
    t.send(0, Message::Reset);
    t.send(0, Message::Reset);
    let c = t.d.counters().clone();
    assert_eq!((c.bulk_cancelled, c.usb_resets), (2, 2));
    t.d.usbredir_error();
    t.d.usbredir_error();
    assert_eq!(t.d.counters().usbredir_errors, 2);
}

#[test]
fn sw_reset_flushes_the_queues_it_names() {
    let mut t = T::up(true);
    t.d.set_pace_burst(Duration::ZERO);
    t.d.wire_frame(t.t, frame(MAC, 1514));
    t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 1514))));
    t.send(2, bulk_out(framing::tx_transfer(&frame(MAC, 1514))));
    assert_eq!(t.d.tx_queued(), 2);
    // IPRL keeps the PHY running; RR and RT flush RX and TX.
    t.send(
        3,
        ctrl(0x40, cmd::SW_RESET, 0x20 | 0x01 | 0x02, 0, 0, vec![]),
    );
    assert_eq!(t.d.tx_queued(), 0);
    t.send(4, bulk_in(2048));
    t.d.poll(t.t + Duration::from_millis(5));
    let out = t.d.take_usb();
    assert!(out.iter().all(|p| p.id != 4), "the RX frame was flushed");
    assert!(t.d.take_wire().is_empty(), "the TX frames were flushed");
}

#[test]
fn unplug_without_the_ack_capability_replugs_at_once() {
    let mut t = T::new(false);
    let h = Hello {
        version: "old qemu".into(),
        caps: Caps(0xff & !(1 << cap::DEVICE_DISCONNECT_ACK)),
        extra_caps: vec![],
    };
    t.send(0, Message::Hello(h));
    assert!(t.d.plugged());
    t.d.unplug(t.t);
    assert!(!t.d.plugged());
    assert_eq!(t.d.take_usb()[0].msg, Message::DeviceDisconnect);
    t.d.plug(t.t);
    assert!(t.d.plugged());
    let names: Vec<_> = t.d.take_usb().iter().map(|p| p.msg.name()).collect();
    assert_eq!(names.last(), Some(&"device_connect"), "no ack to wait for");
}

#[test]
fn faulted_and_answered_control_requests_reply_cleanly() {
    let mut t = T::up(false);
    ctl(&mut t, r#"{"cmd":"mdio_fault","op":"write","count":1}"#);
    let out = t.send(
        1,
        ctrl(0x40, cmd::WRITE_MII_REG, 0x10, 4, 2, vec![0xe1, 0x01]),
    );
    let c = control_reply(&out);
    assert_eq!((c.status, c.length, c.data.len()), (Status::STALL, 0, 0));
    // A request arriving with a stale status field is answered SUCCESS.
    let m = Message::ControlPacket(ControlPacket {
        endpoint: 0x80,
        requesttype: 0x80,
        request: 0,
        status: Status::STALL,
        length: 2,
        ..Default::default()
    });
    let out = t.send(2, m);
    assert_eq!(control_reply(&out).status, Status::SUCCESS);
}
