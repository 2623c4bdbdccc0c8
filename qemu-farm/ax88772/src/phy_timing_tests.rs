//! Tests of the PHY's timed states: the reset and power-up times, the
//! autonegotiation time and its jitter, and when a reset starts.

use super::tests::phy;
use super::*;
use proptest::prelude::*;

/// A PHY with the given reset and power-up times, autonegotiating in 0 ms.
fn timed(reset_ms: u64, powerup_ms: u64) -> (Phy, Instant) {
    let (mut p, t) = phy();
    p.set_timing(Timing {
        reset: Duration::from_millis(reset_ms),
        powerup: Duration::from_millis(powerup_ms),
    });
    (p, t)
}

#[test]
fn bmcr_reset_reads_one_for_the_reset_time_and_drops_writes_meanwhile() {
    let (mut p, t) = timed(10, 0);
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, 0x8200);
    assert_eq!(p.read(reg::BMCR), 0x3100 | bmcr::RESET);
    assert!(!p.link_up(), "no link during the reset");
    assert_eq!(
        p.read(reg::ADVERTISE),
        0x01e1,
        "registers are at their defaults"
    );
    // A driver that does not wait: its writes are lost.
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, 0x0100);
    assert_eq!(p.next_event(), Some(t + Duration::from_millis(10)));
    p.set_time(t + Duration::from_millis(9));
    assert_ne!(p.read(reg::BMCR) & bmcr::RESET, 0);
    p.set_time(t + Duration::from_millis(10));
    assert_eq!(
        p.read(reg::BMCR),
        0x3100,
        "self-cleared, the writes did not stick"
    );
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1);
    assert!(p.link_up());
    assert!(!p.snapshot().resetting);
}

#[test]
fn a_released_phy_is_unreachable_until_it_has_powered_up() {
    let (mut p, t) = timed(0, 10);
    p.set_held_in_reset(true);
    assert!(!p.reachable());
    assert_eq!(p.read(reg::PHYSID1), 0xffff);
    p.write(reg::VENDOR_14, 0x1234);
    p.set_held_in_reset(false);
    assert_eq!(p.read(reg::PHYSID1), 0xffff, "powering up");
    assert!(!p.link_up());
    p.set_time(t + Duration::from_millis(10));
    assert!(p.reachable());
    assert_eq!(p.read(reg::PHYSID1), 0x003b);
    assert_eq!(
        p.read(reg::VENDOR_14),
        0x442c,
        "the write while held was dropped"
    );
    assert!(p.link_up());
    // Held again while powering up: the power-up starts over at the release.
    p.set_held_in_reset(true);
    p.set_held_in_reset(false);
    p.set_time(t + Duration::from_millis(19));
    assert_eq!(p.read(reg::BMSR), 0xffff);
    p.set_time(t + Duration::from_millis(20));
    assert_ne!(p.read(reg::BMSR), 0xffff);
}

#[test]
fn a_power_on_reset_ends_any_reset_or_power_up_at_once() {
    let (mut p, _) = timed(100, 100);
    p.write(reg::BMCR, bmcr::RESET);
    p.power_on_reset();
    assert_eq!(p.read(reg::BMCR), 0x3100);
    p.set_held_in_reset(true);
    p.set_held_in_reset(false);
    p.power_on_reset();
    assert!(p.reachable());
}

#[test]
fn a_reset_clears_the_latched_link_drop() {
    let (mut p, _) = phy();
    p.set_carrier(false);
    p.set_carrier(true);
    // The drop is latched until BMSR is read; a reset starts it over.
    assert!(p.link_up());
    p.write(reg::BMCR, bmcr::RESET);
    assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
}

#[test]
fn anrestart_drops_the_link_for_the_autonegotiation_time() {
    let (mut p, t) = phy();
    p.set_autoneg_delay(Duration::from_millis(1500));
    assert!(p.link_up());
    p.write(reg::BMCR, 0x1200);
    assert!(!p.link_up());
    assert_eq!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
    p.set_time(t + Duration::from_millis(1500));
    assert!(p.link_up());
}

#[test]
fn autonegotiation_starts_over_when_a_reset_or_a_power_up_ends() {
    let ms = Duration::from_millis;
    // A BMCR reset of 100 ms, then 1.5 s of autonegotiation.
    let (mut p, t) = timed(100, 0);
    p.set_autoneg_delay(ms(1500));
    p.write(reg::BMCR, bmcr::RESET);
    p.set_time(t + ms(100));
    assert_eq!(p.read(reg::BMCR) & bmcr::RESET, 0, "the reset is over");
    assert!(!p.link_up(), "negotiating from the reset's end");
    p.set_time(t + ms(1599));
    assert!(!p.link_up());
    p.set_time(t + ms(1600));
    assert!(p.link_up());
    // Released from SW_RESET: 100 ms of power-up, then 1.5 s again.
    let (mut p, t) = timed(0, 100);
    p.set_autoneg_delay(ms(1500));
    p.set_held_in_reset(true);
    p.set_held_in_reset(false);
    p.set_time(t + ms(100));
    assert!(p.reachable());
    assert!(!p.link_up(), "negotiating from the power-up's end");
    p.set_time(t + ms(1600));
    assert!(p.link_up());
}

