//! Tests of what the driver reads of the link partner: LPA across a link
//! loss (the stale-LPA erratum) and pause resolution.

use super::tests::{linux_link_change_notify, phy};
use super::*;

#[test]
fn the_stale_lpa_erratum_is_modelled_by_default() {
    assert!(Quirks::default().stale_lpa);
    let (p, _) = phy();
    assert!(p.snapshot().quirks.stale_lpa);
}

/// The partner of the next link: 10 Mbit/s only, no pause.
fn partner_10() -> Partner {
    Partner {
        modes: vec![LinkMode::Full10, LinkMode::Half10],
        pause: false,
        ..Partner::default()
    }
}

#[test]
fn after_a_link_loss_lpa_keeps_the_old_partner_until_a_phy_reset() {
    let (mut p, _) = phy();
    assert_eq!(p.read(reg::LPA), 0x45e1);
    p.set_carrier(false);
    assert_eq!(p.read(reg::LPA), 0, "no page while the link is down");
    p.set_partner(partner_10());
    p.set_carrier(true);
    assert!(p.link_up());
    assert_eq!(
        p.read(reg::BMCR),
        0x1100,
        "BMCR shows the link the PHY made: 10/full"
    );
    assert_eq!(p.read(reg::LPA), 0x45e1, "LPA still shows the old partner");
    p.write(reg::BMCR, 0x3300);
    assert_eq!(p.read(reg::LPA), 0x45e1, "a restart does not refresh it");
    p.write(reg::BMCR, 0);
    p.write(reg::BMCR, 0x8200);
    assert!(p.link_up());
    assert_eq!(p.read(reg::LPA), 0x4061, "fresh after BMCR.RESET");
}

#[test]
fn a_driver_that_resets_the_phy_on_link_loss_reads_the_new_partner() {
    for live in [false, true] {
        let t0 = Instant::now();
        let mut p = Phy::new(PHY_ID_AX88772A, t0);
        p.set_timing(crate::device::DEFAULT_PHY_TIMING);
        p.write(reg::ADVERTISE, 0x0de1);
        p.write(reg::BMCR, 0x3300);
        assert_eq!(p.read(reg::LPA), 0x45e1);
        if live {
            // The partner renegotiates under the live link.
            p.set_partner(partner_10());
        } else {
            p.set_carrier(false);
        }
        // Poll: BMSR shows the loss, phylib enters NOLINK.
        assert_eq!(p.read(reg::BMSR) & bmsr::LSTATUS, 0, "live {live}");
        linux_link_change_notify(&mut p);
        if !live {
            p.set_partner(partner_10());
            p.set_carrier(true);
        }
        p.read(reg::BMSR);
        assert_ne!(p.read(reg::BMSR) & bmsr::LSTATUS, 0, "live {live}");
        assert_eq!(p.read(reg::BMCR), 0x1100, "live {live}");
        assert_eq!(p.read(reg::LPA), 0x4061, "fresh, live {live}");
    }
}

#[test]
fn a_driver_that_skips_the_reset_reads_the_old_partner() {
    let (mut p, _) = phy();
    p.write(reg::ADVERTISE, 0x0de1);
    p.write(reg::BMCR, 0x3300);
    p.set_partner(partner_10());
    assert_eq!(p.read(reg::BMSR) & bmsr::LSTATUS, 0);
    // Only a new advertisement and an autonegotiation restart.
    p.write(reg::ADVERTISE, 0x0de1);
    p.write(reg::BMCR, 0x3300);
    assert!(p.link_up());
    assert_eq!(
        p.read(reg::LPA),
        0x45e1,
        "pause and 100 Mbit/s that are gone"
    );
    // Without the erratum LPA follows the new partner.
    p.set_quirks(Quirks {
        stale_lpa: false,
        ..Quirks::default()
    });
    assert_eq!(p.read(reg::LPA), 0x4061);
}

#[test]
fn a_power_down_or_a_mac_reset_is_no_link_loss_for_lpa() {
    let (mut p, _) = phy();
    // ifdown/ifup: BMCR.PDOWN with a new partner meanwhile.
    p.write(reg::BMCR, 0x3900);
    p.set_partner(partner_10());
    p.write(reg::BMCR, 0x3100);
    assert_eq!(p.read(reg::LPA), 0x4061);
    // SW_RESET holds the PHY while the partner changes.
    p.set_held_in_reset(true);
    p.set_partner(Partner::default());
    p.set_held_in_reset(false);
    assert_eq!(p.read(reg::LPA), 0x45e1);
}

#[test]
fn half_duplex_never_resolves_pause_at_either_speed() {
    // 802.3 Annex 28B: PAUSE is resolved only for a full-duplex link.
    for half in [LinkMode::Half100, LinkMode::Half10] {
        let (mut p, _) = phy();
        p.write(reg::ADVERTISE, 0x0de1);
        p.set_partner(Partner {
            modes: vec![half],
            pause: true,
            asym_pause: true,
            ..Partner::default()
        });
        linux_link_change_notify(&mut p);
        let s = p.snapshot();
        assert_eq!((s.link, s.full_duplex), (true, Some(false)), "{half:?}");
        assert!(
            !s.pause,
            "{half:?}: both offer pause, the link is half duplex"
        );
        assert_eq!(p.read(reg::LPA) & adv::PAUSE, adv::PAUSE, "{half:?}");
    }
}
