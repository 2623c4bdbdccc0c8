//! Tests of the endpoints: halts and their clearing, the interrupt
//! endpoint, and refusals and completions named by endpoint.

use super::*;

#[test]
fn interrupt_endpoint_reports_link() {
    let mut t = T::up(false);
    let out = t.send(5, Message::StartInterruptReceiving { endpoint: 0x81 });
    assert_eq!(
        out[0].msg,
        Message::InterruptReceivingStatus {
            status: Status::SUCCESS,
            endpoint: 0x81
        }
    );
    let Message::InterruptPacket(p) = &out[1].msg else {
        panic!("no interrupt packet")
    };
    assert_eq!((out[1].id, p.data[2] & 1), (0, 1));
    t.d.phy_mut().set_carrier(false);
    t.d.poll(t.t);
    let out = t.d.take_usb();
    let Message::InterruptPacket(p) = &out[0].msg else {
        panic!("no interrupt packet")
    };
    assert_eq!((out[0].id, p.data.len(), p.data[2] & 1), (1, 8, 0));
}

#[test]
fn clear_feature_clears_an_endpoint_halt() {
    let mut t = T::up(false);
    let status = |t: &mut T| {
        let out = t.send(9, ctrl(0x82, 0, 0, 0x82, 2, vec![]));
        let Message::ControlPacket(c) = &out[0].msg else {
            panic!("control reply")
        };
        c.data[0]
    };
    assert_eq!(status(&mut t), 0);
    t.send(10, ctrl(0x02, 3, 0, 0x82, 0, vec![])); // SET_FEATURE(ENDPOINT_HALT)
    assert_eq!(status(&mut t), 1);
    t.send(11, ctrl(0x02, 1, 0, 0x82, 0, vec![])); // CLEAR_FEATURE
    assert_eq!(status(&mut t), 0);
}

const SET_FEATURE: u8 = 3;

const CLEAR_FEATURE: u8 = 1;

