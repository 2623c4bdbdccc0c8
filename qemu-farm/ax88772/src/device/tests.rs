//! One file over 500 lines: every session-level test of the device (hello,
//! plug and replug, control requests, bulk queues, pacing, impairment), all
//! driving one `Device` through usbredir packets and wire frames.

use super::*;
use crate::descriptors::Variant;
use crate::framing;
use crate::impair::ImpairConfig;
use crate::mac::cmd;
use crate::nic::RxMode;
use usbredir::{ControlPacket, Hello};

const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

fn hello() -> Packet {
    Packet::new(
        0,
        Message::Hello(Hello {
            version: "qemu".into(),
            caps: Caps(0xff),
            extra_caps: vec![],
        }),
    )
}

fn ctrl(
    requesttype: u8,
    request: u8,
    value: u16,
    index: u16,
    length: u16,
    data: Vec<u8>,
) -> Message {
    Message::ControlPacket(ControlPacket {
        endpoint: requesttype & 0x80,
        request,
        requesttype,
        value,
        index,
        length,
        data,
        ..Default::default()
    })
}

fn bulk_in(len: u32) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint: EP_BULK_IN,
        length: len,
        ..Default::default()
    })
}

fn bulk_out(data: Vec<u8>) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint: EP_BULK_OUT,
        length: data.len() as u32,
        data,
        ..Default::default()
    })
}

fn frame(dst: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend((6..len).map(|i| i as u8));
    f
}

struct T {
    d: Device,
    t: Instant,
}

impl T {
    fn new(paced: bool) -> T {
        let t = Instant::now();
        let mut cfg = DeviceConfig::new(Variant::Ax88772a, MAC);
        cfg.paced = paced;
        let mut d = Device::new(cfg, t);
        d.transport_opened(t);
        T { d, t }
    }

    fn send(&mut self, id: u64, m: Message) -> Vec<Packet> {
        self.d.handle(self.t, Packet::new(id, m));
        self.d.take_usb()
    }

    /// Hello, configuration, RX enabled at 100 Mbit/s.
    fn up(paced: bool) -> T {
        let mut t = T::new(paced);
        t.send(0, hello().msg);
        t.send(1, Message::SetConfiguration { configuration: 1 });
        t.send(2, ctrl(0x40, cmd::WRITE_RX_CTL, 0x0088, 0, 0, vec![]));
        t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336, 0, 0, vec![]));
        t
    }
}

