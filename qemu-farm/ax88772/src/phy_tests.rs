//! Tests of the PHY's registers and negotiation: identity and power-on
//! values, resets, latched bits, autonegotiation and forced modes, the
//! quirks; the link partner's LPA in `phy_partner_tests.rs`, the timed
//! states in `phy_timing_tests.rs`.

use super::*;
use proptest::prelude::*;

pub(super) fn phy() -> (Phy, Instant) {
    let t = Instant::now();
    (Phy::new(PHY_ID_AX88772A, t), t)
}

#[test]
fn identity_and_power_on_values() {
    let (mut p, _) = phy();
    assert_eq!(p.read(reg::PHYSID1), 0x003b);
    assert_eq!(p.read(reg::PHYSID2), 0x1861);
    assert_eq!(p.read(reg::BMCR), 0x3100);
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1);
    assert_eq!(p.read(reg::BMSR), 0x782d);
    assert_eq!(p.read(reg::BMSR) & 0x0100, 0, "ESTATEN must stay 0");
    assert_eq!(p.read(reg::LPA), 0x45e1);
    assert_eq!(p.read(reg::VENDOR_14), 0x442c);
    assert_eq!(p.read(reg::VENDOR_15), 0x03c8);
    assert_eq!(p.read(reg::VENDOR_16), 0x4044);
    assert_eq!(p.state(), PhyState::LinkUp);
}

#[test]
fn reset_bit_self_clears_and_restores_defaults() {
    let (mut p, _) = phy();
    p.write(reg::ADVERTISE, 0x0de1);
    p.write(reg::BMCR, 0x3900);
    assert_eq!(p.state(), PhyState::LinkDown);
    p.write(reg::BMCR, 0x8200);
    assert_eq!(p.read(reg::BMCR) & bmcr::RESET, 0);
    assert_eq!(p.read(reg::BMCR), 0x3100);
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1);
    assert!(p.link_up());
}

#[test]
fn anrestart_self_clears() {
    let (mut p, _) = phy();
    p.write(reg::BMCR, 0x3300);
    assert_eq!(p.read(reg::BMCR) & bmcr::ANRESTART, 0);
    assert_eq!(p.read(reg::BMCR), 0x3100);
}

#[test]
fn link_status_is_latched_low() {
    let (mut p, _) = phy();
    assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
    p.set_carrier(false);
    p.set_carrier(true);
    assert!(p.link_up());
    assert_eq!(
        p.read(reg::BMSR) & bmsr::LSTATUS,
        0,
        "first read shows the drop"
    );
    assert_ne!(
        p.read(reg::BMSR) & bmsr::LSTATUS,
        0,
        "second read shows the link"
    );
    assert_eq!(p.snapshot().link_downs, 1);
}

/// What Linux's ax88796b (C and Rust) does on entering NOLINK
/// (`link_change_notify`): `phy_init_hw` (BMCR 0, BMCR RESET|ANRESTART,
/// poll until RESET clears) and `_phy_start_aneg` (ADVERTISE, restart).
pub(super) fn linux_link_change_notify(p: &mut Phy) {
    p.write(reg::BMCR, 0);
    p.read(reg::BMCR);
    p.write(reg::BMCR, 0x8200);
    // genphy_soft_reset polls for at most 600 ms.
    let start = p.now();
    let mut t = start;
    while p.read(reg::BMCR) & bmcr::RESET != 0 {
        assert!(
            t - start < Duration::from_millis(600),
            "BMCR.RESET set after 600 ms"
        );
        t += Duration::from_millis(50);
        p.set_time(t);
    }
    p.write(reg::ADVERTISE, 0x0de1);
    p.read(reg::BMSR);
    p.write(reg::BMCR, 0x3300);
}