/// SET_FEATURE or CLEAR_FEATURE(ENDPOINT_HALT) on `ep`; the replies.
fn halt(t: &mut T, id: u64, ep: u8, set: bool) -> Vec<Packet> {
    let req = if set { SET_FEATURE } else { CLEAR_FEATURE };
    let out = t.send(id, ctrl(0x02, req, 0, u16::from(ep), 0, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!("control reply first")
    };
    assert_eq!(c.status, Status::SUCCESS);
    out[1..].to_vec()
}

fn halt_status(t: &mut T, ep: u8) -> u8 {
    let out = t.send(99, ctrl(0x82, 0, 0, u16::from(ep), 2, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!("control reply")
    };
    c.data[0]
}

#[test]
fn a_halted_bulk_in_endpoint_stalls_every_transfer_until_cleared() {
    let mut t = T::up(false);
    assert!(t.send(20, bulk_in(2048)).is_empty(), "waits for a frame");
    let out = halt(&mut t, 21, EP_BULK_IN, true);
    assert_eq!(out.len(), 1, "the waiting transfer ends");
    assert_eq!(
        (
            out[0].id,
            bulk_reply(&out[0]).status,
            bulk_reply(&out[0]).length
        ),
        (20, Status::STALL, 0)
    );
    assert_eq!(halt_status(&mut t, EP_BULK_IN), 1);
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.send(22, bulk_in(2048));
    assert_eq!((out[0].id, bulk_reply(&out[0]).status), (22, Status::STALL));
    assert!(bulk_reply(&out[0]).data.is_empty(), "no data while halted");
    // The other endpoints still work.
    let f = frame([0xff; 6], 60);
    let out = t.send(23, bulk_out(framing::tx_transfer(&f)));
    assert_eq!(bulk_reply(&out[0]).status, Status::SUCCESS);
    assert!(halt(&mut t, 24, EP_BULK_IN, false).is_empty());
    assert_eq!(halt_status(&mut t, EP_BULK_IN), 0);
    let out = t.send(25, bulk_in(2048));
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (25, Status::SUCCESS),
        "the frame that waited is delivered"
    );
    assert_eq!(t.d.counters().halted_stalls, 2);
}

#[test]
fn a_halted_bulk_out_endpoint_stalls_and_sends_nothing() {
    let mut t = T::up(false);
    halt(&mut t, 30, EP_BULK_OUT, true);
    let f = frame([0xff; 6], 60);
    let out = t.send(31, bulk_out(framing::tx_transfer(&f)));
    assert_eq!(
        (
            out[0].id,
            bulk_reply(&out[0]).status,
            bulk_reply(&out[0]).length
        ),
        (31, Status::STALL, 0)
    );
    assert!(t.d.take_wire().is_empty());
    assert_eq!(t.d.counters().tx_frames, 0);
    halt(&mut t, 32, EP_BULK_OUT, false);
    let out = t.send(33, bulk_out(framing::tx_transfer(&f)));
    assert_eq!(bulk_reply(&out[0]).status, Status::SUCCESS);
    assert_eq!(t.d.take_wire(), vec![f]);
}

#[test]
fn halting_bulk_out_stalls_the_transfers_still_waiting_for_room() {
    let mut t = T::up(true);
    let one = framing::tx_transfer(&frame(MAC, 1514));
    let big = repeated(&one, 1000);
    t.send(7, bulk_out(big.clone()));
    assert!(t.send(8, bulk_out(one.clone())).is_empty(), "8 waits");
    assert!(t.send(10, bulk_out(one.clone())).is_empty(), "10 waits");
    t.d.handle(t.t, Packet::new(10, Message::CancelDataPacket));
    assert_eq!(bulk_reply(&t.d.take_usb()[0]).status, Status::CANCELLED);
    assert_eq!(t.d.held_out_bytes(), big.len() + one.len());
    let out = halt(&mut t, 9, EP_BULK_OUT, true);
    assert_eq!(out.len(), 1, "{out:?}");
    let r = bulk_reply(&out[0]);
    assert_eq!(
        (out[0].id, r.endpoint, r.status),
        (8, EP_BULK_OUT, Status::STALL)
    );
    assert_eq!(t.d.held_out_bytes(), big.len(), "7 was taken in already");
}

#[test]
fn halting_a_bulk_endpoint_sends_no_interrupt_report() {
    let mut t = T::up(false);
    t.send(
        5,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    t.d.take_usb();
    for (id, set) in [(6, true), (7, false)] {
        let out = halt(&mut t, id, EP_BULK_IN, set);
        t.d.poll(t.t);
        let more = t.d.take_usb();
        assert!(
            out.iter()
                .chain(&more)
                .all(|p| p.msg.name() != "interrupt_packet"),
            "the link did not change: {out:?} {more:?}"
        );
    }
}

#[test]
fn a_halted_interrupt_endpoint_stalls_once_and_reports_again_when_cleared() {
    let mut t = T::up(false);
    let out = t.send(
        5,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    assert!(out.iter().any(|p| p.msg.name() == "interrupt_packet"));
    let out = halt(&mut t, 6, EP_INTERRUPT, true);
    let Message::InterruptPacket(i) = &out[0].msg else {
        panic!("an interrupt packet")
    };
    assert_eq!(
        (i.endpoint, i.status, i.data.len()),
        (EP_INTERRUPT, Status::STALL, 0)
    );
    let stall_id = out[0].id;
    t.d.phy_mut().set_carrier(false);
    t.d.poll(t.t);
    assert!(t.d.take_usb().is_empty(), "nothing while halted");
    let out = halt(&mut t, 7, EP_INTERRUPT, false);
    let Message::InterruptPacket(i) = &out[0].msg else {
        panic!("the link again")
    };
    assert_eq!((i.status, i.data[2]), (Status::SUCCESS, 0), "link down");
    assert_eq!(out[0].id, stall_id + 1, "interrupt packets are numbered on");
}

#[test]
fn set_configuration_clears_every_halt() {
    let mut t = T::up(false);
    halt(&mut t, 40, EP_BULK_IN, true);
    halt(&mut t, 41, EP_BULK_OUT, true);
    t.send(42, Message::SetConfiguration { configuration: 1 });
    assert_eq!(halt_status(&mut t, EP_BULK_IN), 0);
    assert_eq!(halt_status(&mut t, EP_BULK_OUT), 0);
    assert!(t.send(43, bulk_in(2048)).is_empty(), "queued again");
}

#[test]
fn halt_requests_for_endpoints_the_device_lacks_stall() {
    let mut t = T::up(false);
    for (req, ep) in [
        (SET_FEATURE, 0x84u16),
        (SET_FEATURE, 0x00),
        (CLEAR_FEATURE, 0x05),
    ] {
        let out = t.send(50, ctrl(0x02, req, 0, ep, 0, vec![]));
        let Message::ControlPacket(c) = &out[0].msg else {
            panic!()
        };
        assert_eq!(c.status, Status::STALL, "{req} {ep:#x}");
    }
    let out = t.send(51, ctrl(0x82, 0, 0, 0x86, 2, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!()
    };
    assert_eq!(c.status, Status::STALL, "GET_STATUS of no endpoint");
    assert_eq!(halt_status(&mut t, 0x80), 0, "ep0 has a status");
}

#[test]
fn bulk_refusals_name_their_endpoint_and_reason() {
    let mut t = T::new(false);
    t.send(0, hello().msg);
    // Not configured: STALL on the endpoint asked for.
    let out = t.send(1, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!((b.endpoint, b.status), (EP_BULK_IN, Status::STALL));
    t.send(2, Message::SetConfiguration { configuration: 1 });
    // A second request with a pending request's id.
    t.send(3, bulk_in(2048));
    let out = t.send(3, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!((b.endpoint, b.status), (EP_BULK_IN, Status::INVAL));
    // Past the bound of pending bulk INs: an I/O error at once.
    for id in 0..BULK_IN_MAX as u64 - 1 {
        assert!(t.send(100 + id, bulk_in(2048)).is_empty());
    }
    assert_eq!(t.d.pending_bulk_in(), BULK_IN_MAX);
    let out = t.send(99_999, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!(
        (out[0].id, b.endpoint, b.status),
        (99_999, EP_BULK_IN, Status::IOERROR)
    );
    assert_eq!(t.d.counters().bulk_refused, 2);
    assert_eq!(t.d.pending_bulk_in(), BULK_IN_MAX);
}

#[test]
fn interrupt_packets_are_counted() {
    let mut t = T::up(false);
    t.send(
        1,
        Message::StartInterruptReceiving {
            endpoint: EP_INTERRUPT,
        },
    );
    t.d.phy_mut().set_carrier(false);
    t.d.poll(t.t);
    t.d.phy_mut().set_carrier(true);
    t.d.poll(t.t);
    assert_eq!(t.d.counters().interrupt_packets, 3);
}

#[test]
fn completions_name_their_endpoints() {
    let mut t = T::up(false);
    t.d.set_rx_mode(RxMode::Whole);
    let out = t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    let b = bulk_reply(&out[0]);
    assert_eq!(
        (b.endpoint, b.status, b.length),
        (EP_BULK_OUT, Status::SUCCESS, 64)
    );
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.send(2, bulk_in(2048));
    assert_eq!(bulk_reply(&out[0]).endpoint, EP_BULK_IN);
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.send(3, bulk_in(8));
    let b = bulk_reply(&out[0]);
    assert_eq!((b.endpoint, b.status), (EP_BULK_IN, Status::BABBLE));
}
