//! Tests of bulk OUT toward the wire: pacing at the line rate, catching
//! up idle time, back-pressure, and cancelling or resetting pending
//! transfers.

use super::*;

#[test]
fn bulk_out_reaches_the_wire_unpaced() {
    let mut t = T::up(false);
    let f = frame([0xff; 6], 60);
    let out = t.send(9, bulk_out(framing::tx_transfer(&f)));
    assert_eq!(bulk_reply(&out[0]).length, 64);
    assert_eq!(bulk_reply(&out[0]).status, Status::SUCCESS);
    assert_eq!(t.d.take_wire(), vec![f]);
    assert_eq!(t.d.counters().tx_frames, 1);
}

#[test]
fn an_unpaced_transfer_longer_than_the_tx_queue_reaches_the_wire_at_once() {
    let mut t = T::up(false);
    let one = framing::tx_transfer(&frame(MAC, 1000));
    let n = TX_QUEUE_FRAMES + 72;
    let big = repeated(&one, n);
    let out = t.send(5, bulk_out(big));
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (5, Status::SUCCESS)
    );
    assert_eq!(
        t.d.take_wire().len(),
        n,
        "the queue refilled until it was all sent"
    );
}

#[test]
fn paced_bulk_out_completes_when_the_frame_left() {
    let mut t = T::up(true);
    let f = frame([0xff; 6], 1514);
    let out = t.send(1, bulk_out(framing::tx_transfer(&f)));
    assert!(out.is_empty(), "completion waits for the wire");
    let out = t.send(2, bulk_out(framing::tx_transfer(&f)));
    assert!(out.is_empty());
    let next = t.d.poll(t.t).expect("a deadline");
    assert_eq!(next, t.t + framing::wire_time(1514, 100_000_000));
    t.d.poll(next);
    let out = t.d.take_usb();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].id, 1);
    assert_eq!(t.d.take_wire().len(), 1);
    t.d.poll(next + framing::wire_time(1514, 100_000_000));
    assert_eq!(t.d.take_usb()[0].id, 2, "in order");
}

#[test]
fn a_slower_wire_spaces_frames_by_its_share_of_the_line_rate() {
    // --pace-percent 95: the wire carries 95 Mbit/s of a 100 Mbit/s link,
    // in both directions (the farm's seeded 5 % loss).
    let t0 = Instant::now();
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
    cfg.pace_percent = 95;
    let mut d = Device::new(cfg, t0);
    d.transport_opened(t0);
    let mut t = T { d, t: t0 };
    t.send(0, hello().msg);
    t.send(1, Message::SetConfiguration { configuration: 1 });
    t.send(2, ctrl(0x40, cmd::WRITE_RX_CTL, 0x0088, 0, 0, vec![]));
    t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336, 0, 0, vec![]));
    t.d.set_pace_burst(Duration::ZERO);
    let f = frame([0xff; 6], 1514);
    t.send(10, bulk_out(framing::tx_transfer(&f)));
    let slow = framing::wire_time(1514, 95_000_000);
    assert!(slow > framing::wire_time(1514, 100_000_000));
    assert_eq!(t.d.poll(t.t), Some(t.t + slow), "TX");
    // RX: a second frame from the partner is ready one slower wire time
    // after the first.
    t.send(20, bulk_in(2048));
    t.send(21, bulk_in(2048));
    t.d.wire_frame(t.t, frame(MAC, 1514));
    t.d.wire_frame(t.t, frame(MAC, 1514));
    t.d.take_usb();
    let due: Vec<_> = std::iter::from_fn(|| {
        let next = t.d.poll(t.t)?;
        t.t = next;
        Some(next)
    })
    .take(4)
    .collect();
    assert!(due.contains(&(t0 + 2 * slow)), "{due:?}");
}

/// Transfers that complete at once when `n` full-size frames meet a wire
/// that sat idle for `idle`, with a pacing burst of `burst`.
fn caught_up(burst: Duration, idle: Duration, n: u64, rx: bool) -> usize {
    let mut t = T::up(true);
    t.d.set_pace_burst(burst);
    t.t += idle;
    let mut done = 0;
    for id in 0..n {
        done += if rx {
            t.send(100 + id, bulk_in(2048)).len()
        } else {
            let f = frame([0xff; 6], 1514);
            t.send(id, bulk_out(framing::tx_transfer(&f))).len()
        };
    }
    if rx {
        for _ in 0..n {
            t.d.wire_frame(t.t, frame(MAC, 1514));
            done += t.d.take_usb().len();
        }
    }
    done
}

