//! Sans-IO encoder/decoder: bytes in, [`Packet`]s out, and back.

//!
//! This file holds [`Codec`]'s state and the rules both directions share
//! (type header sizes, which role receives which message, where data
//! goes); beside it: `decode` (bytes to packets) and `encode` (packets
//! to bytes).

use crate::message::*;
use crate::proto::{cap, msg_type as t, Caps, Role, HEADER_LEN_32, HEADER_LEN_64};
use crate::proto::{DEFAULT_MAX_PACKET_LEN, HELLO_VERSION_LEN};

mod decode;
mod encode;

/// How the data after a type header is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataRule {
    /// Fixed-size message: no data.
    None,
    /// Hello capability words or filter rules: any length.
    Free,
    /// A transfer: data present in one direction only (see `expects_data`).
    Transfer,
}

fn layout(code: u32, common: Caps) -> Option<(u32, DataRule)> {
    use DataRule::*;
    let bulk_len = if common.has(cap::BULK_LENGTH_32BIT) {
        10
    } else {
        8
    };
    let ep_info_len = if common.has(cap::BULK_STREAMS) {
        288
    } else if common.has(cap::EP_INFO_MAX_PACKET_SIZE) {
        160
    } else {
        96
    };
    let connect_len = if common.has(cap::CONNECT_DEVICE_VERSION) {
        10
    } else {
        8
    };
    Some(match code {
        t::HELLO => (HELLO_VERSION_LEN as u32, Free),
        t::DEVICE_CONNECT => (connect_len, None),
        t::DEVICE_DISCONNECT | t::RESET | t::GET_CONFIGURATION => (0, None),
        t::CANCEL_DATA_PACKET | t::FILTER_REJECT | t::DEVICE_DISCONNECT_ACK => (0, None),
        t::INTERFACE_INFO => (132, None),
        t::EP_INFO => (ep_info_len, None),
        t::SET_CONFIGURATION | t::GET_ALT_SETTING => (1, None),
        t::STOP_ISO_STREAM | t::START_INTERRUPT_RECEIVING | t::STOP_INTERRUPT_RECEIVING => {
            (1, None)
        }
        t::CONFIGURATION_STATUS | t::SET_ALT_SETTING => (2, None),
        t::ISO_STREAM_STATUS | t::INTERRUPT_RECEIVING_STATUS => (2, None),
        t::ALT_SETTING_STATUS | t::START_ISO_STREAM => (3, None),
        t::ALLOC_BULK_STREAMS => (8, None),
        t::FREE_BULK_STREAMS => (4, None),
        t::BULK_STREAMS_STATUS => (9, None),
        t::FILTER_FILTER => (0, Free),
        t::START_BULK_RECEIVING => (10, None),
        t::STOP_BULK_RECEIVING => (5, None),
        t::BULK_RECEIVING_STATUS => (6, None),
        t::CONTROL_PACKET => (10, Transfer),
        t::BULK_PACKET => (bulk_len, Transfer),
        t::ISO_PACKET | t::INTERRUPT_PACKET => (4, Transfer),
        t::BUFFERED_BULK_PACKET => (10, Transfer),
        _ => return Option::None,
    })
}

/// Whether a role may receive a message type.
fn receives(role: Role, code: u32) -> bool {
    let both = matches!(
        code,
        t::HELLO
            | t::FILTER_FILTER
            | t::CONTROL_PACKET
            | t::BULK_PACKET
            | t::ISO_PACKET
            | t::INTERRUPT_PACKET
    );
    let host_only = matches!(
        code,
        t::RESET
            | t::SET_CONFIGURATION
            | t::GET_CONFIGURATION
            | t::SET_ALT_SETTING
            | t::GET_ALT_SETTING
            | t::START_ISO_STREAM
            | t::STOP_ISO_STREAM
            | t::START_INTERRUPT_RECEIVING
            | t::STOP_INTERRUPT_RECEIVING
            | t::ALLOC_BULK_STREAMS
            | t::FREE_BULK_STREAMS
            | t::CANCEL_DATA_PACKET
            | t::FILTER_REJECT
            | t::DEVICE_DISCONNECT_ACK
            | t::START_BULK_RECEIVING
            | t::STOP_BULK_RECEIVING
    );
    both || (role == Role::Host) == host_only
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Host => "host",
        Role::Guest => "guest",
    }
}

/// Whether a transfer travelling to `receiver` carries data: commands to the
/// host carry OUT data, replies to the guest carry IN data.
fn expects_data(receiver: Role, is_in: bool) -> bool {
    match receiver {
        Role::Host => !is_in,
        Role::Guest => is_in,
    }
}

fn name_of(code: u32) -> &'static str {
    type_name(code).unwrap_or("unknown")
}

/// One end of a usbredir connection, without any I/O.
///
/// Feed received bytes with [`Codec::feed`] and pull messages with
/// [`Codec::next_packet`]; turn messages into bytes with [`Codec::encode`].
/// The codec tracks the hello exchange, because header and message sizes
/// depend on the capabilities both peers announced.
#[derive(Debug)]
pub struct Codec {
    role: Role,
    our_caps: Caps,
    peer: Option<Hello>,
    hello_sent: bool,
    max_len: u32,
    buf: Vec<u8>,
    pos: usize,
    skip: u64,
    poisoned: bool,
}

impl Codec {
    /// A codec for `role` announcing `caps` in its hello.
    pub fn new(role: Role, caps: Caps) -> Codec {
        Codec {
            role,
            our_caps: caps,
            peer: None,
            hello_sent: false,
            max_len: DEFAULT_MAX_PACKET_LEN,
            buf: Vec::new(),
            pos: 0,
            skip: 0,
            poisoned: false,
        }
    }

    /// Refuse packets whose `header.length` exceeds `max` (fatal error).
    pub fn with_max_packet_len(mut self, max: u32) -> Codec {
        self.max_len = max;
        self
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn our_caps(&self) -> Caps {
        self.our_caps
    }

    /// The peer's hello, once received.
    pub fn peer_hello(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// Capabilities both sides have; empty until the peer's hello arrived.
    pub fn common_caps(&self) -> Caps {
        match &self.peer {
            Some(h) => self.our_caps.common(h.caps),
            None => Caps(0),
        }
    }

    /// Size of `usb_redir_header` for the next packet.
    pub fn header_len(&self) -> usize {
        if self.common_caps().has(cap::IDS_64BIT) {
            HEADER_LEN_64
        } else {
            HEADER_LEN_32
        }
    }

    /// True after a fatal decoding error; further input is discarded.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes held in memory: undecoded ones and decoded ones not yet
    /// reclaimed (input is compacted as it streams through).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Append received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        if self.poisoned {
            return;
        }
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }
}
