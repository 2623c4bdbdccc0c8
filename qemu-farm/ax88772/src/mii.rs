//! The clause-22 MII register map of the AX88772A's PHY: register numbers
//! and the bits of BMCR, BMSR and ADVERTISE/LPA. A leaf: the register file
//! (`phy`) and the link state machine behind it (`link`) both read it.

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