#[test]
fn paced_wire_catches_up_idle_time_up_to_the_burst() {
    let wt = framing::wire_time(1514, 100_000_000);
    let ms = Duration::from_millis(1);
    for rx in [false, true] {
        // 1 ms of credit is 8 full frames (123 us each); the 9th waits.
        assert_eq!(caught_up(ms, 10 * ms, 20, rx), 8, "rx={rx}");
        // Credit does not grow with longer idle time.
        assert_eq!(caught_up(ms, 100 * ms, 20, rx), 8, "rx={rx}");
        // Strict spacing: nothing leaves before its wire time.
        assert_eq!(caught_up(Duration::ZERO, 10 * ms, 20, rx), 0, "rx={rx}");
    }
    // The 9th frame leaves 9 wire times after the credit began; the rate
    // over any longer window stays the line rate.
    let mut t = T::up(true);
    t.d.set_pace_burst(ms);
    t.t += 10 * ms;
    let f = frame([0xff; 6], 1514);
    for id in 0..9 {
        t.send(id, bulk_out(framing::tx_transfer(&f)));
    }
    assert_eq!(t.d.poll(t.t), Some(t.t - ms + 9 * wt));
}

#[test]
fn cancelling_a_pending_bulk_out_answers_cancelled_and_never_completes_it() {
    let mut t = T::up(true);
    let data = framing::tx_transfer(&frame(MAC, 1514));
    t.send(40, bulk_out(data.clone()));
    t.send(41, bulk_out(data));
    assert_eq!(t.d.pending_bulk_out(), 2);
    let out = t.send(41, Message::CancelDataPacket);
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (41, Status::CANCELLED)
    );
    assert_eq!(t.d.counters().bulk_cancelled, 1);
    t.d.poll(t.t + Duration::from_millis(5));
    let ids: Vec<_> = t.d.take_usb().iter().map(|p| p.id).collect();
    assert_eq!(ids, [40], "only the other transfer completes");
    assert_eq!(t.d.pending_bulk_out(), 0);
}

#[test]
fn reset_answers_pending_bulk_outs() {
    let mut t = T::up(true);
    t.send(50, bulk_out(framing::tx_transfer(&frame(MAC, 1514))));
    let out = t.send(0, Message::Reset);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (50, Status::CANCELLED)
    );
    assert_eq!(bulk_reply(&out[0]).endpoint, EP_BULK_OUT);
    t.d.poll(t.t + Duration::from_millis(5));
    assert!(
        t.d.take_usb().is_empty(),
        "no late completion after the reset"
    );
}

#[test]
fn bulk_outs_wait_for_tx_room_and_the_device_asks_for_back_pressure() {
    let mut t = T::up(true);
    t.d.set_pace_burst(Duration::ZERO);
    let data = framing::tx_transfer(&frame(MAC, 1514));
    let mut id = 1;
    // One frame per transfer: this many fill the queue.
    for _ in 0..TX_QUEUE_FRAMES {
        assert!(t.d.usb_room());
        t.send(id, bulk_out(data.clone()));
        id += 1;
    }
    assert_eq!(t.d.tx_queued(), TX_QUEUE_FRAMES);
    // The queue is full: further transfers wait unparsed.
    for _ in 0..OUT_WAIT_HIGH - 1 {
        t.send(id, bulk_out(data.clone()));
        id += 1;
        assert!(t.d.usb_room());
    }
    t.send(id, bulk_out(data.clone()));
    id += 1;
    assert!(!t.d.usb_room(), "{OUT_WAIT_HIGH} waiting: stop reading");
    assert_eq!(
        t.d.tx_queued(),
        TX_QUEUE_FRAMES,
        "nothing parsed beyond the bound"
    );
    assert_eq!(t.d.pending_bulk_out(), TX_QUEUE_FRAMES + OUT_WAIT_HIGH);
    // Past the hard bound a transfer is refused, not queued.
    for _ in OUT_WAIT_HIGH..OUT_WAIT_MAX {
        t.send(id, bulk_out(data.clone()));
        id += 1;
    }
    let out = t.send(id, bulk_out(data.clone()));
    assert_eq!(bulk_reply(&out[0]).status, Status::IOERROR);
    assert_eq!(t.d.counters().bulk_refused, 1);
    // One frame leaves: one waiting transfer is taken in.
    let wt = framing::wire_time(1514, 100_000_000);
    t.d.poll(t.t + wt);
    assert_eq!(t.d.tx_queued(), TX_QUEUE_FRAMES);
    assert_eq!(t.d.pending_bulk_out(), TX_QUEUE_FRAMES + OUT_WAIT_MAX - 1);
}

