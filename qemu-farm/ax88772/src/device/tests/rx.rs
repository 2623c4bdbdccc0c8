//! Tests of bulk IN from the wire: frames batched into requests, records
//! split across them, the RX gate and filter, and the RX queue's room.

use super::*;
use crate::nic;

#[test]
fn wire_frames_batch_into_one_bulk_in() {
    let mut t = T::up(false);
    t.send(7, bulk_in(2048));
    // Nothing yet: the request waits.
    assert!(t.d.take_usb().is_empty());
    let out = {
        t.d.wire_frame(t.t, frame(MAC, 42));
        t.d.take_usb()
    };
    assert_eq!(bulk_reply(&out[0]).data.len(), 46);
    // Queue three frames first, then post one request.
    for len in [42, 61, 100] {
        t.d.wire_frame(t.t, frame(MAC, len));
    }
    let out = t.send(8, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!(b.data.len(), 46 + 66 + 104);
    assert_eq!(b.length as usize, b.data.len());
    assert_eq!(&b.data[46..50], &framing::header(61));
    assert_eq!(t.d.counters().rx_frames, 4);
}

#[test]
fn never_more_than_asked() {
    let mut t = T::up(false);
    t.d.set_rx_mode(RxMode::Whole);
    for len in [60, 60, 60] {
        t.d.wire_frame(t.t, frame(MAC, len));
    }
    let out = t.send(1, bulk_in(130));
    assert_eq!(
        bulk_reply(&out[0]).data.len(),
        128,
        "two 64-byte records fit 130"
    );
    t.d.wire_frame(t.t, frame(MAC, 61));
    let out = t.send(2, bulk_in(10));
    assert_eq!(out.len(), 1, "a request too short for any record completes");
    assert_eq!(bulk_reply(&out[0]).status, Status::BABBLE);
    assert!(bulk_reply(&out[0]).data.is_empty());
    assert_eq!(t.d.counters().rx_too_big_for_request, 1);
    // Only the frame that overflowed it is gone; the next request gets the rest.
    let out = t.send(3, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!(b.status, Status::SUCCESS);
    assert_eq!(&b.data[..4], &framing::header(61));
    assert_eq!(b.data.len(), 4 + 62);
}

#[test]
fn a_request_too_short_for_the_next_record_gets_its_start_by_default() {
    let mut t = T::up(false);
    t.d.wire_frame(t.t, frame(MAC, 1000));
    let out = t.send(1, bulk_in(512));
    let b = bulk_reply(&out[0]);
    assert_eq!((b.status, b.data.len()), (Status::SUCCESS, 512));
    assert_eq!(&b.data[..4], &framing::header(1000));
    let out = t.send(2, bulk_in(2048));
    let b = bulk_reply(&out[0]);
    assert_eq!(b.data.len(), 1004 - 512, "the rest of the record");
    assert_eq!(t.d.counters().rx_too_big_for_request, 0);
    assert_eq!(t.d.counters().rx_frames, 1);
    assert_eq!(t.d.config().rx_mode, RxMode::Stream);
}

#[test]
fn the_rest_of_a_record_is_sent_as_soon_as_a_request_waits() {
    let mut t = T::up(false);
    t.d.wire_frame(t.t, frame(MAC, 1000));
    t.send(1, bulk_in(1000));
    // No new frame: the tail alone completes the next request at once.
    let out = t.send(2, bulk_in(2048));
    assert_eq!(bulk_reply(&out[0]).data.len(), 4);
    assert_eq!(t.d.poll(t.t), None, "nothing left to do");
}

#[test]
fn bulk_in_completes_in_order() {
    let mut t = T::up(false);
    t.send(11, bulk_in(2048));
    t.send(12, bulk_in(2048));
    t.d.wire_frame(t.t, frame(MAC, 60));
    t.d.wire_frame(t.t, frame(MAC, 61));
    let ids: Vec<_> = t.d.take_usb().iter().map(|p| p.id).collect();
    assert_eq!(ids, [11, 12]);
}

#[test]
fn rx_gated_and_filtered() {
    let mut t = T::new(false);
    t.send(0, hello().msg);
    t.send(1, Message::SetConfiguration { configuration: 1 });
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.counters().rx_dropped_gated, 1);
    let mut t = T::up(false);
    t.d.wire_frame(t.t, frame([0x02, 0, 0, 0, 0, 9], 60));
    assert_eq!(t.d.counters().rx_filtered, 1);
}

#[test]
fn the_rx_gate_applies_at_delivery() {
    let mut t = T::up(false);
    t.d.wire_frame(t.t, frame(MAC, 60));
    t.d.wire_frame(t.t, frame(MAC, 61));
    // The guest closes RX (RX_CTL = 0) before asking for the frames.
    t.send(5, ctrl(0x40, cmd::WRITE_RX_CTL, 0, 0, 0, vec![]));
    assert!(
        t.send(6, bulk_in(2048)).is_empty(),
        "queued frames never arrive"
    );
    assert_eq!(t.d.counters().rx_dropped_gated, 2);
    assert_eq!(t.d.counters().rx_frames, 0);
    // Reopened, new frames flow again.
    t.send(7, ctrl(0x40, cmd::WRITE_RX_CTL, 0x0088, 0, 0, vec![]));
    t.d.wire_frame(t.t, frame(MAC, 62));
    let out = t.d.take_usb();
    assert_eq!(bulk_reply(&out[0]).data.len(), 4 + 62);
}

#[test]
fn bulk_in_is_capped_at_2048_bytes() {
    let mut t = T::up(false);
    t.d.set_rx_mode(RxMode::Whole);
    for _ in 0..3 {
        t.d.wire_frame(t.t, frame(MAC, 1000));
    }
    let out = t.send(1, bulk_in(16384));
    let b = bulk_reply(&out[0]);
    assert_eq!(
        b.data.len(),
        2 * (4 + 1000),
        "two records; the third would pass 2048"
    );
    assert_eq!(b.length as usize, b.data.len());
    let out = t.send(2, bulk_in(16384));
    assert_eq!(bulk_reply(&out[0]).data.len(), 4 + 1000);
}

/// A device up at 100/Full whose RX queue holds two frames, with MEDIUM
/// as given (0x0336 has TFC and RFC; 0x0306 has neither).
fn two_frame_queue(medium: u16) -> T {
    let t0 = Instant::now();
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
    cfg.paced = false;
    cfg.rx_queue_frames = 2;
    let mut t = T {
        d: Device::new(cfg, t0),
        t: t0,
    };
    t.d.transport_opened(t0);
    t.send(0, hello().msg);
    t.send(1, Message::SetConfiguration { configuration: 1 });
    t.send(2, ctrl(0x40, cmd::WRITE_RX_CTL, 0x0088, 0, 0, vec![]));
    t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, medium, 0, 0, vec![]));
    // Advertise PAUSE (as phylib does) and autonegotiate again.
    mdio_write(&mut t, 4, 4, 0x05e1);
    mdio_write(&mut t, 6, 0, 0x1200);
    relink(&mut t);
    let p = t.d.nic.phy.snapshot();
    assert!(p.pause, "the link negotiated PAUSE: {p:?}");
    t
}