#[test]
fn timing_and_autoneg_bounds_name_their_field() {
    let ms = Duration::from_millis;
    let t = |r, u| Timing {
        reset: ms(r),
        powerup: ms(u),
    };
    assert_eq!(t(500, 1000).check(), Ok(()));
    assert_eq!(
        t(501, 0).check(),
        Err("reset_ms must be at most 500".into())
    );
    assert_eq!(
        t(0, 1001).check(),
        Err("powerup_ms must be at most 1000".into())
    );
    assert_eq!(check_autoneg(ms(10_000)), Ok(()));
    assert_eq!(
        check_autoneg(ms(10_001)),
        Err("autoneg_ms must be at most 10000".into())
    );
}

proptest! {
    /// Any MDIO traffic at any time during resets and power-ups: no panic,
    /// and an unreachable PHY always reads 0xffff.
    #[test]
    fn misusing_the_timed_states_never_panics(
        ops in proptest::collection::vec((0u8..6, 0u8..40, any::<u16>(), 0u64..30), 0..200),
    ) {
        let (mut p, t) = timed(10, 10);
        let mut now = t;
        for (op, r, v, dt) in ops {
            now += Duration::from_millis(dt);
            p.set_time(now);
            match op {
                0 => { let _ = p.read(r); }
                1 => p.write(r, v),
                2 => p.set_held_in_reset(v & 1 == 1),
                3 => p.write(reg::BMCR, v | bmcr::RESET),
                4 => { let _ = p.next_event(); }
                _ => p.power_on_reset(),
            }
            if !p.reachable() {
                prop_assert_eq!(p.read(reg::PHYSID1), 0xffff);
            }
        }
    }
}

#[test]
fn the_phy_resets_only_when_the_reset_bit_goes_from_0_to_1() {
    let (mut p, _) = phy();
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, bmcr::RESET);
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1, "the first reset is taken");
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, bmcr::RESET | bmcr::ANENABLE);
    assert_eq!(
        p.read(reg::ADVERTISE),
        0x0041,
        "RESET written 1 twice: no reset"
    );
    assert_eq!(
        p.read(reg::BMCR) & bmcr::ANENABLE,
        bmcr::ANENABLE,
        "the other bits are taken"
    );
    // As ax88796b's soft reset does: BMCR 0, then RESET.
    p.write(reg::BMCR, 0);
    p.write(reg::BMCR, bmcr::RESET | bmcr::ANRESTART);
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1);
    // SW_RESET's hold resets the register, and with it the bit.
    p.write(reg::ADVERTISE, 0x0041);
    p.set_held_in_reset(true);
    p.set_held_in_reset(false);
    p.write(reg::ADVERTISE, 0x0041);
    p.write(reg::BMCR, bmcr::RESET);
    assert_eq!(p.read(reg::ADVERTISE), 0x01e1);
}

#[test]
fn autonegotiation_time_is_jittered_within_its_range_and_follows_the_seed() {
    let (mut p, t) = phy();
    p.set_autoneg_delay(Duration::from_millis(1500));
    p.set_autoneg_jitter(Duration::from_millis(1500), 7);
    let mut now = t;
    let mut took = Vec::new();
    for _ in 0..20 {
        p.set_time(now);
        p.write(reg::BMCR, 0x1200);
        assert!(!p.link_up());
        let done = p.next_event().expect("autonegotiation pending");
        took.push(done - now);
        p.set_time(done);
        assert!(p.link_up());
        now = done;
    }
    let (lo, hi) = (Duration::from_millis(1500), Duration::from_millis(3000));
    assert!(took.iter().all(|d| *d >= lo && *d <= hi), "{took:?}");
    assert!(took.iter().any(|d| *d != took[0]), "jittered: {took:?}");
    let again = {
        let (mut p, t) = phy();
        p.set_autoneg_delay(Duration::from_millis(1500));
        p.set_autoneg_jitter(Duration::from_millis(1500), 7);
        let mut now = t;
        (0..20)
            .map(|_| {
                p.set_time(now);
                p.write(reg::BMCR, 0x1200);
                let done = p.next_event().expect("pending");
                p.set_time(done);
                let d = done - now;
                now = done;
                d
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(took, again, "the same seed, the same times");
}
