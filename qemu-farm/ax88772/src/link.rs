//! The link state machine of the PHY: carrier and cable, the link
//! partner and its quirks, autonegotiation timing, and the resulting state
//! (reset, autoneg, link up, link down). The register file (`phy`) feeds
//! it the control bits it reads ([`Controls`]) and shows its outcome.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

use crate::log_i;
use crate::mii::{adv, bmcr};

/// A 10/100 link mode, in the order of preference of autonegotiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkMode {
    #[serde(rename = "10half")]
    Half10,
    #[serde(rename = "10full")]
    Full10,
    #[serde(rename = "100half")]
    Half100,
    #[serde(rename = "100full")]
    Full100,
}

impl LinkMode {
    pub const ALL: [LinkMode; 4] = [
        LinkMode::Full100,
        LinkMode::Half100,
        LinkMode::Full10,
        LinkMode::Half10,
    ];

    pub(crate) fn adv_bit(self) -> u16 {
        match self {
            LinkMode::Half10 => adv::HALF10,
            LinkMode::Full10 => adv::FULL10,
            LinkMode::Half100 => adv::HALF100,
            LinkMode::Full100 => adv::FULL100,
        }
    }

    pub fn speed(self) -> u16 {
        match self {
            LinkMode::Half10 | LinkMode::Full10 => 10,
            LinkMode::Half100 | LinkMode::Full100 => 100,
        }
    }

    pub fn full_duplex(self) -> bool {
        matches!(self, LinkMode::Full10 | LinkMode::Full100)
    }

    pub(crate) fn from_parts(speed100: bool, full: bool) -> LinkMode {
        match (speed100, full) {
            (true, true) => LinkMode::Full100,
            (true, false) => LinkMode::Half100,
            (false, true) => LinkMode::Full10,
            (false, false) => LinkMode::Half10,
        }
    }
}

/// What the far end of the cable does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Partner {
    /// Partner autonegotiates; otherwise it is forced to its best mode.
    pub autoneg: bool,
    pub modes: Vec<LinkMode>,
    pub pause: bool,
    pub asym_pause: bool,
}

impl Default for Partner {
    fn default() -> Self {
        Partner {
            autoneg: true,
            modes: LinkMode::ALL.to_vec(),
            pause: true,
            asym_pause: false,
        }
    }
}

impl Partner {
    pub(crate) fn best(&self) -> Option<LinkMode> {
        self.modes.iter().copied().max()
    }

    pub(crate) fn lpa(&self) -> u16 {
        let mut v = adv::CSMA | adv::LPACK;
        for m in &self.modes {
            v |= m.adv_bit();
        }
        if self.pause {
            v |= adv::PAUSE;
        }
        if self.asym_pause {
            v |= adv::ASYM;
        }
        v
    }
}

/// Partner and PHY behaviours some drivers work around.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quirks {
    /// LPA reads 0 even after autonegotiation completed.
    pub lpa_zero: bool,
    /// After the link is lost, it only comes back after a BMCR reset.
    pub reset_after_link_loss: bool,
    /// The AX88772A erratum Linux's ax88796b works around in
    /// `asix_ax88772a_link_change_notify` ("Reset PHY, otherwise MII_LPA
    /// will provide outdated information"): once the link was lost on the
    /// line, LPA (and EXPANSION's partner-negotiates bit) keep the partner
    /// page of the link before, whatever the next autonegotiation
    /// exchanged, until a PHY reset (BMCR.RESET, SW_RESET, a power-on).
    /// On by default, as on the chip.
    pub stale_lpa: bool,
}

