//! The internal 10/100 PHY as a clause-22 register file. The link state
//! machine behind it (carrier, partner, autonegotiation) is `link`.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use crate::link::{Cable, CableState, Controls, Link, LinkMode, Partner, PhyState, Quirks};
use crate::log_w;

/// MDIO address of the embedded PHY (`AX_EMBD_PHY_ADDR`).
pub const PHY_ADDR: u8 = 0x10;
/// PHY identifier of the AX88772A's PHY.
pub const PHY_ID_AX88772A: u32 = 0x003b_1861;
/// PHY identifier listed by Linux for the AX88772C.
pub const PHY_ID_AX88772C: u32 = 0x003b_1881;

pub use crate::mii::{adv, bmcr, bmsr, reg};

const VENDOR_DEFAULTS: [u16; 3] = [0x442c, 0x03c8, 0x4044];

/// Longest BMCR reset accepted (IEEE 802.3 22.2.4.1.1: reset completes
/// within 0.5 s).
pub const MAX_RESET: Duration = Duration::from_millis(500);
/// Longest power-up delay accepted after SW_RESET releases the PHY.
pub const MAX_POWERUP: Duration = Duration::from_millis(1000);
/// Longest autonegotiation time accepted (802.3's break-link and
/// autonegotiation timers add up to well under this).
pub const MAX_AUTONEG: Duration = Duration::from_millis(10_000);

/// How long the PHY is busy after a reset or a power-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Timing {
    /// BMCR.RESET reads 1 this long after it was written; meanwhile
    /// writes are dropped and the link is down.
    #[serde(serialize_with = "ser_ms")]
    pub reset: Duration,
    /// After SW_RESET releases the PHY (IPRL=1, IPPD=0), it stays
    /// unreachable (reads 0xffff, writes dropped) this long.
    #[serde(serialize_with = "ser_ms")]
    pub powerup: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Timing {
    /// Instant reset and power-up.
    pub const INSTANT: Timing = Timing {
        reset: Duration::ZERO,
        powerup: Duration::ZERO,
    };

    /// Refuse values past the bounds, naming the field.
    pub fn check(&self) -> Result<(), String> {
        if self.reset > MAX_RESET {
            return Err(format!(
                "reset_ms must be at most {}",
                MAX_RESET.as_millis()
            ));
        }
        if self.powerup > MAX_POWERUP {
            return Err(format!(
                "powerup_ms must be at most {}",
                MAX_POWERUP.as_millis()
            ));
        }
        Ok(())
    }
}

/// Refuse an autonegotiation time past [`MAX_AUTONEG`], naming the field.
pub fn check_autoneg(d: Duration) -> Result<(), String> {
    if d > MAX_AUTONEG {
        return Err(format!(
            "autoneg_ms must be at most {}",
            MAX_AUTONEG.as_millis()
        ));
    }
    Ok(())
}

/// Everything a test may want to assert on, without side effects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhySnapshot {
    pub state: PhyState,
    pub phy_id: u32,
    pub link: bool,
    pub speed: Option<u16>,
    pub full_duplex: Option<bool>,
    /// The partner's duplex while the link is up (it differs from
    /// `full_duplex` on a mismatched link).
    pub partner_full_duplex: Option<bool>,
    pub pause: bool,
    pub autoneg_complete: bool,
    pub bmcr: u16,
    pub bmsr: u16,
    pub advertise: u16,
    pub lpa: u16,
    pub carrier: bool,
    pub powered_down: bool,
    pub held_in_reset: bool,
    /// BMCR.RESET still reads 1.
    pub resetting: bool,
    /// MDIO reaches the PHY (not held in reset, not powering up).
    pub reachable: bool,
    pub timing: Timing,
    pub loopback: bool,
    pub needs_reset: bool,
    pub cable: Cable,
    pub partner: Partner,
    pub quirks: Quirks,
    pub autoneg_ms: u64,
    pub autoneg_jitter_ms: u64,
    pub link_ups: u64,
    pub link_downs: u64,
    /// MDIO reads and writes per register ("0x01" -> count).
    pub mdio_reads: BTreeMap<String, u64>,
    pub mdio_writes: BTreeMap<String, u64>,
}

pub struct Phy {
    id: u32,
    bmcr: u16,
    adv: u16,
    vendor: [u16; 3],
    mmd_ctrl: u16,
    mmd_addr: u16,
    held_in_reset: bool,
    timing: Timing,
    /// A BMCR reset in progress ends then.
    reset_until: Option<Instant>,
    /// Released by SW_RESET, the PHY answers from then.
    powerup_until: Option<Instant>,
    /// RESET as last written to BMCR: the PHY resets only when the bit
    /// goes from 0 to 1 (Linux's ax88796b writes BMCR 0 first for this).
    reset_written: bool,
    link: Link,
    reads: [u64; 32],
    writes: [u64; 32],
}

