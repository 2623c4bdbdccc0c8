//! USB identity: chip variants, descriptors, and the usbredir
//! interface/endpoint tables derived from them.

use serde::Serialize;
use usbredir::{ep_index, proto::ep_type, proto::speed, DeviceConnect, EpInfo, InterfaceInfo};

use crate::phy::{PHY_ID_AX88772A, PHY_ID_AX88772C};

pub const VENDOR_ASIX: u16 = 0x0b95;
pub const EP_INTERRUPT: u8 = 0x81;
pub const EP_BULK_IN: u8 = 0x82;
pub const EP_BULK_OUT: u8 = 0x03;
pub const BULK_MPS: u16 = 512;

/// The chip being modelled. Linux picks its reset path from the chip code
/// in STATMNGSTS and its MAC source from the PID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Variant {
    /// 0b95:772a, chip code 0x10, PHY 0x003b1861, MAC from READ_NODE_ID.
    #[value(name = "772a")]
    #[serde(rename = "772a")]
    Ax88772a,
    /// 0b95:772b, chip code 0x20, MAC from EEPROM words 4..6.
    #[value(name = "772b")]
    #[serde(rename = "772b")]
    Ax88772b,
    /// 0b95:772b (the C has no PID of its own), chip code 0x20,
    /// PHY 0x003b1881 ("AX88772C" in Linux's PHY driver).
    #[value(name = "772c")]
    #[serde(rename = "772c")]
    Ax88772c,
}

impl Variant {
    pub fn product_id(self) -> u16 {
        match self {
            Variant::Ax88772a => 0x772a,
            Variant::Ax88772b | Variant::Ax88772c => 0x772b,
        }
    }

    pub fn bcd_device(self) -> u16 {
        match self {
            Variant::Ax88772a | Variant::Ax88772b => 0x0001,
            Variant::Ax88772c => 0x0002,
        }
    }

    /// Chip code, bits 6:4 of STATMNGSTS.
    pub fn chip_code(self) -> u8 {
        match self {
            Variant::Ax88772a => 0x10,
            Variant::Ax88772b | Variant::Ax88772c => 0x20,
        }
    }

    /// Default PHY identifier. The B's is not confirmed on silicon.
    pub fn phy_id(self) -> u32 {
        match self {
            Variant::Ax88772a => PHY_ID_AX88772A,
            Variant::Ax88772b | Variant::Ax88772c => PHY_ID_AX88772C,
        }
    }

    pub fn product(self) -> &'static str {
        match self {
            Variant::Ax88772a => "AX88772A",
            Variant::Ax88772b => "AX88772B",
            Variant::Ax88772c => "AX88772C",
        }
    }
}

/// String descriptor indices.
pub mod istr {
    pub const MANUFACTURER: u8 = 1;
    pub const PRODUCT: u8 = 2;
    pub const SERIAL: u8 = 3;
    pub const CONFIGURATION: u8 = 4;
    pub const INTERFACE: u8 = 7;
}

pub fn device_descriptor(v: Variant) -> [u8; 18] {
    let [vl, vh] = VENDOR_ASIX.to_le_bytes();
    let [pl, ph] = v.product_id().to_le_bytes();
    let [bl, bh] = v.bcd_device().to_le_bytes();
    [
        18,
        0x01,
        0x00,
        0x02,
        0xff,
        0xff,
        0x00,
        64,
        vl,
        vh,
        pl,
        ph,
        bl,
        bh,
        istr::MANUFACTURER,
        istr::PRODUCT,
        istr::SERIAL,
        1,
    ]
}

/// The device qualifier a high-speed device answers with.
pub fn device_qualifier() -> [u8; 10] {
    [10, 0x06, 0x00, 0x02, 0xff, 0xff, 0x00, 64, 1, 0]
}

/// Configuration 1 with interface 0 and its three endpoints (39 bytes).
pub fn config_descriptor() -> [u8; 39] {
    let [ml, mh] = BULK_MPS.to_le_bytes();
    [
        9,
        0x02,
        39,
        0,
        1,
        1,
        istr::CONFIGURATION,
        0xe0,
        0x7d, //
        9,
        0x04,
        0,
        0,
        3,
        0xff,
        0xff,
        0x00,
        istr::INTERFACE, //
        7,
        0x05,
        EP_INTERRUPT,
        0x03,
        8,
        0,
        11, //
        7,
        0x05,
        EP_BULK_IN,
        0x02,
        ml,
        mh,
        0, //
        7,
        0x05,
        EP_BULK_OUT,
        0x02,
        ml,
        mh,
        0,
    ]
}