/// Let time pass until the link is up again.
fn relink(t: &mut T) {
    for ms in 1..=4000 {
        t.t += Duration::from_millis(1);
        t.d.poll(t.t);
        if ms > 10 && t.d.nic.phy.snapshot().link {
            return;
        }
    }
    panic!("no link: {:?}", t.d.nic.phy.snapshot());
}

#[test]
fn with_tfc_a_full_rx_queue_holds_the_partner_with_xoff_until_xon() {
    let mut t = two_frame_queue(0x0336);
    assert!(t.d.partner_may_send());
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert!(t.d.partner_may_send());
    assert!(t.d.take_wire().is_empty());
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert!(!t.d.partner_may_send(), "two frames fill a two-frame queue");
    let xoff = t.d.take_wire();
    assert_eq!(xoff.len(), 1, "one XOFF: {xoff:?}");
    assert_eq!(nic::pause_quanta(&xoff[0]), Some(nic::PAUSE_QUANTA_MAX));
    assert_eq!(&xoff[0][6..12], &MAC, "from the MAC's own address");
    // A frame already on its way when XOFF went out is lost, not as the
    // driver's fault.
    t.d.wire_frame(t.t, frame(MAC, 60));
    let c = t.d.counters();
    assert_eq!((c.rx_overflow, c.rx_overflow_tfc_off), (1, 0));
    t.send(4, bulk_in(2048));
    assert!(t.d.partner_may_send());
    let xon = t.d.take_wire();
    assert_eq!(xon.len(), 1, "one XON: {xon:?}");
    assert_eq!(nic::pause_quanta(&xon[0]), Some(0));
    assert_eq!(t.d.counters().pause_sent, 2);
}

