//! Tests of the wire's side of the device: impairment, latency and
//! jitter, the counters, and frame length bounds.

use super::*;

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
