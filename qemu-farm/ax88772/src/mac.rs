//! The MAC side of the chip: vendor registers reached through ASIX vendor
//! control requests, the EEPROM, the RX filter, and MDIO to the PHY.

use serde::Serialize;
use std::time::{Duration, Instant};

use crate::descriptors::Variant;
use crate::phy::{Phy, PHY_ADDR};
use crate::{log_t, log_w};

/// ASIX vendor request codes (bRequest).
pub mod cmd {
    pub const SET_SW_MII: u8 = 0x06;
    pub const READ_MII_REG: u8 = 0x07;
    pub const WRITE_MII_REG: u8 = 0x08;
    pub const STATMNGSTS_REG: u8 = 0x09;
    pub const SET_HW_MII: u8 = 0x0a;
    pub const READ_EEPROM: u8 = 0x0b;
    pub const WRITE_EEPROM: u8 = 0x0c;
    pub const WRITE_ENABLE: u8 = 0x0d;
    pub const WRITE_DISABLE: u8 = 0x0e;
    pub const READ_RX_CTL: u8 = 0x0f;
    pub const WRITE_RX_CTL: u8 = 0x10;
    pub const WRITE_IPG0: u8 = 0x12;
    pub const READ_NODE_ID: u8 = 0x13;
    pub const WRITE_NODE_ID: u8 = 0x14;
    pub const WRITE_MULTI_FILTER: u8 = 0x16;
    pub const READ_PHY_ID: u8 = 0x19;
    pub const READ_MEDIUM_STATUS: u8 = 0x1a;
    pub const WRITE_MEDIUM_MODE: u8 = 0x1b;
    pub const READ_MONITOR_MODE: u8 = 0x1c;
    pub const WRITE_MONITOR_MODE: u8 = 0x1d;
    pub const READ_GPIOS: u8 = 0x1e;
    pub const WRITE_GPIOS: u8 = 0x1f;
    pub const SW_RESET: u8 = 0x20;
    pub const SW_PHY_SELECT: u8 = 0x22;
    pub const QCTCTRL: u8 = 0x2a;
}

pub mod rx_ctl {
    pub const PRO: u16 = 0x0001;
    pub const AMALL: u16 = 0x0002;
    pub const AB: u16 = 0x0008;
    pub const AM: u16 = 0x0010;
    pub const SO: u16 = 0x0080;
}

pub mod medium {
    pub const FD: u16 = 0x0002;
    /// Receive flow control: PAUSE frames from the partner hold TX.
    pub const RFC: u16 = 0x0010;
    /// Transmit flow control: a full RX FIFO sends PAUSE to the partner.
    pub const TFC: u16 = 0x0020;
    pub const RE: u16 = 0x0100;
    pub const PS: u16 = 0x0200;
}

const HOST_EN: u8 = 0x01;
const GPIO_RSE: u16 = 0x0080;
const SW_RESET_RR: u16 = 0x01;
const SW_RESET_RT: u16 = 0x02;
const SW_RESET_IPRL: u16 = 0x20;
const SW_RESET_IPPD: u16 = 0x40;
pub const EEPROM_WORDS: usize = 256;

/// How MDIO address 0 behaves (Linux probes it in hw_reset and on resume).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Addr0 {
    /// Address 0 reaches the internal PHY too.
    Alias,
    /// Nothing answers at address 0 (reads 0xffff).
    Absent,
}

/// Outcome of a control request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// IN data (already cut to wLength).
    Data(Vec<u8>),
    /// OUT request accepted; the number of data bytes taken.
    Done(u16),
    Stall,
}

/// The SETUP fields of a control request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub requesttype: u8,
    pub request: u8,
    pub value: u16,
    pub index: u16,
    pub length: u16,
}

impl Setup {
    pub fn is_in(&self) -> bool {
        self.requesttype & 0x80 != 0
    }
}

impl std::fmt::Display for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bmRequestType={:#04x} bRequest={:#04x} wValue={:#06x} wIndex={:#06x} wLength={}",
            self.requesttype, self.request, self.value, self.index, self.length
        )
    }
}

/// Side effects the device must carry out after a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pub flush_rx: bool,
    pub flush_tx: bool,
}

/// Vendor-visible MAC registers.
#[derive(Clone, Debug, Serialize)]
pub struct Mac {
    #[serde(skip)]
    variant: Variant,
    /// SET_SW_MII asked for MDIO (until SET_HW_MII).
    pub host_en: bool,
    /// The host gets MDIO (HOST_EN reads 1) this long after SET_SW_MII.
    #[serde(skip)]
    pub mii_delay: Duration,
    #[serde(skip)]
    host_en_at: Option<Instant>,
    pub rx_ctl: u16,
    pub medium: u16,
    pub node_id: [u8; 6],
    pub multi_filter: [u8; 8],
    pub monitor: u8,
    pub ipg: [u16; 2],
    pub gpio: u16,
    pub phy_select: u16,
    pub sw_reset: u16,
    #[serde(skip)]
    eeprom: Box<[u16; EEPROM_WORDS]>,
    pub eeprom_write_enabled: bool,
    pub addr0: Addr0,
}