fn bulk_reply(p: &Packet) -> &BulkPacket {
    match &p.msg {
        Message::BulkPacket(b) => b,
        m => panic!("expected bulk_packet, got {}", m.name()),
    }
}

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
fn tx_dropped_without_link_and_looped_back_in_loopback() {
    let mut t = T::up(false);
    t.d.phy_mut().set_carrier(false);
    t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    assert_eq!(t.d.counters().tx_dropped_no_link, 1);
    t.d.phy_mut().write(crate::phy::reg::BMCR, 0x6100);
    t.send(2, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    let out = t.send(3, bulk_in(2048));
    assert_eq!(bulk_reply(&out[0]).data.len(), 64);
    assert!(t.d.take_wire().is_empty());
}

#[test]
fn impairment_loss_is_counted() {
    let mut t = T::up(false);
    t.d.set_impair(ImpairConfig {
        loss: 1.0,
        ..Default::default()
    });
    t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    assert!(t.d.take_wire().is_empty());
    assert_eq!(t.d.counters().impair_dropped, 1);
}

#[test]
fn rx_is_dropped_while_the_link_is_down() {
    let mut t = T::up(false);
    t.send(1, bulk_in(2048));
    t.d.phy_mut().set_carrier(false);
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.counters().rx_dropped_no_link, 1);
    assert!(
        t.d.take_usb().iter().all(|p| p.id != 1),
        "nothing delivered"
    );
    t.d.phy_mut().set_carrier(true);
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.d.take_usb();
    assert_eq!(out.iter().filter(|p| p.id == 1).count(), 1);
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
    t.d.phy_mut().set_carrier(false);
    t.d.poll(t.t);
    assert!(t.d.take_usb().is_empty(), "nothing while halted");
    let out = halt(&mut t, 7, EP_INTERRUPT, false);
    let Message::InterruptPacket(i) = &out[0].msg else {
        panic!("the link again")
    };
    assert_eq!((i.status, i.data[2]), (Status::SUCCESS, 0), "link down");
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
fn mdio_registers_above_31_read_ffff_over_usb() {
    let mut t = T::up(false);
    let out = t.send(1, ctrl(0xc0, cmd::READ_MII_REG, 0x10, 0x21, 2, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!("control reply")
    };
    assert_eq!(c.data, [0xff, 0xff]);
}

fn ctl(t: &mut T, line: &str) -> serde_json::Value {
    let env = crate::ctl::CtlEnv::bare(serde_json::json!({}));
    serde_json::from_str(&crate::ctl::handle_line(&mut t.d, t.t, line, &env)).unwrap()
}

fn mdio_read(t: &mut T, id: u64, reg: u16) -> Status {
    let out = t.send(id, ctrl(0xc0, cmd::READ_MII_REG, 0x10, reg, 2, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!("control reply")
    };
    c.status
}

#[test]
fn mdio_faults_stall_chosen_registers_once_or_n_times() {
    let mut t = T::up(false);
    let r = ctl(
        &mut t,
        r#"{"cmd":"mdio_fault","op":"read","regs":[1],"count":1}"#,
    );
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(mdio_read(&mut t, 1, 2), Status::SUCCESS, "other register");
    assert_eq!(mdio_read(&mut t, 2, 1), Status::STALL);
    assert_eq!(mdio_read(&mut t, 3, 1), Status::SUCCESS, "once");
    ctl(&mut t, r#"{"cmd":"mdio_fault","op":"write","count":2}"#);
    let w = |t: &mut T, id| {
        let out = t.send(
            id,
            ctrl(0x40, cmd::WRITE_MII_REG, 0x10, 4, 2, vec![0xe1, 0x01]),
        );
        let Message::ControlPacket(c) = &out[0].msg else {
            panic!("control reply")
        };
        c.status
    };
    assert_eq!(
        (w(&mut t, 4), w(&mut t, 5), w(&mut t, 6)),
        (Status::STALL, Status::STALL, Status::SUCCESS)
    );
    assert_eq!(t.d.counters().mdio_faults_injected, 3);
    let r = ctl(&mut t, r#"{"cmd":"describe"}"#);
    assert_eq!(r["faults"]["mdio"]["injected"], 3);
    assert_eq!(r["faults"]["mdio"]["rules"][1]["op"], "write");
    ctl(&mut t, r#"{"cmd":"mdio_fault","clear":true}"#);
    assert_eq!(
        ctl(&mut t, r#"{"cmd":"describe"}"#)["faults"]["mdio"]["rules"],
        serde_json::json!([])
    );
    for bad in [
        r#"{"cmd":"mdio_fault","regs":[32]}"#,
        r#"{"cmd":"mdio_fault","probability":2}"#,
        r#"{"cmd":"mdio_fault","clear":true,"count":1}"#,
        r#"{"cmd":"mdio_fault","op":"sideways"}"#,
    ] {
        assert_eq!(ctl(&mut t, bad)["ok"], false, "{bad}");
    }
}

#[test]
fn mdio_fault_probability_is_reproducible_from_its_seed() {
    let pattern = |seed: u64| {
        let mut t = T::up(false);
        ctl(
            &mut t,
            &format!(r#"{{"cmd":"mdio_fault","probability":0.3,"seed":{seed}}}"#),
        );
        (0..200)
            .map(|i| mdio_read(&mut t, i + 10, 1) == Status::STALL)
            .collect::<Vec<_>>()
    };
    assert_eq!(pattern(9), pattern(9));
    assert_ne!(pattern(9), pattern(10));
    let n = pattern(9).iter().filter(|x| **x).count();
    assert!((30..90).contains(&n), "{n} of 200 at p=0.3");
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
fn partners_limited_to_10_or_half_duplex_negotiate_what_they_can() {
    let mut t = T::up(false);
    let r = ctl(&mut t, r#"{"cmd":"partner","modes":["10full","10half"]}"#);
    assert_eq!(
        (
            r["phy"]["speed"].as_u64(),
            r["phy"]["full_duplex"].as_bool()
        ),
        (Some(10), Some(true))
    );
    let r = ctl(&mut t, r#"{"cmd":"partner","modes":["100half","10half"]}"#);
    assert_eq!(
        (
            r["phy"]["speed"].as_u64(),
            r["phy"]["full_duplex"].as_bool()
        ),
        (Some(100), Some(false))
    );
    assert_eq!(r["phy"]["pause"], false, "no pause at half duplex");
    let r = ctl(&mut t, r#"{"cmd":"partner","modes":[]}"#);
    assert_eq!(r["phy"]["state"], "autoneg");
    t.d.poll(t.t + Duration::from_secs(3600));
    assert_eq!(
        t.d.phy().state(),
        crate::phy::PhyState::Autoneg,
        "never completes"
    );
    assert!(!t.d.phy().link_up());
}

#[test]
fn wire_latency_delays_both_directions() {
    let mut t = T::up(false);
    let r = ctl(&mut t, r#"{"cmd":"impair","latency_us":1000}"#);
    assert_eq!(r["impair"]["latency_us"], 1000);
    t.send(1, bulk_in(2048));
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert!(t.d.take_usb().is_empty(), "still on the wire");
    assert_eq!(t.d.poll(t.t), Some(t.t + Duration::from_millis(1)));
    t.d.poll(t.t + Duration::from_millis(1));
    assert_eq!(t.d.take_usb()[0].id, 1);
    t.t += Duration::from_millis(1);
    t.send(2, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    assert!(t.d.take_wire().is_empty());
    t.d.poll(t.t + Duration::from_micros(999));
    assert!(t.d.take_wire().is_empty());
    t.d.poll(t.t + Duration::from_millis(1));
    assert_eq!(t.d.take_wire().len(), 1);
    assert_eq!(
        ctl(&mut t, r#"{"cmd":"impair","latency_us":200000}"#)["ok"],
        false
    );
}

#[test]
fn wire_jitter_keeps_order_stays_in_range_and_follows_the_seed() {
    let arrivals = |seed: u64| {
        let mut t = T::up(false);
        ctl(
            &mut t,
            &format!(
                r#"{{"cmd":"impair","latency_us":100,"jitter_us":400,"direction":"tx","seed":{seed}}}"#
            ),
        );
        for i in 0..50u8 {
            t.send(
                u64::from(i) + 1,
                bulk_out(framing::tx_transfer(&frame([i; 6], 60))),
            );
        }
        let mut seen = Vec::new();
        for us in 0..=600 {
            t.d.poll(t.t + Duration::from_micros(us));
            for f in t.d.take_wire() {
                seen.push((us, f[0]));
            }
        }
        seen
    };
    let a = arrivals(5);
    assert_eq!(a.len(), 50);
    assert!(a.windows(2).all(|w| w[0].1 < w[1].1), "in order");
    assert!(a.iter().all(|(us, _)| (100..=500).contains(us)), "{a:?}");
    assert_eq!(a, arrivals(5));
    assert_ne!(a, arrivals(6));
}

#[test]
fn counters_count_frames_bytes_and_corruption_exactly() {
    let mut t = T::up(false);
    t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    t.send(2, bulk_out(framing::tx_transfer(&frame(MAC, 100))));
    t.send(3, bulk_in(2048));
    t.d.wire_frame(t.t, frame(MAC, 70));
    t.d.wire_frame(t.t, frame(MAC, 80));
    t.send(4, bulk_in(2048));
    let c = t.d.counters().clone();
    assert_eq!((c.tx_frames, c.tx_bytes), (2, 160));
    assert_eq!((c.rx_frames, c.rx_bytes), (2, 150));
    assert_eq!((c.bulk_out_transfers, c.bulk_in_transfers), (2, 2));
    assert_eq!(c.impair_corrupted, 0);
    t.d.set_impair(ImpairConfig {
        corrupt: 1.0,
        ..Default::default()
    });
    t.send(5, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    t.send(6, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    assert_eq!(t.d.counters().impair_corrupted, 2);
    assert_eq!(
        t.d.counters().tx_frames,
        4,
        "the partner judges a TX frame's FCS"
    );
    // A frame corrupted on its way in fails the MAC's FCS check.
    t.d.wire_frame(t.t, frame(MAC, 70));
    let out = t.send(7, bulk_in(2048));
    assert!(out.is_empty(), "nothing delivered");
    let c = t.d.counters().clone();
    assert_eq!(
        (c.impair_corrupted, c.rx_crc_errors, c.rx_frames),
        (3, 1, 2)
    );
    t.d.reset_counters();
    assert_eq!(t.d.counters(), &Counters::default());
}

/// A frame from MAC's port 40000 to the partner's 5201 with `len` bytes of
/// TCP payload at sequence number `seq`.
fn tcp_frame(dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = frame(dst, 14);
    f.truncate(12);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (40 + len) as u16;
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[10, 77, 0, 1, 10, 77, 0, 2]);
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&5201u16.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 5 << 4, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend(std::iter::repeat_n(0x5a, len));
    f
}

#[test]
fn tcp_payload_is_counted_once_in_each_direction_retransmissions_not() {
    let mut t = T::up(false);
    for (i, seq) in [1000u32, 2460, 1000].into_iter().enumerate() {
        let f = tcp_frame([0x02, 0, 0, 0, 0, 2], seq, 1460);
        t.send(10 + i as u64, bulk_out(framing::tx_transfer(&f)));
    }
    t.send(20, bulk_in(2048));
    for seq in [7u32, 7, 1467] {
        t.d.wire_frame(t.t, tcp_frame(MAC, seq, 1460));
    }
    for id in 21..24 {
        t.send(id, bulk_in(2048));
    }
    let c = t.d.counters().clone();
    assert_eq!((c.tx_frames, c.tx_tcp_new_bytes), (3, 2 * 1460));
    assert_eq!((c.rx_frames, c.rx_tcp_new_bytes), (3, 2 * 1460));
    assert_eq!(c.tx_bytes, 3 * (14 + 40 + 1460));
    // Each direction carried one segment again, counted apart.
    assert_eq!((c.tx_tcp_again_bytes, c.rx_tcp_again_bytes), (1460, 1460));
}

#[test]
fn bmcr_isolate_keeps_the_link_and_passes_no_data() {
    let mut t = T::up(false);
    let mdio_write = |t: &mut T, id, reg, v: u16| {
        t.send(id, ctrl(0x40, cmd::SET_SW_MII, 0, 0, 0, vec![]));
        t.send(
            id + 1,
            ctrl(
                0x40,
                cmd::WRITE_MII_REG,
                0x10,
                reg,
                2,
                v.to_le_bytes().to_vec(),
            ),
        );
    };
    mdio_write(&mut t, 10, 0, 0x3500);
    assert!(t.d.phy().link_up(), "the link stays");
    t.send(20, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    t.d.wire_frame(t.t, frame(MAC, 60));
    let out = t.send(21, bulk_in(2048));
    assert!(out.is_empty());
    let c = t.d.counters().clone();
    assert_eq!((c.tx_frames, c.rx_frames, c.isolated_dropped), (0, 0, 2));
    // Cleared, as genphy_config_aneg does: data flows again.
    mdio_write(&mut t, 30, 0, 0x3100);
    t.send(40, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.take_usb().len(), 1, "the waiting bulk IN completes");
    assert_eq!(t.d.counters().tx_frames, 1);
}

#[test]
fn a_duplex_mismatch_makes_crossing_frames_collide() {
    let mut t = T::up(false);
    let t0 = t.t;
    let cross = |t: &mut T, at: Instant, id| {
        t.d.wire_frame(at, frame(MAC, 1000));
        t.d.handle(
            at,
            Packet::new(id, bulk_out(framing::tx_transfer(&frame(MAC, 1000)))),
        );
        t.d.take_usb();
    };
    // MAC and link agree (full): traffic both ways at once is fine.
    cross(&mut t, t0, 10);
    assert_eq!(t.d.counters().duplex_collisions, 0);
    // The MAC set to half duplex on a full-duplex link.
    t.send(2, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0334, 0, 0, vec![]));
    let ms = Duration::from_millis;
    cross(&mut t, t0 + ms(10), 11);
    let c = t.d.counters().clone();
    assert_eq!((c.duplex_collisions, c.duplex_collision_drops), (1, 0));
    assert_eq!(c.tx_frames, 2, "counted, not lost, by default");
    // One way at a time: nothing collides.
    t.d.wire_frame(t.t + ms(20), frame(MAC, 1000));
    t.d.handle(
        t.t + ms(30),
        Packet::new(12, bulk_out(framing::tx_transfer(&frame(MAC, 1000)))),
    );
    assert_eq!(t.d.counters().duplex_collisions, 1);
    // Losing them: the TX frame that met the partner's is gone.
    t.d.set_duplex_mismatch(crate::nic::DuplexMismatch::Lose);
    cross(&mut t, t0 + ms(40), 13);
    let c = t.d.counters().clone();
    assert_eq!((c.duplex_collisions, c.duplex_collision_drops), (2, 1));
    assert_eq!(c.tx_frames, 3);
    // MEDIUM 0 (no link programmed) is no mismatch.
    t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0, 0, 0, vec![]));
    cross(&mut t, t0 + ms(50), 14);
    assert_eq!(t.d.counters().duplex_collisions, 2);
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
    let big: Vec<u8> = one.iter().copied().cycle().take(one.len() * 2760).collect();
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
    let big: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
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

#[test]
fn rx_room_follows_the_rx_queue_bound() {
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
    t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0336, 0, 0, vec![]));
    assert!(t.d.rx_room());
    t.d.wire_frame(t0, frame(MAC, 60));
    assert!(t.d.rx_room());
    t.d.wire_frame(t0, frame(MAC, 60));
    assert!(!t.d.rx_room(), "two frames fill a two-frame queue");
    t.d.wire_frame(t0, frame(MAC, 60));
    assert_eq!(t.d.counters().rx_overflow, 1);
    t.send(4, bulk_in(2048));
    assert!(t.d.rx_room());
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
fn impairment_capture_and_autoneg_settings_take_effect() {
    let mut t = T::up(false);
    t.d.set_impair(ImpairConfig {
        loss: 0.25,
        seed: 9,
        ..Default::default()
    });
    assert_eq!(
        (t.d.impair_config().loss, t.d.impair_config().seed),
        (0.25, 9)
    );
    let p = std::env::temp_dir().join(format!("ax-dev-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&p);
    t.d.pcap_start(&p).unwrap();
    assert_eq!(t.d.pcap_path(), Some(p.as_path()));
    t.d.set_impair(ImpairConfig::default());
    t.d.wire_frame(t.t, frame(MAC, 60));
    assert_eq!(t.d.pcap_stop().unwrap(), 1);
    assert_eq!(t.d.pcap_path(), None);
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 24 + 16 + 60);
    std::fs::remove_file(&p).unwrap();
    t.d.set_autoneg_delay(Duration::from_secs(2));
    t.d.set_partner(t.t, crate::phy::Partner::default());
    assert_eq!(t.d.phy().state(), crate::phy::PhyState::Autoneg);
    assert_eq!(t.d.poll(t.t), Some(t.t + Duration::from_secs(2)));
    assert_eq!(t.d.config().autoneg, Duration::from_secs(2));
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
fn frame_length_bounds_on_both_paths() {
    let mut t = T::up(false);
    for len in [13, 1519] {
        t.d.wire_frame(t.t, frame(MAC, len));
    }
    assert_eq!(t.d.counters().rx_length_errors, 2);
    for len in [14, 1518] {
        t.d.wire_frame(t.t, frame(MAC, len));
    }
    assert_eq!(
        t.d.counters().rx_length_errors,
        2,
        "14 and 1518 bytes are frames"
    );
    t.send(1, bulk_in(2048));
    t.send(2, bulk_in(2048));
    assert_eq!(t.d.counters().rx_frames, 2);
    // A TX frame over 1518 bytes is an error, not a frame.
    let mut data = framing::header(1600).to_vec();
    data.extend(vec![0u8; 1600]);
    t.send(3, bulk_out(data));
    assert_eq!(t.d.counters().tx_errors, 1);
    assert!(t.d.take_wire().is_empty());
}

#[test]
fn a_delayed_wire_keeps_each_frames_own_latency() {
    let mut t = T::up(false);
    ctl(
        &mut t,
        r#"{"cmd":"impair","latency_us":1000,"direction":"tx"}"#,
    );
    t.send(1, bulk_out(framing::tx_transfer(&frame(MAC, 60))));
    t.t += Duration::from_micros(500);
    t.send(2, bulk_out(framing::tx_transfer(&frame(MAC, 61))));
    t.d.poll(t.t + Duration::from_micros(500));
    assert_eq!(
        t.d.take_wire().len(),
        1,
        "only the first is through at 1 ms"
    );
    t.d.poll(t.t + Duration::from_micros(999));
    assert!(t.d.take_wire().is_empty());
    t.d.poll(t.t + Duration::from_micros(1000));
    assert_eq!(t.d.take_wire()[0].len(), 61);
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