#[test]
fn lpa_follows_partner() {
    let (mut p, _) = phy();
    p.set_partner(Partner {
        pause: false,
        ..Partner::default()
    });
    assert_eq!(p.read(reg::LPA), 0x41e1);
    p.set_partner(Partner {
        modes: vec![LinkMode::Full10, LinkMode::Half10],
        ..Partner::default()
    });
    // The retrain dropped the link; Linux resets the PHY for fresh LPA.
    assert_eq!(p.read(reg::BMSR) & bmsr::LSTATUS, 0, "the drop shows");
    p.write(reg::BMCR, 0);
    p.write(reg::BMCR, 0x8200);
    assert_eq!(p.read(reg::LPA), 0x4461);
    assert_eq!(p.read(reg::BMCR), 0x1100, "BMCR shows the resolved 10/full");
    let s = p.snapshot();
    assert_eq!(
        (s.speed, s.full_duplex, s.pause),
        (Some(10), Some(true), false)
    );
    p.write(reg::ADVERTISE, 0x0de1); // what Linux advertises
    p.write(reg::BMCR, 0x3300);
    assert!(p.snapshot().pause, "pause needs both sides");
}

#[test]
fn a_new_advertisement_waits_for_an_autoneg_restart() {
    let (mut p, _) = phy();
    assert_eq!(p.snapshot().speed, Some(100));
    p.write(reg::ADVERTISE, 0x0061); // 10 only, no restart
    assert_eq!(p.read(reg::ADVERTISE), 0x0061, "the register reads back");
    assert_eq!(p.snapshot().speed, Some(100), "the link keeps its result");
    p.write(reg::BMCR, bmcr::ANENABLE | bmcr::ANRESTART);
    assert_eq!(p.snapshot().speed, Some(10));
}

#[test]
fn registers_above_31_do_not_alias() {
    let (mut p, _) = phy();
    p.set_carrier(false);
    p.set_carrier(true);
    // BMSR's link status is latched low; register 33 (33 & 31 == BMSR)
    // must neither read it nor clear the latch.
    assert_eq!(p.read(33), 0xffff);
    assert_eq!(p.read(reg::BMSR) & bmsr::LSTATUS, 0, "still latched");
    p.write(32, bmcr::RESET | bmcr::PDOWN);
    assert!(!p.snapshot().powered_down);
    assert!(p.snapshot().mdio_writes.is_empty());
}

#[test]
fn advertise_limits_the_result() {
    let (mut p, _) = phy();
    p.write(reg::ADVERTISE, 0x0061); // 10 only
    p.write(reg::BMCR, 0x3300);
    assert_eq!(p.snapshot().speed, Some(10));
    p.write(reg::ADVERTISE, 0x0001); // nothing in common
    p.write(reg::BMCR, 0x3300);
    assert_eq!(p.state(), PhyState::LinkDown);
    assert!(p.snapshot().autoneg_complete);
}

#[test]
fn forced_speed_and_duplex() {
    let (mut p, _) = phy();
    p.write(reg::BMCR, bmcr::FULLDPLX); // 10/full, autoneg off
    let s = p.snapshot();
    assert_eq!(
        (s.state, s.speed, s.full_duplex),
        (PhyState::LinkUp, Some(10), Some(true))
    );
    assert_eq!(p.read(reg::LPA), 0);
    p.set_partner(Partner {
        autoneg: false,
        modes: vec![LinkMode::Full100],
        ..Partner::default()
    });
    assert_eq!(
        p.state(),
        PhyState::LinkDown,
        "forced 10 against forced 100"
    );
    p.write(reg::BMCR, bmcr::SPEED100);
    assert_eq!(p.snapshot().speed, Some(100));
    assert_eq!(p.snapshot().full_duplex, Some(false));
}