fn word_bytes(w: u16) -> Vec<u8> {
    w.to_le_bytes().to_vec()
}

/// Linux's `ether_crc`: big-endian CRC-32 as used by the multicast hash.
pub fn ether_crc(data: &[u8]) -> u32 {
    let mut crc: u32 = 0xffff_ffff;
    for &b in data {
        let mut byte = b;
        for _ in 0..8 {
            let bit = ((crc >> 31) as u8 ^ byte) & 1;
            crc <<= 1;
            if bit != 0 {
                crc ^= 0x04c1_1db7;
            }
            byte >>= 1;
        }
    }
    crc
}

impl Mac {
    pub fn new(variant: Variant, mac_addr: [u8; 6], addr0: Addr0) -> Mac {
        let mut eeprom = Box::new([0u16; EEPROM_WORDS]);
        for i in 0..3 {
            eeprom[4 + i] = u16::from_le_bytes([mac_addr[2 * i], mac_addr[2 * i + 1]]);
        }
        let mut m = Mac {
            variant,
            host_en: false,
            mii_delay: Duration::ZERO,
            host_en_at: None,
            rx_ctl: 0,
            medium: 0,
            node_id: mac_addr,
            multi_filter: [0; 8],
            monitor: 0,
            ipg: [0; 2],
            gpio: 0,
            phy_select: 0,
            sw_reset: 0,
            eeprom,
            eeprom_write_enabled: false,
            addr0,
        };
        m.reload_node_id();
        m
    }

    /// Power-on values (USB reset). The EEPROM keeps its contents.
    pub fn reset(&mut self) {
        let eeprom = std::mem::replace(&mut self.eeprom, Box::new([0; EEPROM_WORDS]));
        *self = Mac {
            eeprom,
            mii_delay: self.mii_delay,
            ..Mac::new(self.variant, self.node_id, self.addr0)
        };
        self.reload_node_id();
    }

    fn reload_node_id(&mut self) {
        for i in 0..3 {
            let [lo, hi] = self.eeprom[4 + i].to_le_bytes();
            self.node_id[2 * i] = lo;
            self.node_id[2 * i + 1] = hi;
        }
    }

    /// STATMNGSTS at `now`: the chip code, and HOST_EN once the host owns
    /// MDIO.
    pub fn statmngsts(&self, now: Instant) -> u8 {
        self.variant.chip_code() | if self.owns_mdio(now) { HOST_EN } else { 0 }
    }

    /// The host owns MDIO: SET_SW_MII came, and its delay is over.
    pub fn owns_mdio(&self, now: Instant) -> bool {
        self.host_en && self.host_en_at.map_or(true, |t| now >= t)
    }

    /// RX path open: RX_CTL.SO and MEDIUM.RE.
    pub fn rx_enabled(&self) -> bool {
        self.rx_ctl & rx_ctl::SO != 0 && self.medium & medium::RE != 0
    }

    /// Line rate per MEDIUM.PS, in bit/s.
    pub fn line_rate(&self) -> u64 {
        if self.medium & medium::PS != 0 {
            100_000_000
        } else {
            10_000_000
        }
    }

    /// Whether the RX filter passes a frame with this destination address.
    pub fn accepts(&self, dst: &[u8]) -> bool {
        if dst.len() < 6 || self.rx_ctl & rx_ctl::PRO != 0 {
            return dst.len() >= 6;
        }
        if dst[..6] == [0xff; 6] {
            return self.rx_ctl & rx_ctl::AB != 0;
        }
        if dst[0] & 1 != 0 {
            if self.rx_ctl & rx_ctl::AMALL != 0 {
                return true;
            }
            let bit = (ether_crc(&dst[..6]) >> 26) as usize;
            return self.rx_ctl & rx_ctl::AM != 0
                && self.multi_filter[bit >> 3] & (1 << (bit & 7)) != 0;
        }
        dst[..6] == self.node_id
    }

    fn mdio_target(&self, addr: u16) -> bool {
        addr == u16::from(PHY_ADDR) || (addr == 0 && self.addr0 == Addr0::Alias)
    }