impl Phy {
    pub fn new(id: u32, now: Instant) -> Phy {
        let c = Controls {
            bmcr: bmcr::DEFAULT,
            adv: adv::DEFAULT,
            held_in_reset: false,
        };
        Phy {
            id,
            bmcr: bmcr::DEFAULT,
            adv: adv::DEFAULT,
            vendor: VENDOR_DEFAULTS,
            mmd_ctrl: 0,
            mmd_addr: 0,
            held_in_reset: false,
            timing: Timing::INSTANT,
            reset_until: None,
            powerup_until: None,
            reset_written: false,
            link: Link::new(now, c),
            reads: [0; 32],
            writes: [0; 32],
        }
    }

    fn controls(&self) -> Controls {
        Controls {
            bmcr: self.bmcr,
            adv: self.adv,
            held_in_reset: self.held_in_reset || self.busy(),
        }
    }

    /// A reset or power-up still running.
    fn busy(&self) -> bool {
        self.resetting() || self.powering_up()
    }

    fn resetting(&self) -> bool {
        self.reset_until.is_some_and(|t| self.link.now() < t)
    }

    fn powering_up(&self) -> bool {
        self.powerup_until.is_some_and(|t| self.link.now() < t)
    }

    /// MDIO reaches the PHY: not held in reset by SW_RESET, not powering up.
    pub fn reachable(&self) -> bool {
        !self.held_in_reset && !self.powering_up()
    }

    fn update(&mut self) {
        // A reset or power-up that is over: autonegotiation starts now.
        let now = self.link.now();
        let over = |t: &mut Option<Instant>| {
            let done = t.is_some_and(|t| now >= t);
            if done {
                *t = None;
            }
            done
        };
        let a = over(&mut self.reset_until);
        let b = over(&mut self.powerup_until);
        if a || b {
            self.restart_aneg();
        }
        let c = self.controls();
        self.link.update(c);
    }

    pub fn set_timing(&mut self, t: Timing) {
        self.timing = t;
    }

    pub fn timing(&self) -> Timing {
        self.timing
    }

    fn restart_aneg(&mut self) {
        self.link.restart(self.adv);
    }

    /// Advance the model's clock and run the link state machine.
    pub fn set_time(&mut self, now: Instant) {
        self.link.set_time(now);
        self.update();
    }

    /// The model's current time.
    pub fn now(&self) -> Instant {
        self.link.now()
    }

    /// The link state machine (read-only).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Restore power-on register values (BMCR reset, SW_RESET, USB reset).
    fn reset_registers(&mut self) {
        self.bmcr = bmcr::DEFAULT;
        self.adv = adv::DEFAULT;
        self.vendor = VENDOR_DEFAULTS;
        self.mmd_ctrl = 0;
        self.mmd_addr = 0;
        self.link.needs_reset = false;
        self.link.phy_reset();
        // The latched-low link status starts over with the registers.
        self.link.latched_down = false;
        self.restart_aneg();
    }

    /// Power-on reset (the whole adapter was reset or replugged).
    pub fn power_on_reset(&mut self) {
        self.held_in_reset = false;
        self.reset_until = None;
        self.powerup_until = None;
        self.reset_written = false;
        self.reset_registers();
        self.update();
    }

    /// SW_RESET: hold the PHY in reset (IPRL=0 or IPPD=1) or release it.
    pub fn set_held_in_reset(&mut self, held: bool) {
        if held && !self.held_in_reset {
            self.reset_registers();
            self.reset_written = false;
        }
        if !held && self.held_in_reset {
            self.restart_aneg();
            if !self.timing.powerup.is_zero() {
                self.powerup_until = Some(self.link.now() + self.timing.powerup);
            }
        }
        if held {
            self.powerup_until = None;
        }
        self.held_in_reset = held;
        self.update();
    }

    fn bmcr_value(&self) -> u16 {
        if self.resetting() {
            return self.bmcr | bmcr::RESET;
        }
        let mut v = self.bmcr;
        if self.bmcr & bmcr::ANENABLE != 0 {
            if let (PhyState::LinkUp, Some(m)) = (self.link.last.state, self.link.last.mode) {
                v &= !(bmcr::SPEED100 | bmcr::FULLDPLX);
                if m.speed() == 100 {
                    v |= bmcr::SPEED100;
                }
                if m.full_duplex() {
                    v |= bmcr::FULLDPLX;
                }
            }
        }
        v
    }

    fn bmsr_value(&self) -> u16 {
        let mut v = bmsr::BASE;
        if self.link.last.state == PhyState::LinkUp && !self.link.latched_down {
            v |= bmsr::LSTATUS;
        }
        if self.link.last.an_complete {
            v |= bmsr::ANEGCOMPLETE;
        }
        v
    }