impl Default for Quirks {
    fn default() -> Self {
        Quirks {
            lpa_zero: false,
            reset_after_link_loss: false,
            stale_lpa: true,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CableState {
    #[default]
    Ok,
    Open,
    Short,
}

/// The cable between the PHY and the partner. Open or short: no carrier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cable {
    pub state: CableState,
    /// Distance to the fault in metres (0 for a good cable).
    #[serde(default)]
    pub distance_m: f64,
}

/// Lifecycle of the PHY.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhyState {
    /// Held in reset or powered down by the MAC (SW_RESET IPRL=0 / IPPD=1).
    Reset,
    /// Autonegotiation running.
    Autoneg,
    LinkUp,
    /// No link: no carrier, BMCR power-down, no common mode, or a partner
    /// quirk waiting for a reset.
    LinkDown,
}

/// Outcome of the link state machine at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) state: PhyState,
    pub(crate) mode: Option<LinkMode>,
    pub(crate) pause: bool,
    pub(crate) an_complete: bool,
}

/// The register bits the state machine depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Controls {
    pub bmcr: u16,
    /// ADVERTISE, taken in when autonegotiation starts over.
    pub adv: u16,
    pub held_in_reset: bool,
}

pub struct Link {
    pub(crate) carrier: bool,
    pub(crate) cable: Cable,
    pub(crate) partner: Partner,
    pub(crate) quirks: Quirks,
    pub(crate) autoneg_delay: Duration,
    /// Each autonegotiation takes `autoneg_delay` plus a seeded draw in
    /// [0, jitter].
    pub(crate) autoneg_jitter: Duration,
    rng: crate::impair::Rng,
    an_done_at: Instant,
    now: Instant,
    pub(crate) last: Status,
    carrier_seen: bool,
    /// BMSR's latched-low link status (cleared by reading BMSR).
    pub(crate) latched_down: bool,
    pub(crate) needs_reset: bool,
    pub(crate) link_ups: u64,
    pub(crate) link_downs: u64,
    /// ADVERTISE as autonegotiation last (re)started with it: a new
    /// advertisement takes effect only with a restart, as on the chip.
    adv_neg: u16,
    /// The partner page LPA holds (0: none, as with parallel detection);
    /// `None` until an autonegotiation completes after a PHY reset.
    lpa_reg: Option<u16>,
    /// The link was lost on the line since `lpa_reg` was taken: with
    /// [`Quirks::stale_lpa`], no later autonegotiation refreshes it until
    /// a PHY reset.
    lpa_frozen: bool,
}

impl Link {
    pub fn new(now: Instant, c: Controls) -> Link {
        let mut l = Link {
            carrier: true,
            cable: Cable::default(),
            partner: Partner::default(),
            quirks: Quirks::default(),
            autoneg_delay: Duration::ZERO,
            autoneg_jitter: Duration::ZERO,
            rng: crate::impair::Rng::new(0),
            an_done_at: now,
            now,
            last: Status {
                state: PhyState::LinkDown,
                mode: None,
                pause: false,
                an_complete: false,
            },
            carrier_seen: true,
            latched_down: false,
            needs_reset: false,
            link_ups: 0,
            link_downs: 0,
            adv_neg: adv::DEFAULT,
            lpa_reg: None,
            lpa_frozen: false,
        };
        l.last = l.compute(c);
        l
    }

    /// A PHY reset (BMCR.RESET, SW_RESET, power-on): LPA takes the partner
    /// page of the next autonegotiation again.
    pub(crate) fn phy_reset(&mut self) {
        self.lpa_reg = None;
        self.lpa_frozen = false;
    }

    /// The partner page the line delivers now (0: the partner does not
    /// autonegotiate).
    fn partner_page(&self) -> u16 {
        if self.partner.autoneg {
            self.partner.lpa()
        } else {
            0
        }
    }

