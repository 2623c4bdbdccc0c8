//! The control requests as parsed from their JSON lines: one variant per
//! `cmd`, unknown fields refused.

use serde::Deserialize;
use std::path::PathBuf;

use crate::faults::MdioOp;
use crate::impair::Direction;
use crate::phy::{CableState, LinkMode};

#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Carrier on or off (cable plugged at the far end).
    Link {
        up: bool,
    },
    /// Change the link partner; omitted fields keep their value.
    Partner {
        autoneg: Option<bool>,
        modes: Option<Vec<LinkMode>>,
        pause: Option<bool>,
        asym_pause: Option<bool>,
        autoneg_ms: Option<u64>,
        autoneg_jitter_ms: Option<u64>,
    },
    /// The PHY's reset and power-up times; omitted fields keep their value.
    PhyTiming {
        reset_ms: Option<u64>,
        powerup_ms: Option<u64>,
    },
    Quirks {
        lpa_zero: Option<bool>,
        reset_after_link_loss: Option<bool>,
        stale_lpa: Option<bool>,
    },
    /// Loss/corruption with a seed; `loss` and `corrupt` are probabilities.
    Impair {
        loss: Option<f64>,
        corrupt: Option<f64>,
        direction: Option<Direction>,
        seed: Option<u64>,
        latency_us: Option<u64>,
        jitter_us: Option<u64>,
    },
    /// MDIO accesses that fail (the vendor request STALLs): a rule per
    /// request, or `clear`.
    MdioFault {
        op: Option<MdioOp>,
        regs: Option<Vec<u8>>,
        count: Option<u64>,
        probability: Option<f64>,
        seed: Option<u64>,
        clear: Option<bool>,
    },
    Cable {
        state: CableState,
        distance_m: Option<f64>,
    },
    Counters {
        reset: Option<bool>,
    },
    Pcap {
        action: PcapAction,
        path: Option<PathBuf>,
        /// Bytes kept of each frame [default: all].
        snaplen: Option<u32>,
    },
    Phy,
    Describe,
    /// Simulate unplugging or replugging the adapter.
    Usb {
        action: UsbAction,
        /// For `replug`: how long the adapter stays unplugged.
        down_ms: Option<u64>,
    },
    Ping,
}

#[derive(Debug, Deserialize, PartialEq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum PcapAction {
    Start,
    Stop,
}

#[derive(Debug, Deserialize, PartialEq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum UsbAction {
    Plug,
    Unplug,
    /// Unplug, then plug back in after `down_ms` (default 500).
    Replug,
}
