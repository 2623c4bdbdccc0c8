//! Tests of the PHY and the link as the driver meets them over USB: MDIO
//! access and its faults, limited partners, isolate, a duplex mismatch,
//! and frames without a link.

use super::*;

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
fn mdio_registers_above_31_read_ffff_over_usb() {
    let mut t = T::up(false);
    let out = t.send(1, ctrl(0xc0, cmd::READ_MII_REG, 0x10, 0x21, 2, vec![]));
    let Message::ControlPacket(c) = &out[0].msg else {
        panic!("control reply")
    };
    assert_eq!(c.data, [0xff, 0xff]);
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
fn bmcr_isolate_keeps_the_link_and_passes_no_data() {
    let mut t = T::up(false);
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

/// Let time pass (1 ms steps, at most 4 s) until the link is up.
fn until_link_up(t: &mut T) {
    for _ in 0..4000 {
        t.t += Duration::from_millis(1);
        t.d.poll(t.t);
        if t.d.phy().link_up() {
            return;
        }
    }
    panic!("no link: {:?}", t.d.phy().snapshot());
}

#[test]
fn ends_of_different_duplexes_collide_where_the_full_duplex_end_sends_into_the_other() {
    let mut t = T::up(false);
    let ms = Duration::from_millis;
    // Two frames cross, ours first or the partner's; the collisions so far.
    let cross = |t: &mut T, id, ours_first: bool| {
        let at = t.t;
        let f = framing::tx_transfer(&frame(MAC, 1000));
        if !ours_first {
            t.d.wire_frame(at, frame(MAC, 1000));
        }
        t.d.handle(at, Packet::new(id, bulk_out(f)));
        if ours_first {
            t.d.wire_frame(at, frame(MAC, 1000));
        }
        t.d.take_usb();
        t.t += ms(10);
        t.d.poll(t.t);
        t.d.counters().wire_duplex_collisions
    };
    let ours_first = |t: &mut T, id| cross(t, id, true);
    let theirs_first = |t: &mut T, id| cross(t, id, false);
    // Both ends autonegotiated 100/full: nothing collides.
    let p = t.d.phy().snapshot();
    assert_eq!(
        (p.full_duplex, p.partner_full_duplex),
        (Some(true), Some(true))
    );
    assert_eq!((ours_first(&mut t, 10), theirs_first(&mut t, 11)), (0, 0));
    // The PHY forced to 100/full against a partner that autonegotiates:
    // the partner detects 100 Mbit/s and runs half duplex. Our frame sent
    // into the partner's is a late collision there; the partner defers to
    // ours when it hears it first.
    mdio_write(&mut t, 20, 0, 0x2100);
    until_link_up(&mut t);
    let p = t.d.phy().snapshot();
    assert_eq!(
        (p.full_duplex, p.partner_full_duplex),
        (Some(true), Some(false))
    );
    assert_eq!(ours_first(&mut t, 30), 0, "the partner deferred");
    assert_eq!(theirs_first(&mut t, 31), 1);
    let c = t.d.counters().clone();
    assert_eq!((c.duplex_collisions, c.duplex_collision_drops), (0, 0));
    assert_eq!(c.tx_frames, 4, "counted, not lost, by default");
    // The PHY autonegotiating against a partner forced to 100/full: the PHY
    // detects 100 Mbit/s at half duplex (and the MAC follows it). Now the
    // partner's frame sent into ours collides.
    ctl(
        &mut t,
        r#"{"cmd":"partner","autoneg":false,"modes":["100full"]}"#,
    );
    mdio_write(&mut t, 40, 0, 0x3200);
    t.send(42, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0x0304, 0, 0, vec![]));
    t.t += ms(20);
    until_link_up(&mut t);
    let p = t.d.phy().snapshot();
    assert_eq!(
        (p.full_duplex, p.partner_full_duplex),
        (Some(false), Some(true))
    );
    assert_eq!(theirs_first(&mut t, 50), 1, "we deferred");
    assert_eq!(ours_first(&mut t, 51), 2);
    // Lost with --duplex-mismatch lose.
    t.d.set_duplex_mismatch(crate::nic::DuplexMismatch::Lose);
    assert_eq!(ours_first(&mut t, 52), 3);
    assert_eq!(t.d.counters().duplex_collision_drops, 1);
    assert_eq!(
        t.d.counters().duplex_collisions,
        0,
        "the MAC follows the PHY"
    );
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
    // The partner's frame arriving while ours is on the wire collides too.
    let at = t0 + ms(15);
    t.d.handle(
        at,
        Packet::new(15, bulk_out(framing::tx_transfer(&frame(MAC, 1000)))),
    );
    t.d.wire_frame(at, frame(MAC, 1000));
    t.d.take_usb();
    assert_eq!(t.d.counters().duplex_collisions, 2);
    // One way at a time: nothing collides.
    t.d.wire_frame(t.t + ms(20), frame(MAC, 1000));
    t.d.handle(
        t.t + ms(30),
        Packet::new(12, bulk_out(framing::tx_transfer(&frame(MAC, 1000)))),
    );
    assert_eq!(t.d.counters().duplex_collisions, 2);
    // Losing them: the TX frame that met the partner's is gone.
    t.d.set_duplex_mismatch(crate::nic::DuplexMismatch::Lose);
    cross(&mut t, t0 + ms(40), 13);
    let c = t.d.counters().clone();
    assert_eq!((c.duplex_collisions, c.duplex_collision_drops), (3, 1));
    assert_eq!(c.tx_frames, 4);
    // MEDIUM 0 (no link programmed) is no mismatch.
    t.send(3, ctrl(0x40, cmd::WRITE_MEDIUM_MODE, 0, 0, 0, vec![]));
    cross(&mut t, t0 + ms(50), 14);
    assert_eq!(t.d.counters().duplex_collisions, 3);
}