#[test]
fn a_mode_change_under_a_live_link_shows_as_a_latched_drop() {
    // Linux (phylib polling) reads BMSR once while the link is up: only the
    // latched-low status tells it to reprogram the MAC for the new mode.
    let (mut p, _) = phy();
    assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
    let (ups, downs) = (p.snapshot().link_ups, p.snapshot().link_downs);
    p.write(reg::BMCR, 0x0000); // forced 10/half
    assert!(p.link_up());
    assert_eq!(
        p.read(reg::BMSR) & bmsr::LSTATUS,
        0,
        "the retrain is latched"
    );
    assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
    let s = p.snapshot();
    assert_eq!((s.speed, s.full_duplex), (Some(10), Some(false)));
    assert_eq!((s.link_ups, s.link_downs), (ups + 1, downs + 1));
    // Writing the same mode again is no change.
    p.write(reg::BMCR, 0x0000);
    assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
}

#[test]
fn parallel_detection_gives_half_duplex() {
    let (mut p, _) = phy();
    p.set_partner(Partner {
        autoneg: false,
        modes: vec![LinkMode::Full100],
        ..Partner::default()
    });
    let s = p.snapshot();
    assert_eq!((s.speed, s.full_duplex, s.lpa), (Some(100), Some(false), 0));
}

#[test]
fn autoneg_takes_time() {
    let (mut p, t0) = phy();
    p.set_autoneg_delay(Duration::from_millis(1500));
    p.write(reg::BMCR, 0x3300);
    assert_eq!(p.state(), PhyState::Autoneg);
    assert_eq!(p.read(reg::BMSR) & (bmsr::LSTATUS | bmsr::ANEGCOMPLETE), 0);
    assert_eq!(p.next_event(), Some(t0 + Duration::from_millis(1500)));
    p.set_time(t0 + Duration::from_millis(1499));
    assert_eq!(p.state(), PhyState::Autoneg);
    p.set_time(t0 + Duration::from_millis(1500));
    assert_eq!(p.state(), PhyState::LinkUp);
}

#[test]
fn quirk_lpa_zero() {
    let (mut p, _) = phy();
    p.set_quirks(Quirks {
        lpa_zero: true,
        ..Quirks::default()
    });
    assert!(p.link_up());
    assert_eq!(p.read(reg::LPA), 0);
}

#[test]
fn quirk_reset_after_link_loss() {
    let (mut p, _) = phy();
    p.set_quirks(Quirks {
        reset_after_link_loss: true,
        ..Quirks::default()
    });
    p.set_carrier(false);
    p.set_carrier(true);
    assert_eq!(p.state(), PhyState::LinkDown);
    assert!(p.snapshot().needs_reset);
    p.write(reg::BMCR, 0x3300);
    assert_eq!(
        p.state(),
        PhyState::LinkDown,
        "an aneg restart is not enough"
    );
    p.write(reg::BMCR, 0x8200);
    assert!(p.link_up());
}

#[test]
fn power_down_and_mac_reset() {
    let (mut p, _) = phy();
    p.write(reg::BMCR, 0x3900);
    assert_eq!(p.state(), PhyState::LinkDown);
    assert!(p.snapshot().powered_down);
    p.write(reg::BMCR, 0x3100);
    assert!(p.link_up());
    p.set_held_in_reset(true);
    assert_eq!(p.state(), PhyState::Reset);
    p.set_held_in_reset(false);
    assert!(p.link_up());
}

#[test]
fn release_from_reset_negotiates_again_with_the_reset_advertisement() {
    let (mut p, _) = phy();
    // 10/Full only, negotiated.
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, 0x1200);
    assert_eq!(p.snapshot().speed, Some(10));
    // The reset restores ADVERTISE; the release negotiates with it: 100/Full.
    p.set_held_in_reset(true);
    assert_eq!(p.snapshot().advertise, 0x01e1);
    assert_eq!(p.read(reg::ADVERTISE), 0xffff, "unreachable while held");
    p.set_held_in_reset(false);
    assert!(p.link_up());
    assert_eq!(p.snapshot().speed, Some(100));
    // Negotiation starts at the release, not when the reset began: with a
    // 1 s autonegotiation, a PHY held for 2 s is not up until 1 s after.
    let (mut p, t) = phy();
    p.set_autoneg_delay(Duration::from_secs(1));
    p.set_time(t + Duration::from_secs(2));
    assert!(p.link_up());
    p.set_held_in_reset(true);
    p.set_time(t + Duration::from_secs(4));
    p.set_held_in_reset(false);
    p.set_time(t + Duration::from_millis(4500));
    assert!(!p.link_up(), "up 0.5 s after the release");
    p.set_time(t + Duration::from_millis(5100));
    assert!(p.link_up());
}

