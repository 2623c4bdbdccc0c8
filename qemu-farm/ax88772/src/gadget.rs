//! The model as a USB gadget: what `ax88772-gadget` writes to and reads from
//! Linux FunctionFS, as plain bytes (no IO here).
//!
//! `ax88772-gadget` is the usbredir *guest* of a model (the role QEMU's
//! `usb-redir` has) and a FunctionFS function on a USB device controller:
//! the model's interface and endpoints become the function's descriptors,
//! ep0 setup requests become usbredir control packets, and the endpoint
//! files carry the bulk and interrupt transfers. A host that enumerates the
//! gadget (through `dummy_hcd`, or a board's real controller) sees the
//! model through its own USB stack.

use usbredir::{ep_index, proto::ep_type, EpInfo, InterfaceInfo};

/// `FUNCTIONFS_DESCRIPTORS_MAGIC_V2`.
const DESCRIPTORS_MAGIC_V2: u32 = 3;
/// `FUNCTIONFS_STRINGS_MAGIC`.
const STRINGS_MAGIC: u32 = 2;
const HAS_FS_DESC: u32 = 1;
const HAS_HS_DESC: u32 = 2;
/// `FUNCTIONFS_ALL_CTRL_RECIP`: vendor requests to the device (as the
/// AX88772A's are) reach the function, not only those to its interface.
const ALL_CTRL_RECIP: u32 = 64;

/// One endpoint of the function, in endpoint-file order (`ep1`, `ep2`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The model's endpoint address (direction bit included).
    pub address: u8,
    /// `usbredir::proto::ep_type`.
    pub kind: u8,
    pub max_packet: u16,
    pub interval: u8,
}

impl Endpoint {
    pub fn is_in(&self) -> bool {
        self.address & 0x80 != 0
    }
}

/// Why the model's endpoints cannot become a function.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GadgetError {
    #[error("the model has no interface")]
    NoInterface,
    #[error("the model has {0} interfaces; a gadget function here has one")]
    Interfaces(u32),
    #[error("endpoint {0:#04x} is isochronous, which this gadget does not carry")]
    Iso(u8),
    #[error("the model has no endpoint besides ep0")]
    NoEndpoints,
}

/// The model's data endpoints (not ep0), in address order.
pub fn endpoints(ep: &EpInfo) -> Result<Vec<Endpoint>, GadgetError> {
    let mut v = Vec::new();
    for num in 1..16u8 {
        for dir in [0x80u8, 0x00] {
            let address = num | dir;
            let i = ep_index(address);
            let kind = ep.ep_type[i];
            if kind == ep_type::INVALID {
                continue;
            }
            if kind == ep_type::ISO {
                return Err(GadgetError::Iso(address));
            }
            v.push(Endpoint {
                address,
                kind,
                max_packet: ep.max_packet_size[i],
                interval: ep.interval[i],
            });
        }
    }
    if v.is_empty() {
        return Err(GadgetError::NoEndpoints);
    }
    Ok(v)
}

fn interface_descriptor(iface: &InterfaceInfo, n_eps: usize) -> [u8; 9] {
    [
        9,
        0x04,
        0,
        0,
        n_eps as u8,
        iface.interface_class[0],
        iface.interface_subclass[0],
        iface.interface_protocol[0],
        0,
    ]
}

/// An endpoint descriptor at full or high speed. FunctionFS maps the n-th
/// endpoint descriptor to the file `ep<n>`; the controller picks the
/// address the host sees.
fn endpoint_descriptor(e: &Endpoint, high_speed: bool) -> [u8; 7] {
    let (mps, interval) = match (e.kind, high_speed) {
        (ep_type::BULK, true) => (e.max_packet.max(8), 0),
        (ep_type::BULK, false) => (e.max_packet.min(64), 0),
        // High speed: 2^(interval-1) microframes; full speed: frames.
        (_, true) => (e.max_packet, e.interval.clamp(1, 16)),
        (_, false) => (
            e.max_packet.min(64),
            (1u32 << (e.interval.clamp(1, 16) - 1)).div_ceil(8).min(255) as u8,
        ),
    };
    let [ml, mh] = mps.to_le_bytes();
    [7, 0x05, e.address, e.kind & 3, ml, mh, interval]
}

/// What `ax88772-gadget` writes to `ep0` first: the function's interface
/// and endpoints at full and high speed.
pub fn descriptors(iface: &InterfaceInfo, eps: &[Endpoint]) -> Result<Vec<u8>, GadgetError> {
    match iface.interface_count {
        0 => return Err(GadgetError::NoInterface),
        1 => {}
        n => return Err(GadgetError::Interfaces(n)),
    }
    let mut body = Vec::new();
    for hs in [false, true] {
        body.extend(interface_descriptor(iface, eps.len()));
        for e in eps {
            body.extend(endpoint_descriptor(e, hs));
        }
    }
    let count = 1 + eps.len() as u32;
    let mut out = Vec::with_capacity(20 + body.len());
    out.extend(DESCRIPTORS_MAGIC_V2.to_le_bytes());
    out.extend((20 + body.len() as u32).to_le_bytes());
    out.extend((HAS_FS_DESC | HAS_HS_DESC | ALL_CTRL_RECIP).to_le_bytes());
    out.extend(count.to_le_bytes());
    out.extend(count.to_le_bytes());
    out.extend(body);
    Ok(out)
}

/// What `ax88772-gadget` writes to `ep0` second: no strings of its own (the
/// device's strings are set through configfs).
pub fn strings() -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    out.extend(STRINGS_MAGIC.to_le_bytes());
    out.extend(16u32.to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out
}

/// A control request's setup packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub request_type: u8,
    pub request: u8,
    pub value: u16,
    pub index: u16,
    pub length: u16,
}