    // Long: one arm per ASIX vendor request of the datasheet.
    /// Run an ASIX vendor request (bmRequestType 0xc0 / 0x40).
    pub fn vendor(&mut self, phy: &mut Phy, s: &Setup, data: &[u8], fx: &mut Effects) -> Reply {
        let cut = |mut v: Vec<u8>| {
            v.truncate(usize::from(s.length));
            Reply::Data(v)
        };
        let need = |n: usize| data.len() >= n && usize::from(s.length) >= n;
        let now = phy.now();
        if s.is_in() {
            match s.request {
                cmd::READ_MII_REG => {
                    let v = if !self.owns_mdio(now) {
                        log_w!(
                            "mdio: read of phy {:#04x} reg {:#04x} without SET_SW_MII: the chip owns MDIO",
                            s.value,
                            s.index
                        );
                        0xffff
                    } else if s.index > 31 {
                        log_w!("mdio: read of register {:#x} (only 0..31 exist)", s.index);
                        0xffff
                    } else if self.mdio_target(s.value) {
                        phy.read(s.index as u8)
                    } else {
                        0xffff
                    };
                    log_t!(
                        "mdio: rd phy {:#04x} reg {:#04x} = {v:#06x}",
                        s.value,
                        s.index
                    );
                    cut(word_bytes(v))
                }
                cmd::STATMNGSTS_REG => cut(vec![self.statmngsts(now)]),
                cmd::READ_EEPROM => {
                    let w = self
                        .eeprom
                        .get(usize::from(s.value))
                        .copied()
                        .unwrap_or(0xffff);
                    cut(word_bytes(w))
                }
                cmd::READ_RX_CTL => cut(word_bytes(self.rx_ctl)),
                cmd::READ_NODE_ID => cut(self.node_id.to_vec()),
                cmd::READ_PHY_ID => cut(vec![0x00, PHY_ADDR]),
                cmd::READ_MEDIUM_STATUS => cut(word_bytes(self.medium)),
                cmd::READ_MONITOR_MODE => cut(vec![self.monitor]),
                cmd::READ_GPIOS => cut(vec![self.gpio as u8]),
                _ => Reply::Stall,
            }
        } else {
            match s.request {
                cmd::SET_SW_MII => {
                    if !self.host_en {
                        self.host_en = true;
                        self.host_en_at = Some(now + self.mii_delay);
                    }
                }
                cmd::SET_HW_MII => {
                    self.host_en = false;
                    self.host_en_at = None;
                }
                cmd::WRITE_MII_REG => {
                    if !need(2) {
                        log_w!("mdio: write with {} data bytes ({s})", data.len());
                        return Reply::Stall;
                    }
                    let v = u16::from_le_bytes([data[0], data[1]]);
                    log_t!(
                        "mdio: wr phy {:#04x} reg {:#04x} := {v:#06x}",
                        s.value,
                        s.index
                    );
                    if !self.owns_mdio(now) {
                        log_w!(
                            "mdio: write to phy {:#04x} reg {:#04x} without SET_SW_MII dropped: the chip owns MDIO",
                            s.value,
                            s.index
                        );
                    } else if s.index > 31 {
                        log_w!("mdio: write to register {:#x} ignored", s.index);
                    } else if self.mdio_target(s.value) {
                        phy.write(s.index as u8, v);
                    }
                }
                cmd::WRITE_EEPROM => {
                    let i = usize::from(s.value);
                    if !self.eeprom_write_enabled {
                        log_w!("eeprom: write to word {i:#x} while write-protected ignored");
                    } else if i < EEPROM_WORDS {
                        self.eeprom[i] = s.index;
                    } else {
                        log_w!("eeprom: write to word {i:#x} out of range ignored");
                    }
                }
                cmd::WRITE_ENABLE => self.eeprom_write_enabled = true,
                cmd::WRITE_DISABLE => self.eeprom_write_enabled = false,
                cmd::WRITE_RX_CTL => self.rx_ctl = s.value,
                cmd::WRITE_IPG0 => self.ipg = [s.value, s.index],
                cmd::WRITE_NODE_ID => {
                    if !need(6) {
                        log_w!("mac: WRITE_NODE_ID with {} data bytes ({s})", data.len());
                        return Reply::Stall;
                    }
                    self.node_id.copy_from_slice(&data[..6]);
                }
                cmd::WRITE_MULTI_FILTER => {
                    if !need(8) {
                        log_w!(
                            "mac: WRITE_MULTI_FILTER with {} data bytes ({s})",
                            data.len()
                        );
                        return Reply::Stall;
                    }
                    self.multi_filter.copy_from_slice(&data[..8]);
                }
                cmd::WRITE_MEDIUM_MODE => self.medium = s.value,
                cmd::WRITE_MONITOR_MODE => self.monitor = s.value as u8,
                cmd::WRITE_GPIOS => {
                    self.gpio = s.value;
                    if s.value & GPIO_RSE != 0 {
                        self.reload_node_id();
                    }
                }
                cmd::SW_RESET => {
                    self.sw_reset = s.value;
                    let held = s.value & SW_RESET_IPPD != 0 || s.value & SW_RESET_IPRL == 0;
                    phy.set_held_in_reset(held);
                    fx.flush_rx |= s.value & SW_RESET_RR != 0;
                    fx.flush_tx |= s.value & SW_RESET_RT != 0;
                }
                cmd::SW_PHY_SELECT => self.phy_select = s.value,
                cmd::QCTCTRL => {}
                _ => return Reply::Stall,
            }
            Reply::Done(data.len().min(usize::from(s.length)) as u16)
        }
    }

    /// EEPROM contents (for `describe`).
    pub fn eeprom(&self) -> &[u16; EEPROM_WORDS] {
        &self.eeprom
    }
}

#[cfg(test)]
#[path = "mac_tests.rs"]
mod tests;
