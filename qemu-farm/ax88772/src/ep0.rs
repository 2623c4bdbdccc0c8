//! Control endpoint: standard USB requests and dispatch to the ASIX vendor
//! requests. Unknown requests STALL and are logged with their bytes.

use crate::descriptors::{self, Variant};
use crate::log_w;
use crate::mac::{Effects, Mac, Reply, Setup};
use crate::phy::Phy;

const GET_STATUS: u8 = 0;
const CLEAR_FEATURE: u8 = 1;
const SET_FEATURE: u8 = 3;
const SET_ADDRESS: u8 = 5;
const GET_DESCRIPTOR: u8 = 6;
const GET_CONFIGURATION: u8 = 8;
const SET_CONFIGURATION: u8 = 9;
const GET_INTERFACE: u8 = 10;
const SET_INTERFACE: u8 = 11;

/// `ENDPOINT_HALT`, the one endpoint feature (USB 2.0 §9.4.5).
const ENDPOINT_HALT: u16 = 0;
const DEVICE_REMOTE_WAKEUP: u16 = 1;

/// USB-level state the standard requests touch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsbState {
    pub configuration: u8,
    pub remote_wakeup: bool,
    /// Halted endpoints, by usbredir endpoint index. A halted endpoint
    /// answers every transfer with STALL until CLEAR_FEATURE(ENDPOINT_HALT),
    /// SET_CONFIGURATION or SET_INTERFACE clears it. Data toggles are the
    /// host controller's and usbredir's business (the model sees whole
    /// transfers), so clearing a halt has nothing more to reset here.
    pub halted: u32,
}

impl UsbState {
    /// Whether `endpoint` (an address with its direction bit) is halted.
    pub fn is_halted(&self, endpoint: u8) -> bool {
        self.halted & (1 << usbredir::ep_index(endpoint)) != 0
    }
}

/// The endpoint an endpoint-recipient request names in wIndex: `Some(0)`
/// for ep0 (either direction), the address of a data endpoint the device
/// has, or `None` (no such endpoint: a request error).
fn endpoint(index: u16) -> Option<u8> {
    let ep = u8::try_from(index).ok()?;
    match ep {
        0x00 | 0x80 => Some(0),
        descriptors::EP_INTERRUPT | descriptors::EP_BULK_IN | descriptors::EP_BULK_OUT => Some(ep),
        _ => None,
    }
}

pub struct Ep0<'a> {
    pub variant: Variant,
    pub serial: &'a str,
    pub usb: &'a mut UsbState,
    pub mac: &'a mut Mac,
    pub phy: &'a mut Phy,
    pub effects: &'a mut Effects,
}

fn data(mut v: Vec<u8>, length: u16) -> Reply {
    v.truncate(usize::from(length));
    Reply::Data(v)
}