#[test]
fn cable_fault_drops_link() {
    let (mut p, _) = phy();
    p.set_cable(Cable {
        state: CableState::Open,
        distance_m: 12.0,
    });
    assert_eq!(p.state(), PhyState::LinkDown);
    assert!(!p.snapshot().carrier);
    p.set_cable(Cable::default());
    assert!(p.link_up());
}

#[test]
fn unknown_and_read_only_writes_are_ignored() {
    let (mut p, _) = phy();
    p.write(0x1f, 0x1234);
    assert_eq!(p.read(0x1f), 0);
    p.write(reg::PHYSID1, 0xffff);
    assert_eq!(p.read(reg::PHYSID1), 0x003b);
    p.write(reg::BMSR, 0);
    assert_eq!(p.read(reg::BMSR), 0x782d);
    p.write(reg::BMCR, 0x3140); // 1000M bit
    assert_eq!(p.read(reg::BMCR), 0x3100);
    let s = p.snapshot();
    assert_eq!(s.mdio_writes.get("0x1f"), Some(&1));
    assert_eq!(s.mdio_reads.get("0x01"), Some(&1));
}

#[test]
fn mmd_indirect_reads_zero() {
    let (mut p, _) = phy();
    p.write(reg::MMD_CTRL, 0x0003);
    p.write(reg::MMD_DATA, 0x0014);
    p.write(reg::MMD_CTRL, 0x4003);
    assert_eq!(p.read(reg::MMD_DATA), 0);
    p.write(reg::MMD_CTRL, 0x0003);
    assert_eq!(p.read(reg::MMD_DATA), 0x0014);
}

#[test]
fn loopback_reports_link_without_carrier() {
    let (mut p, _) = phy();
    p.set_carrier(false);
    p.write(reg::BMCR, bmcr::LOOPBACK | bmcr::SPEED100 | bmcr::FULLDPLX);
    assert!(p.link_up());
    assert!(p.loopback());
}

proptest! {
    #[test]
    fn random_mdio_traffic_never_panics(ops in proptest::collection::vec((any::<bool>(), any::<u8>(), any::<u16>()), 0..200)) {
        let (mut p, t0) = phy();
        p.set_autoneg_delay(Duration::from_millis(3));
        for (i, (write, r, v)) in ops.into_iter().enumerate() {
            p.set_time(t0 + Duration::from_millis(i as u64));
            if write { p.write(r, v) } else { p.read(r); }
            prop_assert_eq!(p.read(reg::BMCR) & (bmcr::RESET | bmcr::ANRESTART), 0);
            prop_assert_eq!(p.read(reg::BMSR) & 0x0100, 0);
            prop_assert_eq!(p.read(reg::PHYSID2), 0x1861);
        }
    }
}

#[test]
fn expansion_says_whether_the_partner_negotiated() {
    let (mut p, _) = phy();
    assert!(p.link_up());
    assert_eq!(p.read(reg::EXPANSION), 1, "partner autonegotiated");
    p.set_partner(Partner {
        autoneg: false,
        ..Partner::default()
    });
    assert_eq!(
        p.read(reg::EXPANSION),
        1,
        "the old partner's page until a PHY reset"
    );
    linux_link_change_notify(&mut p);
    assert_eq!(p.read(reg::EXPANSION), 0, "partner forced");
}

