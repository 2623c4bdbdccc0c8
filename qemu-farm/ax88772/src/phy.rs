//! The internal 10/100 PHY as a clause-22 register file with a link state
//! machine (autonegotiation against a configurable link partner).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::{log_i, log_w};

/// MDIO address of the embedded PHY (`AX_EMBD_PHY_ADDR`).
pub const PHY_ADDR: u8 = 0x10;
/// PHY identifier of the AX88772A's PHY.
pub const PHY_ID_AX88772A: u32 = 0x003b_1861;
/// PHY identifier listed by Linux for the AX88772C.
pub const PHY_ID_AX88772C: u32 = 0x003b_1881;

pub mod reg {
    pub const BMCR: u8 = 0x00;
    pub const BMSR: u8 = 0x01;
    pub const PHYSID1: u8 = 0x02;
    pub const PHYSID2: u8 = 0x03;
    pub const ADVERTISE: u8 = 0x04;
    pub const LPA: u8 = 0x05;
    pub const EXPANSION: u8 = 0x06;
    pub const CTRL1000: u8 = 0x09;
    pub const STAT1000: u8 = 0x0a;
    pub const MMD_CTRL: u8 = 0x0d;
    pub const MMD_DATA: u8 = 0x0e;
    pub const ESTATUS: u8 = 0x0f;
    pub const VENDOR_14: u8 = 0x14;
    pub const VENDOR_15: u8 = 0x15;
    pub const VENDOR_16: u8 = 0x16;
}

pub mod bmcr {
    pub const RESET: u16 = 0x8000;
    pub const LOOPBACK: u16 = 0x4000;
    pub const SPEED100: u16 = 0x2000;
    pub const ANENABLE: u16 = 0x1000;
    pub const PDOWN: u16 = 0x0800;
    pub const ISOLATE: u16 = 0x0400;
    pub const ANRESTART: u16 = 0x0200;
    pub const FULLDPLX: u16 = 0x0100;
    pub const COLTEST: u16 = 0x0080;
    /// Bits a write may set and that read back.
    pub const STORED: u16 = LOOPBACK | SPEED100 | ANENABLE | PDOWN | ISOLATE | FULLDPLX | COLTEST;
    pub const DEFAULT: u16 = SPEED100 | ANENABLE | FULLDPLX;
}

pub mod bmsr {
    pub const BASE: u16 = 0x7809;
    pub const LSTATUS: u16 = 0x0004;
    pub const ANEGCOMPLETE: u16 = 0x0020;
}

pub mod adv {
    pub const CSMA: u16 = 0x0001;
    pub const HALF10: u16 = 0x0020;
    pub const FULL10: u16 = 0x0040;
    pub const HALF100: u16 = 0x0080;
    pub const FULL100: u16 = 0x0100;
    pub const PAUSE: u16 = 0x0400;
    pub const ASYM: u16 = 0x0800;
    pub const LPACK: u16 = 0x4000;
    pub const WRITABLE: u16 = 0x0de0;
    pub const DEFAULT: u16 = 0x01e1;
}