#[test]
fn a_queue_flushed_by_the_rx_gate_releases_a_partner_held_by_xoff() {
    let mut t = two_frame_queue(0x0336);
    t.d.wire_frame(t.t, frame(MAC, 60));
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert!(!t.d.partner_may_send());
    // phylink's mac_link_down: MEDIUM 0 closes the gate; a waiting bulk IN
    // finds the queue's frames gone.
    t.send(10, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0, 0, 0, vec![]));
    t.send(11, bulk_in(2048));
    assert_eq!(t.d.counters().rx_dropped_gated, 2);
    // mac_link_up with flow control again: the partner is not left held
    // off in front of an empty queue.
    t.send(12, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336, 0, 0, vec![]));
    assert!(t.d.partner_may_send());
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.counters().rx_frames, 1, "the waiting request took it");
}

#[test]
fn without_tfc_a_negotiated_pause_link_loses_frames_to_a_full_queue_and_counts_them() {
    let mut t = two_frame_queue(0x0306);
    for _ in 0..5 {
        assert!(t.d.partner_may_send(), "nothing holds the partner off");
        t.d.wire_frame(t.t, frame(MAC, 60));
    }
    let c = t.d.counters();
    assert_eq!(
        (c.rx_overflow, c.rx_overflow_tfc_off, c.pause_sent),
        (0, 3, 0)
    );
    assert!(t.d.take_wire().is_empty(), "no PAUSE frame went out");
}

#[test]
fn without_negotiated_pause_a_full_queue_overflows_but_is_not_the_drivers_fault() {
    let mut t = two_frame_queue(0x0336);
    // The partner stops advertising PAUSE; the link renegotiates.
    ctl(&mut t, r#"{"cmd":"partner","pause":false}"#);
    relink(&mut t);
    let p = t.d.nic.phy.snapshot();
    assert!(p.link && !p.pause, "{p:?}");
    for _ in 0..4 {
        assert!(t.d.partner_may_send());
        t.d.wire_frame(t.t, frame(MAC, 60));
    }
    let c = t.d.counters();
    assert_eq!(
        (c.rx_overflow, c.rx_overflow_tfc_off, c.pause_sent),
        (2, 0, 0)
    );
}

#[test]
fn a_pause_from_the_partner_holds_tx_with_rfc_and_is_dropped_without() {
    for (medium, honoured) in [(0x0336, true), (0x0326, false)] {
        let mut t = two_frame_queue(medium);
        t.d.wire_frame(t.t, nic::pause_frame([2, 0, 0, 0, 0, 9], 1000));
        let c = t.d.counters();
        assert_eq!(
            (c.pause_honoured, c.pause_ignored),
            (u64::from(honoured), u64::from(!honoured))
        );
        assert_eq!(
            c.rx_frames + c.rx_filtered,
            0,
            "a PAUSE never reaches the guest"
        );
        let f = frame([0xff; 6], 60);
        t.send(5, bulk_out(framing::tx_transfer(&f)));
        if !honoured {
            assert_eq!(t.d.take_wire(), vec![f]);
            continue;
        }
        assert!(t.d.take_wire().is_empty(), "held by the PAUSE");
        // 1000 quanta of 512 bit times at 100 Mbit/s: 5.12 ms.
        let due = t.d.poll(t.t).expect("a wake-up when the pause ends");
        assert_eq!(due - t.t, Duration::from_micros(5120));
        t.t = due;
        t.d.poll(t.t);
        assert_eq!(t.d.take_wire(), vec![f]);
    }
}

#[test]
fn a_paced_rx_frame_is_a_wake_up_only_while_a_request_waits() {
    let mut t = T::up(true);
    t.d.set_pace_burst(Duration::ZERO);
    t.d.wire_frame(t.t, frame(MAC, 1514));
    let ready = t.t + framing::wire_time(1514, 100_000_000);
    assert_eq!(t.d.poll(t.t), None, "nobody asked for it yet");
    t.send(1, bulk_in(2048));
    assert_eq!(t.d.poll(t.t), Some(ready));
    t.d.poll(ready);
    assert_eq!(t.d.take_usb()[0].id, 1);
}

#[test]
fn bulk_in_takes_only_ready_frames_and_exact_fits() {
    let mut t = T::up(true);
    t.d.set_pace_burst(Duration::ZERO);
    t.d.wire_frame(t.t, frame(MAC, 60));
    t.d.wire_frame(t.t, frame(MAC, 60));
    let wt = framing::wire_time(60, 100_000_000);
    t.d.poll(t.t + wt);
    let out = t.send(1, bulk_in(4096));
    assert_eq!(
        bulk_reply(&out[0]).data.len(),
        64,
        "the second is not ready yet"
    );
    let mut t = T::up(false);
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.send(2, bulk_in(64));
    let b = bulk_reply(&out[0]);
    assert_eq!(
        (b.status, b.data.len()),
        (Status::SUCCESS, 64),
        "a record that fills the request exactly"
    );
}