impl Setup {
    pub fn is_in(&self) -> bool {
        self.request_type & 0x80 != 0
    }
}

/// `struct usb_functionfs_event`, as read from `ep0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Bind,
    Unbind,
    Enable,
    Disable,
    Setup(Setup),
    Suspend,
    Resume,
    Unknown(u8),
}

/// The size of one event.
pub const EVENT_LEN: usize = 12;

/// The events in what one read of `ep0` returned (whole events only).
pub fn parse_events(buf: &[u8]) -> Vec<Event> {
    buf.chunks_exact(EVENT_LEN)
        .map(|e| match e[8] {
            0 => Event::Bind,
            1 => Event::Unbind,
            2 => Event::Enable,
            3 => Event::Disable,
            4 => Event::Setup(Setup {
                request_type: e[0],
                request: e[1],
                value: u16::from_le_bytes([e[2], e[3]]),
                index: u16::from_le_bytes([e[4], e[5]]),
                length: u16::from_le_bytes([e[6], e[7]]),
            }),
            5 => Event::Suspend,
            6 => Event::Resume,
            t => Event::Unknown(t),
        })
        .collect()
}

/// The text of a USB string descriptor (UTF-16LE after a two-byte header);
/// `None` when it is not one.
pub fn string_text(d: &[u8]) -> Option<String> {
    if d.len() < 2 || d[1] != 0x03 {
        return None;
    }
    let n = (d[0] as usize).min(d.len());
    let units: Vec<u16> = d[2..n]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Some(String::from_utf16_lossy(&units))
}

/// A configfs attribute value from model-provided text: printable ASCII,
/// no newline, at most 126 characters.
pub fn configfs_text(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(126)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors;

    #[test]
    fn the_ax88772a_becomes_three_endpoint_files() {
        let eps = endpoints(&descriptors::ep_info()).unwrap();
        let addrs: Vec<u8> = eps.iter().map(|e| e.address).collect();
        assert_eq!(addrs, [0x81, 0x82, 0x03]);
        assert_eq!(eps[0].kind, ep_type::INTERRUPT);
        assert!(eps[1].is_in() && !eps[2].is_in());
    }

    #[test]
    fn descriptors_match_the_functionfs_v2_layout() {
        let eps = endpoints(&descriptors::ep_info()).unwrap();
        let d = descriptors(&descriptors::interface_info(), &eps).unwrap();
        assert_eq!(d.len(), 20 + 2 * (9 + 3 * 7));
        assert_eq!(u32::from_le_bytes(d[0..4].try_into().unwrap()), 3);
        assert_eq!(
            u32::from_le_bytes(d[4..8].try_into().unwrap()) as usize,
            d.len()
        );
        assert_eq!(u32::from_le_bytes(d[8..12].try_into().unwrap()), 67);
        assert_eq!(u32::from_le_bytes(d[12..16].try_into().unwrap()), 4);
        // Full speed: interface, then the interrupt endpoint at 128 ms.
        assert_eq!(&d[20..29], &[9, 4, 0, 0, 3, 0xff, 0xff, 0, 0]);
        assert_eq!(&d[29..36], &[7, 5, 0x81, 3, 8, 0, 128]);
        assert_eq!(&d[36..43], &[7, 5, 0x82, 2, 64, 0, 0]);
        // High speed: bulk at 512, interrupt interval as the chip has it.
        let hs = 20 + 30;
        assert_eq!(&d[hs + 9..hs + 16], &[7, 5, 0x81, 3, 8, 0, 11]);
        assert_eq!(&d[hs + 23..hs + 30], &[7, 5, 0x03, 2, 0, 2, 0]);
    }

    #[test]
    fn a_model_the_gadget_cannot_carry_is_refused() {
        let mut e = descriptors::ep_info();
        e.ep_type[ep_index(0x84)] = ep_type::ISO;
        assert_eq!(endpoints(&e), Err(GadgetError::Iso(0x84)));
        let none = EpInfo::default();
        assert_eq!(endpoints(&none), Err(GadgetError::NoEndpoints));
        let mut i = descriptors::interface_info();
        i.interface_count = 2;
        assert_eq!(descriptors(&i, &[]), Err(GadgetError::Interfaces(2)));
    }

    #[test]
    fn events_are_parsed_whole() {
        let mut buf = vec![0xc0, 0x07, 0x01, 0x00, 0x02, 0x00, 0x02, 0x00, 4, 0, 0, 0];
        buf.extend([0; 8]);
        buf.extend([2, 0, 0, 0]);
        buf.extend([1, 2, 3]);
        let ev = parse_events(&buf);
        assert_eq!(
            ev,
            [
                Event::Setup(Setup {
                    request_type: 0xc0,
                    request: 7,
                    value: 1,
                    index: 2,
                    length: 2
                }),
                Event::Enable
            ]
        );
        assert!(matches!(ev[0], Event::Setup(s) if s.is_in()));
    }

    #[test]
    fn strings_from_the_model_are_made_safe_for_configfs() {
        let d = descriptors::string_descriptor(descriptors::Variant::Ax88772a, 1, "").unwrap();
        assert_eq!(string_text(&d).as_deref(), Some("ASIX Elec. Corp."));
        assert_eq!(string_text(&[4, 2, 0, 0]), None);
        assert_eq!(string_text(&[]), None);
        assert_eq!(string_text(&[2]), None);
        assert_eq!(string_text(&[2, 3]).as_deref(), Some(""));
        assert_eq!(configfs_text("a\nb/\u{7}c é"), "ab/c ");
        assert_eq!(configfs_text(&"x".repeat(300)).len(), 126);
        assert_eq!(strings().len(), 16);
    }
}