const VENDOR_DEFAULTS: [u16; 3] = [0x442c, 0x03c8, 0x4044];

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

    fn adv_bit(self) -> u16 {
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

    fn from_parts(speed100: bool, full: bool) -> LinkMode {
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
    fn best(&self) -> Option<LinkMode> {
        self.modes.iter().copied().max()
    }

    fn lpa(&self) -> u16 {
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

/// Partner behaviours some drivers work around.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quirks {
    /// LPA reads 0 even after autonegotiation completed.
    pub lpa_zero: bool,
    /// After the link is lost, it only comes back after a BMCR reset.
    pub reset_after_link_loss: bool,
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

/// Everything a test may want to assert on, without side effects.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhySnapshot {
    pub state: PhyState,
    pub phy_id: u32,
    pub link: bool,
    pub speed: Option<u16>,
    pub full_duplex: Option<bool>,
    pub pause: bool,
    pub autoneg_complete: bool,
    pub bmcr: u16,
    pub bmsr: u16,
    pub advertise: u16,
    pub lpa: u16,
    pub carrier: bool,
    pub powered_down: bool,
    pub held_in_reset: bool,
    pub loopback: bool,
    pub needs_reset: bool,
    pub cable: Cable,
    pub partner: Partner,
    pub quirks: Quirks,
    pub autoneg_ms: u64,
    pub link_ups: u64,
    pub link_downs: u64,
    /// MDIO reads and writes per register ("0x01" -> count).
    pub mdio_reads: BTreeMap<String, u64>,
    pub mdio_writes: BTreeMap<String, u64>,
}

/// Outcome of the link state machine at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Status {
    state: PhyState,
    mode: Option<LinkMode>,
    pause: bool,
    an_complete: bool,
}

pub struct Phy {
    id: u32,
    bmcr: u16,
    adv: u16,
    /// ADVERTISE as autonegotiation last (re)started with it: a new
    /// advertisement takes effect only with a restart, as on the chip.
    adv_neg: u16,
    vendor: [u16; 3],
    mmd_ctrl: u16,
    mmd_addr: u16,
    held_in_reset: bool,
    carrier: bool,
    cable: Cable,
    partner: Partner,
    quirks: Quirks,
    autoneg_delay: Duration,
    an_done_at: Instant,
    now: Instant,
    last: Status,
    carrier_seen: bool,
    latched_down: bool,
    needs_reset: bool,
    link_ups: u64,
    link_downs: u64,
    reads: [u64; 32],
    writes: [u64; 32],
}

impl Phy {
    pub fn new(id: u32, now: Instant) -> Phy {
        let mut p = Phy {
            id,
            bmcr: bmcr::DEFAULT,
            adv: adv::DEFAULT,
            adv_neg: adv::DEFAULT,
            vendor: VENDOR_DEFAULTS,
            mmd_ctrl: 0,
            mmd_addr: 0,
            held_in_reset: false,
            carrier: true,
            cable: Cable::default(),
            partner: Partner::default(),
            quirks: Quirks::default(),
            autoneg_delay: Duration::ZERO,
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
            reads: [0; 32],
            writes: [0; 32],
        };
        p.last = p.compute();
        p
    }

    /// Advance the model's clock and run the link state machine.
    pub fn set_time(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
        self.update();
    }

    fn carrier_present(&self) -> bool {
        self.carrier && self.cable.state == CableState::Ok
    }

    fn restart_aneg(&mut self) {
        self.an_done_at = self.now + self.autoneg_delay;
        self.adv_neg = self.adv;
    }

    fn compute(&self) -> Status {
        let down = |state| Status {
            state,
            mode: None,
            pause: false,
            an_complete: false,
        };
        if self.held_in_reset {
            return down(PhyState::Reset);
        }
        if self.bmcr & bmcr::PDOWN != 0 {
            return down(PhyState::LinkDown);
        }
        let forced = LinkMode::from_parts(
            self.bmcr & bmcr::SPEED100 != 0,
            self.bmcr & bmcr::FULLDPLX != 0,
        );
        if self.bmcr & bmcr::LOOPBACK != 0 {
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
        if self.bmcr & bmcr::ANENABLE == 0 {
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

    fn update(&mut self) {
        let carrier = self.carrier_present();
        if carrier && !self.carrier_seen {
            // Link pulses appear: autonegotiation starts over.
            self.restart_aneg();
        }
        self.carrier_seen = carrier;
        let st = self.compute();
        let was_up = self.last.state == PhyState::LinkUp;
        let is_up = st.state == PhyState::LinkUp;
        if was_up && !is_up {
            self.link_downs += 1;
            self.latched_down = true;
            if self.quirks.reset_after_link_loss && !carrier {
                self.needs_reset = true;
            }
            log_i!("phy: link down ({:?})", st.state);
        } else if was_up && is_up && (st.mode != self.last.mode || st.pause != self.last.pause) {
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
        self.last = st;
    }

    /// Restore power-on register values (BMCR reset, SW_RESET, USB reset).
    fn reset_registers(&mut self) {
        self.bmcr = bmcr::DEFAULT;
        self.adv = adv::DEFAULT;
        self.vendor = VENDOR_DEFAULTS;
        self.mmd_ctrl = 0;
        self.mmd_addr = 0;
        self.needs_reset = false;
        self.restart_aneg();
    }

    /// Power-on reset (the whole adapter was reset or replugged).
    pub fn power_on_reset(&mut self) {
        self.held_in_reset = false;
        self.reset_registers();
        self.update();
    }

    /// SW_RESET: hold the PHY in reset (IPRL=0 or IPPD=1) or release it.
    pub fn set_held_in_reset(&mut self, held: bool) {
        if held && !self.held_in_reset {
            self.reset_registers();
        }
        if !held && self.held_in_reset {
            self.restart_aneg();
        }
        self.held_in_reset = held;
        self.update();
    }

    fn bmcr_value(&self) -> u16 {
        let mut v = self.bmcr;
        if self.bmcr & bmcr::ANENABLE != 0 {
            if let (PhyState::LinkUp, Some(m)) = (self.last.state, self.last.mode) {
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
        if self.last.state == PhyState::LinkUp && !self.latched_down {
            v |= bmsr::LSTATUS;
        }
        if self.last.an_complete {
            v |= bmsr::ANEGCOMPLETE;
        }
        v
    }

    fn lpa_value(&self) -> u16 {
        if !self.last.an_complete || self.quirks.lpa_zero || !self.partner.autoneg {
            return 0;
        }
        self.partner.lpa()
    }

    fn peek(&self, r: u8) -> u16 {
        match r {
            reg::BMCR => self.bmcr_value(),
            reg::BMSR => self.bmsr_value(),
            reg::PHYSID1 => (self.id >> 16) as u16,
            reg::PHYSID2 => self.id as u16,
            reg::ADVERTISE => self.adv,
            reg::LPA => self.lpa_value(),
            reg::EXPANSION => u16::from(self.last.an_complete && self.partner.autoneg),
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
        let v = self.peek(r);
        if r == reg::BMSR {
            self.latched_down = false;
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
        if val & bmcr::RESET != 0 {
            self.reset_registers();
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
        self.last.state
    }

    pub fn link_up(&self) -> bool {
        self.last.state == PhyState::LinkUp
    }

    pub fn loopback(&self) -> bool {
        self.bmcr & bmcr::LOOPBACK != 0 && !self.held_in_reset
    }

    pub fn set_carrier(&mut self, up: bool) {
        self.carrier = up;
        self.update();
    }

    pub fn set_partner(&mut self, p: Partner) {
        self.partner = p;
        self.restart_aneg();
        self.update();
    }

    pub fn set_quirks(&mut self, q: Quirks) {
        self.quirks = q;
        self.update();
    }

    pub fn set_cable(&mut self, c: Cable) {
        self.cable = c;
        self.update();
    }

    pub fn set_autoneg_delay(&mut self, d: Duration) {
        self.autoneg_delay = d;
    }

    /// When the state machine next changes by itself (autoneg finishing).
    pub fn next_event(&self) -> Option<Instant> {
        (self.last.state == PhyState::Autoneg && self.an_done_at > self.now)
            .then_some(self.an_done_at)
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
            state: self.last.state,
            phy_id: self.id,
            link: self.link_up(),
            speed: self.last.mode.map(|m| m.speed()),
            full_duplex: self.last.mode.map(|m| m.full_duplex()),
            pause: self.last.pause,
            autoneg_complete: self.last.an_complete,
            bmcr: self.bmcr_value(),
            bmsr: self.bmsr_value(),
            advertise: self.adv,
            lpa: self.lpa_value(),
            carrier: self.carrier_present(),
            powered_down: self.bmcr & bmcr::PDOWN != 0,
            held_in_reset: self.held_in_reset,
            loopback: self.loopback(),
            needs_reset: self.needs_reset,
            cable: self.cable,
            partner: self.partner.clone(),
            quirks: self.quirks,
            autoneg_ms: self.autoneg_delay.as_millis() as u64,
            link_ups: self.link_ups,
            link_downs: self.link_downs,
            mdio_reads: per_reg(&self.reads),
            mdio_writes: per_reg(&self.writes),
        }
    }
}

impl std::fmt::Debug for Phy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phy")
            .field("state", &self.last.state)
            .field("bmcr", &self.bmcr)
            .finish()
    }
}

#[cfg(test)]
#[path = "phy_tests.rs"]
mod tests;