    fn lpa_value(&self) -> u16 {
        self.link.lpa_value()
    }

    fn peek(&self, r: u8) -> u16 {
        match r {
            reg::BMCR => self.bmcr_value(),
            reg::BMSR => self.bmsr_value(),
            reg::PHYSID1 => (self.id >> 16) as u16,
            reg::PHYSID2 => self.id as u16,
            reg::ADVERTISE => self.adv,
            reg::LPA => self.lpa_value(),
            reg::EXPANSION => u16::from(self.link.lp_autoneg_able()),
            reg::MMD_CTRL => self.mmd_ctrl,
            reg::MMD_DATA if self.mmd_ctrl >> 14 == 0 => self.mmd_addr,
            reg::VENDOR_14 => self.vendor[0],
            reg::VENDOR_15 => self.vendor[1],
            reg::VENDOR_16 => self.vendor[2],
            _ => 0,
        }
    }

    /// MDIO read. BMSR reading clears the latched-low link status.
    /// Clause 22 has registers 0..31; nothing answers above (0xffff).
    pub fn read(&mut self, r: u8) -> u16 {
        if r > 31 {
            log_w!("phy: read of register {r:#x} (only 0..31 exist)");
            return 0xffff;
        }
        self.update();
        self.reads[r as usize] += 1;
        if !self.reachable() {
            // Held in reset or powering up: nothing drives MDIO's data line.
            return 0xffff;
        }
        let v = self.peek(r);
        if r == reg::BMSR {
            self.link.latched_down = false;
        }
        v
    }

    /// MDIO write. Read-only and unknown registers, and bits that do not
    /// exist, are logged and ignored.
    pub fn write(&mut self, r: u8, val: u16) {
        if r > 31 {
            log_w!("phy: write {val:#06x} to register {r:#x} ignored (only 0..31 exist)");
            return;
        }
        self.update();
        self.writes[r as usize] += 1;
        if !self.reachable() {
            log_w!("phy: write {val:#06x} to register {r:#04x} while the PHY is held in reset or powering up; dropped");
            return;
        }
        if self.resetting() {
            log_w!("phy: write {val:#06x} to register {r:#04x} during a BMCR reset; dropped");
            return;
        }
        match r {
            reg::BMCR => self.write_bmcr(val),
            reg::ADVERTISE => {
                if val & 0x001f != 0x0001 || val & !(adv::WRITABLE | 0x001f) != 0 {
                    log_w!(
                        "phy: ADVERTISE write {val:#06x}: only {:#06x} is used",
                        val & adv::WRITABLE
                    );
                }
                self.adv = (val & adv::WRITABLE) | adv::CSMA;
            }
            reg::MMD_CTRL => self.mmd_ctrl = val,
            reg::MMD_DATA => {
                if self.mmd_ctrl >> 14 == 0 {
                    self.mmd_addr = val;
                } else {
                    log_w!(
                        "phy: MMD {}.{} write {val:#06x} ignored",
                        self.mmd_ctrl & 0x1f,
                        self.mmd_addr
                    );
                }
            }
            reg::VENDOR_14 => self.vendor[0] = val,
            reg::VENDOR_15 => self.vendor[1] = val,
            reg::VENDOR_16 => self.vendor[2] = val,
            _ => log_w!("phy: write {val:#06x} to read-only or unknown register {r:#04x} ignored"),
        }
        self.update();
    }

    fn write_bmcr(&mut self, val: u16) {
        let toggled = !self.reset_written;
        self.reset_written = val & bmcr::RESET != 0;
        if val & bmcr::RESET != 0 && !toggled {
            log_w!("phy: BMCR write {val:#06x}: RESET was already written 1; no reset without a 0 first");
        }
        if val & bmcr::RESET != 0 && toggled {
            self.reset_registers();
            if !self.timing.reset.is_zero() {
                self.reset_until = Some(self.link.now() + self.timing.reset);
            }
            return;
        }
        if val & 0x007f != 0 {
            log_w!(
                "phy: BMCR write {val:#06x}: reserved/1000M bits {:#06x} ignored",
                val & 0x7f
            );
        }
        let old = self.bmcr;
        self.bmcr = val & bmcr::STORED;
        let an_on = self.bmcr & bmcr::ANENABLE != 0;
        let restart = val & bmcr::ANRESTART != 0
            || (an_on && old & bmcr::ANENABLE == 0)
            || (old & bmcr::PDOWN != 0 && self.bmcr & bmcr::PDOWN == 0);
        if restart {
            self.restart_aneg();
        }
    }

    pub fn state(&self) -> PhyState {
        self.link.last.state
    }

