//! How the emulated adapter is set up: [`DeviceConfig`] (variant, MAC, PHY,
//! pacing, queue depth, autonegotiation, link partner, quirks, how RX meets
//! bulk IN and what a duplex mismatch does), its JSON form and
//! [`format_mac`]. A leaf of the device model: `device` and `nic` both
//! read it, and it reads neither.

use serde::Serialize;
use std::time::Duration;

use crate::descriptors::Variant;
use crate::mac::Addr0;
use crate::phy::{Partner, Quirks, Timing};

/// How RX records meet bulk IN requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RxMode {
    /// As the chip's FIFO streams them: each request is filled with as many
    /// 16-bit words as it holds (up to 2048 bytes), so a record may start in
    /// one transfer and end in the next, its header included (split 2 + 2).
    /// Linux's `asix_rx_fixup_internal` reassembles such records.
    #[default]
    Stream,
    /// Whole records only; a request too short for the next record babbles
    /// and that frame is lost.
    Whole,
}

/// What a duplex mismatch (the MAC's MEDIUM.FD against the duplex the PHY
/// linked at) does to frames that overlap one coming the other way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DuplexMismatch {
    /// Counted as collisions (`duplex_collisions`); frames still pass.
    #[default]
    Count,
    /// Counted, and the frame is lost, as the half-duplex side aborts it
    /// (a late collision) or the full-duplex side's frame is mangled.
    Lose,
}

/// The PHY's reset and power-up times by default: 10 ms each, well inside
/// what Linux waits (phy_poll_reset sleeps 50 ms before it first reads
/// BMCR; ax88772a_hw_reset sleeps 160 and 200 ms after releasing the PHY),
/// long enough that a driver that does not wait reads RESET set or 0xffff.
pub const DEFAULT_PHY_TIMING: Timing = Timing {
    reset: Duration::from_millis(10),
    powerup: Duration::from_millis(10),
};

/// Default depth of the pacer's token bucket (see [`DeviceConfig::pace_burst`]):
/// 10 ms, 125 kB at 100 Mbit/s, about a switch port's buffer. With strict
/// spacing (0) every stall of the one-vCPU TCG guest or of the loaded host
/// left the wire idle: in-guest TCP reached 80-88% of the line rate, against
/// 95-100% with 10 ms (bench/guest-throughput.sh, 2 loaded cores).
pub const DEFAULT_PACE_BURST: Duration = Duration::from_millis(10);

#[derive(Clone, Debug, Serialize)]
pub struct DeviceConfig {
    pub variant: Variant,
    #[serde(serialize_with = "ser_mac")]
    pub mac: [u8; 6],
    pub phy_id: u32,
    pub addr0: Addr0,
    /// Pace frames to the line rate of the MAC's medium mode.
    pub paced: bool,
    /// Depth of the pacer's token bucket: after the wire sat idle, up to
    /// this much of the idle time can be caught up at once. Scheduling
    /// hiccups of the host, QEMU or a TCG guest then cost no line rate,
    /// while over any window W the wire carries at most (W + burst) of it.
    #[serde(serialize_with = "ser_us")]
    pub pace_burst: Duration,
    /// The share of the negotiated line rate the paced wire carries, in
    /// percent (100: the line rate). Below 100 it models a slower link, the
    /// seeded loss `bench/throughput-power.py` measures the farm against.
    pub pace_percent: u32,
    /// Frames held between the wire and the guest's bulk IN requests.
    pub rx_queue_frames: usize,
    /// How RX records meet bulk IN requests (a byte stream, as the chip).
    pub rx_mode: RxMode,
    /// What a duplex mismatch does to colliding frames.
    pub duplex_mismatch: DuplexMismatch,
    #[serde(serialize_with = "ser_ms")]
    pub autoneg: Duration,
    /// Added to each autonegotiation: a draw in [0, jitter] from a
    /// generator seeded with `autoneg_seed`.
    #[serde(serialize_with = "ser_ms")]
    pub autoneg_jitter: Duration,
    pub autoneg_seed: u64,
    /// STATMNGSTS.HOST_EN (and MDIO) comes this long after SET_SW_MII.
    #[serde(serialize_with = "ser_us")]
    pub mii_delay: Duration,
    /// How long a BMCR reset and a power-up after SW_RESET take.
    pub phy_timing: Timing,
    pub partner: Partner,
    pub quirks: Quirks,
}

fn ser_mac<S: serde::Serializer>(m: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_mac(m))
}

fn ser_us<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl DeviceConfig {
    pub fn new(variant: Variant, mac: [u8; 6]) -> DeviceConfig {
        DeviceConfig {
            variant,
            mac,
            phy_id: variant.phy_id(),
            addr0: Addr0::Alias,
            paced: true,
            pace_burst: DEFAULT_PACE_BURST,
            pace_percent: 100,
            rx_queue_frames: 256,
            rx_mode: RxMode::Stream,
            duplex_mismatch: DuplexMismatch::Count,
            autoneg: Duration::ZERO,
            autoneg_jitter: Duration::ZERO,
            autoneg_seed: 0,
            mii_delay: Duration::ZERO,
            phy_timing: DEFAULT_PHY_TIMING,
            partner: Partner::default(),
            quirks: Quirks::default(),
        }
    }
}