impl Ep0<'_> {
    /// Run one control request. `out_data` is the OUT data stage.
    pub fn handle(&mut self, s: &Setup, out_data: &[u8]) -> Reply {
        let reply = match s.requesttype & 0x60 {
            0x00 => self.standard(s),
            0x40 if s.requesttype & 0x1f == 0 => {
                self.mac.vendor(self.phy, s, out_data, self.effects)
            }
            _ => Reply::Stall,
        };
        if reply == Reply::Stall {
            log_w!("usb: STALL for {s} data=[{}]", crate::log::hex(out_data));
        }
        reply
    }

    fn standard(&mut self, s: &Setup) -> Reply {
        let recipient = s.requesttype & 0x1f;
        match (s.is_in(), s.request) {
            (true, GET_DESCRIPTOR) if recipient == 0 => self.descriptor(s),
            (true, GET_STATUS) => match recipient {
                0 => data(
                    vec![0x01 | (u8::from(self.usb.remote_wakeup) << 1), 0],
                    s.length,
                ),
                1 => data(vec![0, 0], s.length),
                2 => match endpoint(s.index) {
                    Some(ep) => data(
                        vec![u8::from(ep != 0 && self.usb.is_halted(ep)), 0],
                        s.length,
                    ),
                    None => Reply::Stall,
                },
                _ => Reply::Stall,
            },
            (true, GET_CONFIGURATION) => data(vec![self.usb.configuration], s.length),
            (true, GET_INTERFACE) if s.index == 0 => data(vec![0], s.length),
            (false, CLEAR_FEATURE | SET_FEATURE) => {
                let set = s.request == SET_FEATURE;
                match (recipient, s.value, endpoint(s.index)) {
                    (0, DEVICE_REMOTE_WAKEUP, _) => self.usb.remote_wakeup = set,
                    // ep0 has no halt feature: clearing it is a no-op,
                    // setting it a request error.
                    (2, ENDPOINT_HALT, Some(0)) if !set => {}
                    (2, ENDPOINT_HALT, Some(ep)) if ep != 0 => {
                        let bit = 1 << usbredir::ep_index(ep);
                        if set {
                            self.usb.halted |= bit;
                        } else {
                            self.usb.halted &= !bit;
                        }
                    }
                    _ => return Reply::Stall,
                }
                Reply::Done(0)
            }
            (false, SET_ADDRESS) => Reply::Done(0),
            (false, SET_CONFIGURATION) if s.value <= 1 => {
                self.usb.configuration = s.value as u8;
                self.usb.halted = 0;
                Reply::Done(0)
            }
            (false, SET_INTERFACE) if s.index == 0 && s.value == 0 => {
                self.usb.halted = 0;
                Reply::Done(0)
            }
            _ => Reply::Stall,
        }
    }

    fn descriptor(&self, s: &Setup) -> Reply {
        let [index, kind] = s.value.to_le_bytes();
        let v = match kind {
            1 => descriptors::device_descriptor(self.variant).to_vec(),
            2 if index == 0 => descriptors::config_descriptor().to_vec(),
            3 => match descriptors::string_descriptor(self.variant, index, self.serial) {
                Some(d) => d,
                None => return Reply::Stall,
            },
            6 => descriptors::device_qualifier().to_vec(),
            _ => return Reply::Stall,
        };
        data(v, s.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mac::Addr0;
    use std::time::Instant;

    fn run(s: Setup) -> Reply {
        let mut usb = UsbState::default();
        let mut mac = Mac::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1], Addr0::Alias);
        let mut phy = Phy::new(crate::phy::PHY_ID_AX88772A, Instant::now());
        let mut effects = Effects::default();
        let mut ep0 = Ep0 {
            variant: Variant::Ax88772a,
            serial: "000001",
            usb: &mut usb,
            mac: &mut mac,
            phy: &mut phy,
            effects: &mut effects,
        };
        ep0.handle(&s, &[])
    }

    fn get(value: u16, length: u16) -> Setup {
        Setup {
            requesttype: 0x80,
            request: 6,
            value,
            index: 0,
            length,
        }
    }

    #[test]
    fn descriptors_are_cut_to_wlength() {
        let Reply::Data(d) = run(get(0x0100, 64)) else {
            panic!("stall")
        };
        assert_eq!(d.len(), 18);
        let Reply::Data(d) = run(get(0x0100, 8)) else {
            panic!("stall")
        };
        assert_eq!(d, [0x12, 0x01, 0x00, 0x02, 0xff, 0xff, 0x00, 0x40]);
        let Reply::Data(d) = run(get(0x0200, 9)) else {
            panic!("stall")
        };
        assert_eq!(&d[2..4], &[39, 0]);
        let Reply::Data(d) = run(get(0x0303, 255)) else {
            panic!("stall")
        };
        assert_eq!(d.len(), 2 + 12);
    }

    #[test]
    fn unknown_requests_stall() {
        assert_eq!(run(get(0x0f00, 5)), Reply::Stall, "no BOS");
        assert_eq!(run(get(0x0309, 255)), Reply::Stall, "no string 9");
        let class = Setup {
            requesttype: 0xa1,
            request: 1,
            value: 0,
            index: 0,
            length: 4,
        };
        assert_eq!(run(class), Reply::Stall);
        let vendor_iface = Setup {
            requesttype: 0xc1,
            request: 0x13,
            value: 0,
            index: 0,
            length: 6,
        };
        assert_eq!(run(vendor_iface), Reply::Stall);
    }

    #[test]
    fn status_and_features() {
        let st = Setup {
            requesttype: 0x80,
            request: 0,
            value: 0,
            index: 0,
            length: 2,
        };
        assert_eq!(run(st), Reply::Data(vec![1, 0]));
        let clear = Setup {
            requesttype: 0x02,
            request: 1,
            value: 0,
            index: 0x82,
            length: 0,
        };
        assert_eq!(run(clear), Reply::Done(0));
    }

    fn setup(requesttype: u8, request: u8, value: u16, index: u16, length: u16) -> Setup {
        Setup {
            requesttype,
            request,
            value,
            index,
            length,
        }
    }

    #[test]
    fn standard_requests_answer_or_stall_by_their_fields() {
        let mut usb = UsbState::default();
        let mut mac = Mac::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1], Addr0::Alias);
        let mut phy = Phy::new(crate::phy::PHY_ID_AX88772A, Instant::now());
        let mut effects = Effects::default();
        let mut ep0 = Ep0 {
            variant: Variant::Ax88772a,
            serial: "000001",
            usb: &mut usb,
            mac: &mut mac,
            phy: &mut phy,
            effects: &mut effects,
        };
        let mut ask = |s: Setup| ep0.handle(&s, &[]);
        assert_eq!(ask(setup(0x00, SET_ADDRESS, 5, 0, 0)), Reply::Done(0));
        assert_eq!(
            ask(setup(0x80, GET_CONFIGURATION, 0, 0, 1)),
            Reply::Data(vec![0])
        );
        assert_eq!(ask(setup(0x00, SET_CONFIGURATION, 1, 0, 0)), Reply::Done(0));
        assert_eq!(
            ask(setup(0x80, GET_CONFIGURATION, 0, 0, 1)),
            Reply::Data(vec![1])
        );
        assert_eq!(ask(setup(0x00, SET_CONFIGURATION, 2, 0, 0)), Reply::Stall);
        assert_eq!(
            ask(setup(0x80, GET_CONFIGURATION, 0, 0, 1)),
            Reply::Data(vec![1])
        );
        assert_eq!(
            ask(setup(0x81, GET_INTERFACE, 0, 0, 1)),
            Reply::Data(vec![0])
        );
        assert_eq!(ask(setup(0x81, GET_INTERFACE, 0, 1, 1)), Reply::Stall);
        assert_eq!(ask(setup(0x01, SET_INTERFACE, 0, 0, 0)), Reply::Done(0));
        assert_eq!(ask(setup(0x01, SET_INTERFACE, 1, 0, 0)), Reply::Stall);
        assert_eq!(ask(setup(0x01, SET_INTERFACE, 0, 1, 0)), Reply::Stall);
        // GET_DESCRIPTOR is a device request only.
        assert_eq!(
            ask(setup(0x81, GET_DESCRIPTOR, 0x0100, 0, 18)),
            Reply::Stall
        );
        assert!(
            matches!(ask(setup(0x80, GET_DESCRIPTOR, 0x0100, 0, 18)), Reply::Data(d) if d.len() == 18)
        );
        assert!(
            matches!(ask(setup(0x80, GET_DESCRIPTOR, 0x0600, 0, 10)), Reply::Data(d) if d.len() == 10 && d[1] == 6)
        );
        assert_eq!(
            ask(setup(0x80, GET_DESCRIPTOR, 0x0201, 0, 9)),
            Reply::Stall,
            "one configuration"
        );
        // Remote wakeup: set, seen in GET_STATUS, cleared.
        assert_eq!(ask(setup(0x00, SET_FEATURE, 1, 0, 0)), Reply::Done(0));
        assert_eq!(
            ask(setup(0x80, GET_STATUS, 0, 0, 2)),
            Reply::Data(vec![3, 0])
        );
        assert_eq!(ask(setup(0x00, CLEAR_FEATURE, 1, 0, 0)), Reply::Done(0));
        assert_eq!(
            ask(setup(0x80, GET_STATUS, 0, 0, 2)),
            Reply::Data(vec![1, 0])
        );
        assert_eq!(
            ask(setup(0x81, GET_STATUS, 0, 0, 2)),
            Reply::Data(vec![0, 0])
        );
        assert_eq!(ask(setup(0x83, GET_STATUS, 0, 0, 2)), Reply::Stall);
        assert_eq!(
            ask(setup(0x00, SET_FEATURE, 2, 0, 0)),
            Reply::Stall,
            "test mode"
        );
    }
}