    pub fn link_up(&self) -> bool {
        self.link.last.state == PhyState::LinkUp
    }

    /// The link is up and negotiated PAUSE (full duplex, both ends
    /// advertising it): the partner honours the MAC's PAUSE frames.
    pub fn pause_negotiated(&self) -> bool {
        self.link_up() && self.link.last.pause
    }

    /// The duplex the link runs at, while it is up.
    pub fn full_duplex(&self) -> Option<bool> {
        match self.link.last.state {
            PhyState::LinkUp => self.link.last.mode.map(|m| m.full_duplex()),
            _ => None,
        }
    }

    /// The duplex the link partner runs at, while the link is up: the
    /// negotiated one when both ends autonegotiated, half duplex when it
    /// autonegotiates against a forced PHY (parallel detection), and its
    /// own best mode's when it is forced itself.
    pub fn partner_full_duplex(&self) -> Option<bool> {
        let ours = self.full_duplex()?;
        if self.loopback() {
            return None;
        }
        let p = &self.link.partner;
        if !p.autoneg {
            return p.best().map(|m| m.full_duplex());
        }
        Some(self.link.last.an_complete && ours)
    }

    /// BMCR.ISOLATE: the PHY keeps its link but passes no data to or
    /// from the MAC.
    pub fn isolated(&self) -> bool {
        self.bmcr & bmcr::ISOLATE != 0 && !self.held_in_reset
    }

    pub fn loopback(&self) -> bool {
        self.bmcr & bmcr::LOOPBACK != 0 && !self.held_in_reset
    }

    pub fn set_carrier(&mut self, up: bool) {
        self.link.carrier = up;
        self.update();
    }

    pub fn set_partner(&mut self, p: Partner) {
        self.link.partner = p;
        self.restart_aneg();
        self.update();
    }

    pub fn set_quirks(&mut self, q: Quirks) {
        self.link.quirks = q;
        self.update();
    }

    pub fn set_cable(&mut self, c: Cable) {
        self.link.cable = c;
        self.update();
    }

    pub fn set_autoneg_delay(&mut self, d: Duration) {
        self.link.autoneg_delay = d;
    }

    /// Each autonegotiation takes the delay plus a draw in [0, jitter]
    /// from a generator seeded with `seed`.
    pub fn set_autoneg_jitter(&mut self, jitter: Duration, seed: u64) {
        self.link.set_autoneg_jitter(jitter, seed);
    }

    /// When the state machine next changes by itself (a reset or
    /// power-up ending, autoneg finishing).
    pub fn next_event(&self) -> Option<Instant> {
        let now = self.link.now();
        [self.reset_until, self.powerup_until, self.link.next_event()]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
    }

    pub fn reset_counters(&mut self) {
        self.reads = [0; 32];
        self.writes = [0; 32];
    }

    pub fn snapshot(&self) -> PhySnapshot {
        let per_reg = |a: &[u64; 32]| {
            a.iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(r, n)| (format!("{r:#04x}"), *n))
                .collect()
        };
        PhySnapshot {
            state: self.link.last.state,
            phy_id: self.id,
            link: self.link_up(),
            speed: self.link.last.mode.map(|m| m.speed()),
            full_duplex: self.link.last.mode.map(|m| m.full_duplex()),
            pause: self.link.last.pause,
            partner_full_duplex: self.partner_full_duplex(),
            autoneg_complete: self.link.last.an_complete,
            bmcr: self.bmcr_value(),
            bmsr: self.bmsr_value(),
            advertise: self.adv,
            lpa: self.lpa_value(),
            carrier: self.link.carrier_present(),
            powered_down: self.bmcr & bmcr::PDOWN != 0,
            held_in_reset: self.held_in_reset,
            resetting: self.resetting(),
            reachable: self.reachable(),
            timing: self.timing,
            loopback: self.loopback(),
            needs_reset: self.link.needs_reset,
            cable: self.link.cable,
            partner: self.link.partner.clone(),
            quirks: self.link.quirks,
            autoneg_ms: self.link.autoneg_delay.as_millis() as u64,
            autoneg_jitter_ms: self.link.autoneg_jitter.as_millis() as u64,
            link_ups: self.link.link_ups,
            link_downs: self.link.link_downs,
            mdio_reads: per_reg(&self.reads),
            mdio_writes: per_reg(&self.writes),
        }
    }
}

impl std::fmt::Debug for Phy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phy")
            .field("state", &self.link.last.state)
            .field("bmcr", &self.bmcr)
            .finish()
    }
}

#[cfg(test)]
#[path = "phy_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "phy_partner_tests.rs"]
mod partner_tests;

#[cfg(test)]
#[path = "phy_timing_tests.rs"]
mod timing_tests;