#[test]
fn vendor_registers_keep_what_is_written() {
    let (mut p, _) = phy();
    for (r, v) in [
        (reg::VENDOR_14, 0x1111),
        (reg::VENDOR_15, 0x2222),
        (reg::VENDOR_16, 0x3333),
    ] {
        p.write(r, v);
        assert_eq!(p.read(r), v, "register {r:#x}");
    }
}

#[test]
fn each_bmcr_write_that_starts_negotiation_does_so_alone() {
    // With a 1 s negotiation, a write that restarts it takes the link down
    // for a second; other writes leave the link up.
    let (mut p, t) = phy();
    p.set_autoneg_delay(Duration::from_secs(1));
    let mut now = t + Duration::from_secs(2);
    p.set_time(now);
    assert!(p.link_up());
    let mut restarts = |p: &mut Phy, val: u16| {
        p.write(reg::BMCR, val);
        now += Duration::from_millis(100);
        p.set_time(now);
        let down = !p.link_up();
        now += Duration::from_secs(2);
        p.set_time(now);
        down
    };
    assert!(!restarts(&mut p, 0x3100), "same value: no restart");
    assert!(restarts(&mut p, 0x3300), "ANRESTART alone");
    assert!(
        !restarts(&mut p, 0x2100),
        "autoneg off: forced 100/Full, no restart"
    );
    assert!(restarts(&mut p, 0x3100), "autoneg switched on");
    p.write(reg::BMCR, 0x3900);
    assert!(restarts(&mut p, 0x3100), "power-up");
}

#[test]
fn a_forced_mode_reads_back_as_written() {
    let (mut p, _) = phy();
    for forced in [0x2100, 0x0100, 0x0000] {
        p.write(reg::BMCR, forced);
        assert_eq!(p.read(reg::BMCR), forced, "BMCR {forced:#06x}");
    }
}

#[test]
fn a_power_on_reset_restores_what_the_driver_changed() {
    let (mut p, _) = phy();
    p.write(reg::BMCR, 0x4100);
    p.write(reg::ADVERTISE, 0x0061);
    p.set_held_in_reset(true);
    p.write(reg::BMCR, 0x4100);
    p.power_on_reset();
    let s = p.snapshot();
    assert!(!s.held_in_reset);
    assert_eq!((s.bmcr, s.advertise), (0x3100, 0x01e1));
}

#[test]
fn resetting_the_counters_forgets_every_register_access() {
    let (mut p, _) = phy();
    p.read(reg::BMSR);
    p.write(reg::ADVERTISE, 0x01e1);
    assert!(!p.snapshot().mdio_reads.is_empty());
    p.reset_counters();
    let s = p.snapshot();
    assert!(s.mdio_reads.is_empty() && s.mdio_writes.is_empty(), "{s:?}");
}

#[test]
fn every_link_up_after_a_drop_is_counted() {
    let (mut p, _) = phy();
    for n in 1..=3 {
        p.set_carrier(false);
        assert!(!p.link_up());
        p.set_carrier(true);
        p.write(reg::BMCR, 0x2100); // forced: up without waiting for autoneg
        let s = p.snapshot();
        assert!(s.link, "cycle {n}");
        assert_eq!((s.link_ups, s.link_downs), (n, n), "cycle {n}");
    }
}

#[test]
fn releasing_a_phy_that_is_not_held_changes_nothing() {
    let (mut p, _) = phy();
    p.write(reg::ADVERTISE, 0x0061);
    let before = p.snapshot();
    p.set_held_in_reset(false);
    let s = p.snapshot();
    assert_eq!(s.advertise, 0x0061, "registers kept");
    assert!(s.link && !s.held_in_reset);
    assert_eq!(
        (s.link_ups, s.link_downs),
        (before.link_ups, before.link_downs),
        "no autoneg restart"
    );
}

#[test]
fn the_mmd_control_register_reads_back() {
    let (mut p, _) = phy();
    p.write(reg::MMD_CTRL, 0x0007);
    assert_eq!(p.read(reg::MMD_CTRL), 0x0007);
}