    /// Advance the clock (never backwards).
    pub fn set_time(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Jitter of the autonegotiation time, drawn from `seed`.
    pub fn set_autoneg_jitter(&mut self, jitter: Duration, seed: u64) {
        self.autoneg_jitter = jitter;
        self.rng = crate::impair::Rng::new(seed);
    }

    /// The model's current time.
    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn carrier_present(&self) -> bool {
        self.carrier && self.cable.state == CableState::Ok
    }

    /// Start autonegotiation over, advertising `adv`.
    pub fn restart(&mut self, adv: u16) {
        let j = self.autoneg_jitter.as_micros() as u64;
        let extra = if j == 0 {
            0
        } else {
            self.rng.next_u64() % (j + 1)
        };
        self.an_done_at = self.now + self.autoneg_delay + Duration::from_micros(extra);
        self.adv_neg = adv;
    }

    pub(crate) fn compute(&self, c: Controls) -> Status {
        let down = |state| Status {
            state,
            mode: None,
            pause: false,
            an_complete: false,
        };
        if c.held_in_reset {
            return down(PhyState::Reset);
        }
        if c.bmcr & bmcr::PDOWN != 0 {
            return down(PhyState::LinkDown);
        }
        let forced =
            LinkMode::from_parts(c.bmcr & bmcr::SPEED100 != 0, c.bmcr & bmcr::FULLDPLX != 0);
        if c.bmcr & bmcr::LOOPBACK != 0 {
            let mode = Some(forced);
            return Status {
                state: PhyState::LinkUp,
                mode,
                pause: false,
                an_complete: false,
            };
        }
        if !self.carrier_present() || self.needs_reset {
            return down(PhyState::LinkDown);
        }
        if c.bmcr & bmcr::ANENABLE == 0 {
            let partner_ok = if self.partner.autoneg {
                self.partner
                    .modes
                    .iter()
                    .any(|m| m.speed() == forced.speed())
            } else {
                self.partner.best().map(|m| m.speed()) == Some(forced.speed())
            };
            if !partner_ok {
                return down(PhyState::LinkDown);
            }
            let mode = Some(forced);
            return Status {
                state: PhyState::LinkUp,
                mode,
                pause: false,
                an_complete: false,
            };
        }
        if self.now < self.an_done_at {
            return down(PhyState::Autoneg);
        }
        if self.partner.autoneg && self.partner.modes.is_empty() {
            // A partner that advertises nothing: autonegotiation never
            // completes.
            return down(PhyState::Autoneg);
        }
        if self.partner.autoneg {
            let common = LinkMode::ALL
                .into_iter()
                .find(|m| self.adv_neg & m.adv_bit() != 0 && self.partner.modes.contains(m));
            let Some(mode) = common else {
                return Status {
                    an_complete: true,
                    ..down(PhyState::LinkDown)
                };
            };
            let pause = mode.full_duplex() && self.adv_neg & adv::PAUSE != 0 && self.partner.pause;
            Status {
                state: PhyState::LinkUp,
                mode: Some(mode),
                pause,
                an_complete: true,
            }
        } else {
            // Parallel detection: the partner's speed, half duplex.
            let Some(best) = self.partner.best() else {
                return down(PhyState::LinkDown);
            };
            let mode = LinkMode::from_parts(best.speed() == 100, false);
            if self.adv_neg & mode.adv_bit() == 0 {
                return down(PhyState::LinkDown);
            }
            Status {
                state: PhyState::LinkUp,
                mode: Some(mode),
                pause: false,
                an_complete: true,
            }
        }
    }

    /// Run the state machine against the current controls and clock.
    pub fn update(&mut self, c: Controls) {
        let carrier = self.carrier_present();
        if carrier && !self.carrier_seen {
            // Link pulses appear: autonegotiation starts over.
            self.restart(c.adv);
        }
        self.carrier_seen = carrier;
        let st = self.compute(c);
        let was_up = self.last.state == PhyState::LinkUp;
        let is_up = st.state == PhyState::LinkUp;
        let retrained =
            was_up && is_up && (st.mode != self.last.mode || st.pause != self.last.pause);
        // A loss on the line (carrier, partner, renegotiation) of a link
        // that autonegotiation brought up; not one the MAC or the driver
        // caused by resetting, powering down or looping back the PHY.
        let on_line = st.state != PhyState::Reset && c.bmcr & (bmcr::PDOWN | bmcr::LOOPBACK) == 0;
        if (was_up && !is_up || retrained)
            && on_line
            && self.last.an_complete
            && self.lpa_reg.is_some()
            && self.quirks.stale_lpa
        {
            self.lpa_frozen = true;
        }
        if was_up && !is_up {
            self.link_downs += 1;
            self.latched_down = true;
            if self.quirks.reset_after_link_loss && !carrier {
                self.needs_reset = true;
            }
            log_i!("phy: link down ({:?})", st.state);
        } else if retrained {
            // A PHY whose speed, duplex or pause changes under a live link
            // (forced mode written, partner changed) retrains: the link drops
            // and returns, and the latched-low status shows the drop. Linux
            // relies on that to reprogram the MAC (phylink mac_link_up);
            // without it the MAC keeps the old medium mode.
            self.link_downs += 1;
            self.link_ups += 1;
            self.latched_down = true;
            if let Some(m) = st.mode {
                let d = if m.full_duplex() { "full" } else { "half" };
                log_i!("phy: link retrained at {}/{d}", m.speed());
            }
        } else if !was_up && is_up {
            self.link_ups += 1;
            if let Some(m) = st.mode {
                let d = if m.full_duplex() { "full" } else { "half" };
                log_i!(
                    "phy: link up {}/{d}{}",
                    m.speed(),
                    if st.pause { " pause" } else { "" }
                );
            }
        }
        if st.an_complete && !(self.lpa_frozen && self.lpa_reg.is_some()) {
            self.lpa_reg = Some(self.partner_page());
        }
        self.last = st;
    }

    /// The partner page the PHY's registers report: the one taken at the
    /// last autonegotiation, or with [`Quirks::stale_lpa`] after a link
    /// loss, the one from before it until a PHY reset.
    fn page_shown(&self) -> u16 {
        match self.lpa_reg {
            Some(v) if self.quirks.stale_lpa => v,
            _ => self.partner_page(),
        }
    }

    /// LPA as the register holds it: 0 until autonegotiation completes.
    pub fn lpa_value(&self) -> u16 {
        if !self.last.an_complete || self.quirks.lpa_zero {
            return 0;
        }
        self.page_shown()
    }

    /// EXPANSION bit 0: the partner page LPA holds came from a partner
    /// that autonegotiates.
    pub fn lp_autoneg_able(&self) -> bool {
        self.last.an_complete && self.page_shown() != 0
    }

    pub fn state(&self) -> PhyState {
        self.last.state
    }

    /// When the state machine next changes by itself (autoneg finishing).
    pub fn next_event(&self) -> Option<Instant> {
        (self.last.state == PhyState::Autoneg && self.an_done_at > self.now)
            .then_some(self.an_done_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Register bits as IEEE 802.3 clause 22 numbers them.
    const BMCR_SPEED100: u16 = 0x2000;
    const BMCR_ANENABLE: u16 = 0x1000;
    const BMCR_FULLDPLX: u16 = 0x0100;
    const ADV_CSMA: u16 = 0x0001;
    const ADV_10: u16 = 0x0020 | 0x0040;
    const ADV_100HALF: u16 = 0x0080;

    fn partner(autoneg: bool, modes: &[LinkMode]) -> Partner {
        Partner {
            autoneg,
            modes: modes.to_vec(),
            ..Partner::default()
        }
    }

    /// The link's state right after autonegotiation (re)started with `c`.
    fn status(p: Partner, c: Controls) -> Status {
        let now = Instant::now();
        let mut l = Link::new(now, c);
        l.partner = p;
        l.restart(c.adv);
        l.compute(c)
    }

    fn controls(bmcr: u16, adv: u16) -> Controls {
        Controls {
            bmcr,
            adv,
            held_in_reset: false,
        }
    }

    #[test]
    fn the_autonegotiation_jitter_reaches_the_top_of_its_range() {
        // The range itself is phy::timing_tests' to check; here its top is
        // drawn too: a jitter of 1 µs gives 0 or 1 µs.
        let now = Instant::now();
        let an = controls(BMCR_ANENABLE, ADV_CSMA | ADV_10);
        let delay = Duration::from_millis(1500);
        let mut l = Link::new(now, an);
        l.autoneg_delay = delay;
        l.set_autoneg_jitter(Duration::from_micros(1), 7);
        let mut extra = std::collections::BTreeSet::new();
        for _ in 0..32 {
            l.restart(an.adv);
            extra.insert((l.an_done_at - now - delay).as_micros());
        }
        assert_eq!(extra.into_iter().collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_partner_changed_while_the_phy_was_powered_down_is_read_afresh() {
        // A power-down is the driver's doing, not a loss on the line: the
        // stale-LPA erratum does not freeze the partner's page for it.
        let now = Instant::now();
        let an = controls(BMCR_ANENABLE, ADV_CSMA | ADV_10 | ADV_100HALF | 0x0100);
        let mut l = Link::new(now, an);
        l.partner = partner(true, &[LinkMode::Full100]);
        l.update(an);
        l.update(an);
        assert_eq!(l.lpa_value(), l.partner.lpa());
        let pdown = controls(an.bmcr | bmcr::PDOWN, an.adv);
        l.update(pdown);
        assert_ne!(l.state(), PhyState::LinkUp);
        l.partner = partner(true, &[LinkMode::Full10]);
        l.update(pdown);
        l.restart(an.adv);
        l.update(an);
        assert_eq!(l.state(), PhyState::LinkUp);
        assert_eq!(
            l.lpa_value(),
            l.partner.lpa(),
            "the old partner's page is shown"
        );
    }

    #[test]
    fn a_partner_advertising_asymmetric_pause_says_so_in_lpa() {
        let p = Partner {
            autoneg: true,
            modes: vec![LinkMode::Full100],
            pause: true,
            asym_pause: true,
        };
        // LPACK, ASYM, PAUSE, 100FULL, CSMA.
        assert_eq!(p.lpa(), 0x4000 | 0x0800 | 0x0400 | 0x0100 | 0x0001);
    }

    #[test]
    fn pause_is_negotiated_only_at_full_duplex() {
        const ADV_PAUSE: u16 = 0x0400;
        let an = controls(BMCR_ANENABLE, ADV_CSMA | ADV_100HALF | ADV_PAUSE);
        let half = status(partner(true, &[LinkMode::Half100]), an);
        assert_eq!(
            (half.state, half.mode, half.pause),
            (PhyState::LinkUp, Some(LinkMode::Half100), false),
            "both offer pause, but a half-duplex link has none"
        );
        let an_full = controls(BMCR_ANENABLE, ADV_CSMA | 0x0100 | ADV_PAUSE);
        let full = status(partner(true, &[LinkMode::Full100]), an_full);
        assert_eq!((full.mode, full.pause), (Some(LinkMode::Full100), true));
    }

    #[test]
    fn a_forced_speed_links_only_with_a_partner_offering_that_speed() {
        let forced100 = controls(BMCR_SPEED100 | BMCR_FULLDPLX, ADV_CSMA | ADV_10);
        let up = status(partner(true, &[LinkMode::Half100]), forced100);
        assert_eq!(
            (up.state, up.mode),
            (PhyState::LinkUp, Some(LinkMode::Full100))
        );
        let down = status(partner(true, &[LinkMode::Full10]), forced100);
        assert_eq!(down.state, PhyState::LinkDown);
    }

    #[test]
    fn parallel_detection_needs_the_partners_speed_in_our_advertisement() {
        let forced_partner = partner(false, &[LinkMode::Full100]);
        let an = |adv| controls(BMCR_ANENABLE, adv);
        let up = status(forced_partner.clone(), an(ADV_CSMA | ADV_100HALF));
        assert_eq!(
            (up.state, up.mode),
            (PhyState::LinkUp, Some(LinkMode::Half100)),
            "parallel detection gives half duplex"
        );
        let down = status(forced_partner, an(ADV_CSMA | ADV_10));
        assert_eq!(down.state, PhyState::LinkDown);
    }
}