#[test]
fn a_flood_of_4_mib_bulk_outs_stays_bounded_in_frames_and_bytes() {
    let mut t = T::up(true);
    t.d.set_pace_burst(Duration::ZERO);
    // 2760 frames of 1514 bytes in one transfer: just under 4 MiB.
    let one = framing::tx_transfer(&frame(MAC, 1514));
    let big = repeated(&one, 2760);
    assert!(big.len() <= 4 << 20);
    let bound = OUT_WAIT_BYTES_HIGH + big.len();
    let wt = framing::wire_time(1514, 100_000_000);
    let mut id = 100;
    let mut sent = 0;
    let mut completed = 0;
    let mut now = t.t;
    // A peer that sends whenever the device reads, for 60 000 frame times
    // (7.4 s of wire): the device never holds more than one transfer past
    // its byte mark, nor more than the TX queue's frames.
    for step in 0..60_000u32 {
        if t.d.usb_room() {
            t.d.handle(now, Packet::new(id, bulk_out(big.clone())));
            id += 1;
            sent += 1;
        }
        // Back-pressure: no transfer is taken faster than the wire carries
        // its frames (one frame time a step), beyond the few held.
        let carried = step as usize + 1;
        assert!(
            sent <= carried / 2760 + 3,
            "{sent} transfers taken after {carried} frame times"
        );
        now = t.t + wt * step;
        t.d.poll(now);
        completed +=
            t.d.take_usb()
                .iter()
                .filter(|p| p.id >= 100 && bulk_reply(p).status == Status::SUCCESS)
                .count();
        assert!(t.d.tx_queued() <= TX_QUEUE_FRAMES, "{}", t.d.tx_queued());
        assert!(t.d.held_out_bytes() <= bound, "{}", t.d.held_out_bytes());
    }
    assert!(sent >= 20, "the flood kept going: {sent} transfers");
    assert!(completed >= sent - 2, "{completed} of {sent} completed");
    assert_eq!(t.d.counters().tx_frames as usize, 60_000 - 1);
}

#[test]
fn cancelling_the_transfer_being_parsed_frees_it_and_keeps_what_was_queued() {
    let mut t = T::up(true);
    let one = framing::tx_transfer(&frame(MAC, 1514));
    let big = repeated(&one, 1000);
    t.send(7, bulk_out(big.clone()));
    assert_eq!(t.d.tx_queued(), TX_QUEUE_FRAMES);
    assert_eq!(t.d.held_out_bytes(), big.len());
    assert!(!t.d.usb_room(), "past the byte mark");
    let out = t.send(8, bulk_out(one.clone()));
    assert!(out.is_empty(), "the second one waits");
    let out = t.send(0, Message::CancelDataPacket);
    assert!(out.is_empty(), "id 0 is not pending");
    t.d.handle(t.t, Packet::new(7, Message::CancelDataPacket));
    let out = t.d.take_usb();
    assert_eq!(
        (out[0].id, bulk_reply(&out[0]).status),
        (7, Status::CANCELLED)
    );
    assert_eq!(
        t.d.held_out_bytes(),
        one.len(),
        "only the waiting one is held"
    );
    assert_eq!(
        t.d.tx_queued(),
        TX_QUEUE_FRAMES,
        "queued frames still leave"
    );
    // A duplicate of a transfer being parsed or on its way is refused.
    let out = t.send(8, bulk_out(one.clone()));
    assert_eq!(bulk_reply(&out[0]).status, Status::INVAL);
}
