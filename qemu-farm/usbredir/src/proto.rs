//! Wire constants of the usbredir protocol (`usbredirproto.h`, protocol 0.7).
//!
//! Every integer on the wire is little-endian; every structure is packed.

/// Packet type codes carried in `usb_redir_header.type`.
pub mod msg_type {
    pub const HELLO: u32 = 0;
    pub const DEVICE_CONNECT: u32 = 1;
    pub const DEVICE_DISCONNECT: u32 = 2;
    pub const RESET: u32 = 3;
    pub const INTERFACE_INFO: u32 = 4;
    pub const EP_INFO: u32 = 5;
    pub const SET_CONFIGURATION: u32 = 6;
    pub const GET_CONFIGURATION: u32 = 7;
    pub const CONFIGURATION_STATUS: u32 = 8;
    pub const SET_ALT_SETTING: u32 = 9;
    pub const GET_ALT_SETTING: u32 = 10;
    pub const ALT_SETTING_STATUS: u32 = 11;
    pub const START_ISO_STREAM: u32 = 12;
    pub const STOP_ISO_STREAM: u32 = 13;
    pub const ISO_STREAM_STATUS: u32 = 14;
    pub const START_INTERRUPT_RECEIVING: u32 = 15;
    pub const STOP_INTERRUPT_RECEIVING: u32 = 16;
    pub const INTERRUPT_RECEIVING_STATUS: u32 = 17;
    pub const ALLOC_BULK_STREAMS: u32 = 18;
    pub const FREE_BULK_STREAMS: u32 = 19;
    pub const BULK_STREAMS_STATUS: u32 = 20;
    pub const CANCEL_DATA_PACKET: u32 = 21;
    pub const FILTER_REJECT: u32 = 22;
    pub const FILTER_FILTER: u32 = 23;
    pub const DEVICE_DISCONNECT_ACK: u32 = 24;
    pub const START_BULK_RECEIVING: u32 = 25;
    pub const STOP_BULK_RECEIVING: u32 = 26;
    pub const BULK_RECEIVING_STATUS: u32 = 27;
    pub const CONTROL_PACKET: u32 = 100;
    pub const BULK_PACKET: u32 = 101;
    pub const ISO_PACKET: u32 = 102;
    pub const INTERRUPT_PACKET: u32 = 103;
    pub const BUFFERED_BULK_PACKET: u32 = 104;
}

/// Capability bit numbers of the hello's `caps[0]` word.
pub mod cap {
    pub const BULK_STREAMS: u32 = 0;
    pub const CONNECT_DEVICE_VERSION: u32 = 1;
    pub const FILTER: u32 = 2;
    pub const DEVICE_DISCONNECT_ACK: u32 = 3;
    pub const EP_INFO_MAX_PACKET_SIZE: u32 = 4;
    pub const IDS_64BIT: u32 = 5;
    pub const BULK_LENGTH_32BIT: u32 = 6;
    pub const BULK_RECEIVING: u32 = 7;
}

/// Endpoint transfer types used in `ep_info.type[]`.
pub mod ep_type {
    pub const CONTROL: u8 = 0;
    pub const ISO: u8 = 1;
    pub const BULK: u8 = 2;
    pub const INTERRUPT: u8 = 3;
    pub const INVALID: u8 = 255;
}

/// Device speeds used in `device_connect.speed`.
pub mod speed {
    pub const LOW: u8 = 0;
    pub const FULL: u8 = 1;
    pub const HIGH: u8 = 2;
    pub const SUPER: u8 = 3;
    pub const UNKNOWN: u8 = 255;
}

/// Size of the version string that opens every hello.
pub const HELLO_VERSION_LEN: usize = 64;
/// Header size while either peer lacks 64-bit ids (and always for hello).
pub const HEADER_LEN_32: usize = 12;
/// Header size once both peers have 64-bit ids.
pub const HEADER_LEN_64: usize = 16;
/// Default bound on `header.length`; longer packets are refused as fatal.
pub const DEFAULT_MAX_PACKET_LEN: u32 = 4 * 1024 * 1024;

/// Index into the 32-entry endpoint tables of `ep_info`:
/// OUT endpoints 0..15, IN endpoints 16..31.
pub fn ep_index(ep: u8) -> usize {
    (((ep & 0x80) >> 3) | (ep & 0x0f)) as usize
}

/// A transfer status (`usb_redir_success` ...). Unknown values are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u8);

impl Status {
    pub const SUCCESS: Status = Status(0);
    pub const CANCELLED: Status = Status(1);
    pub const INVAL: Status = Status(2);
    pub const IOERROR: Status = Status(3);
    pub const STALL: Status = Status(4);
    pub const TIMEOUT: Status = Status(5);
    pub const BABBLE: Status = Status(6);

    pub fn is_success(self) -> bool {
        self.0 == 0
    }
}

/// The capability word of a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Caps(pub u32);

impl Caps {
    /// Capabilities a usb-host must have for QEMU's qemu-xhci:
    /// connect_device_version, ep_info_max_packet_size, 64-bit ids and
    /// 32-bit bulk length (0x72).
    pub const XHCI_HOST: Caps = Caps(
        1 << cap::CONNECT_DEVICE_VERSION
            | 1 << cap::EP_INFO_MAX_PACKET_SIZE
            | 1 << cap::IDS_64BIT
            | 1 << cap::BULK_LENGTH_32BIT,
    );

    pub fn has(self, bit: u32) -> bool {
        bit < 32 && self.0 & (1 << bit) != 0
    }

    pub fn with(self, bit: u32) -> Caps {
        Caps(self.0 | (1u32 << (bit & 31)))
    }

    /// Capabilities both sides have.
    pub fn common(self, other: Caps) -> Caps {
        Caps(self.0 & other.0)
    }
}

/// Which end of the protocol a codec speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Exports a device (usbredirserver, usbredirect, this project's models).
    Host,
    /// Uses a device (QEMU's `usb-redir`).
    Guest,
}

impl Role {
    pub fn peer(self) -> Role {
        match self {
            Role::Host => Role::Guest,
            Role::Guest => Role::Host,
        }
    }
}