/// String descriptor `index`, or `None` if there is no such string.
pub fn string_descriptor(v: Variant, index: u8, serial: &str) -> Option<Vec<u8>> {
    let s = match index {
        0 => return Some(vec![4, 0x03, 0x09, 0x04]),
        istr::MANUFACTURER => "ASIX Elec. Corp.",
        istr::PRODUCT => v.product(),
        istr::SERIAL => serial,
        istr::CONFIGURATION => "Network Configuration",
        istr::INTERFACE => "Network Interface",
        _ => return None,
    };
    let units: Vec<u16> = s.encode_utf16().take(126).collect();
    let mut d = vec![(2 + 2 * units.len()) as u8, 0x03];
    for u in units {
        d.extend_from_slice(&u.to_le_bytes());
    }
    Some(d)
}

pub fn interface_info() -> InterfaceInfo {
    let mut i = InterfaceInfo {
        interface_count: 1,
        ..InterfaceInfo::default()
    };
    i.interface_class[0] = 0xff;
    i.interface_subclass[0] = 0xff;
    i
}

pub fn ep_info() -> EpInfo {
    let mut e = EpInfo::default();
    for (ep, ty, mps, interval) in [
        (0x00, ep_type::CONTROL, 64, 0),
        (0x80, ep_type::CONTROL, 64, 0),
        (EP_BULK_OUT, ep_type::BULK, BULK_MPS, 0),
        (EP_INTERRUPT, ep_type::INTERRUPT, 8, 11),
        (EP_BULK_IN, ep_type::BULK, BULK_MPS, 0),
    ] {
        let i = ep_index(ep);
        e.ep_type[i] = ty;
        e.max_packet_size[i] = mps;
        e.interval[i] = interval;
    }
    e
}

pub fn device_connect(v: Variant) -> DeviceConnect {
    DeviceConnect {
        speed: speed::HIGH,
        device_class: 0xff,
        device_subclass: 0xff,
        device_protocol: 0x00,
        vendor_id: VENDOR_ASIX,
        product_id: v.product_id(),
        device_version_bcd: v.bcd_device(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_descriptor_matches_772a_dump() {
        let want = [
            0x12, 0x01, 0x00, 0x02, 0xff, 0xff, 0x00, 0x40, 0x95, 0x0b, 0x2a, 0x77, 0x01, 0x00,
            0x01, 0x02, 0x03, 0x01,
        ];
        assert_eq!(device_descriptor(Variant::Ax88772a), want);
        assert_eq!(device_descriptor(Variant::Ax88772b)[10..12], [0x2b, 0x77]);
    }

    #[test]
    fn config_descriptor_layout() {
        let c = config_descriptor();
        assert_eq!(
            &c[..9],
            &[0x09, 0x02, 0x27, 0x00, 0x01, 0x01, 0x04, 0xe0, 0x7d]
        );
        assert_eq!(&c[18..25], &[0x07, 0x05, 0x81, 0x03, 0x08, 0x00, 0x0b]);
        assert_eq!(&c[25..32], &[0x07, 0x05, 0x82, 0x02, 0x00, 0x02, 0x00]);
        assert_eq!(&c[32..39], &[0x07, 0x05, 0x03, 0x02, 0x00, 0x02, 0x00]);
    }

    #[test]
    fn strings() {
        assert_eq!(
            string_descriptor(Variant::Ax88772a, 0, ""),
            Some(vec![4, 3, 9, 4])
        );
        let p = string_descriptor(Variant::Ax88772a, 2, "").unwrap();
        assert_eq!(p[0] as usize, p.len());
        assert_eq!(&p[2..6], &[b'A', 0, b'X', 0]);
        assert_eq!(string_descriptor(Variant::Ax88772a, 9, ""), None);
        // Every string the descriptors name is there, as UTF-16LE.
        let text = |i| {
            let d = string_descriptor(Variant::Ax88772a, i, "00ABCD").unwrap();
            assert_eq!((d[0] as usize, d[1]), (d.len(), 3));
            let units: Vec<u16> = d[2..]
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).unwrap()
        };
        assert_eq!(text(istr::MANUFACTURER), "ASIX Elec. Corp.");
        assert_eq!(text(istr::SERIAL), "00ABCD");
        assert_eq!(text(istr::CONFIGURATION), "Network Configuration");
        assert_eq!(text(istr::INTERFACE), "Network Interface");
    }

    #[test]
    fn endpoint_table() {
        let e = ep_info();
        assert_eq!(e.ep_type[3], 2);
        assert_eq!(e.ep_type[17], 3);
        assert_eq!(e.interval[17], 11);
        assert_eq!(e.max_packet_size[18], 512);
        assert_eq!(e.ep_type[1], 255);
    }
}
