//! The codec's error type.

use thiserror::Error;

/// Everything that can go wrong while decoding or encoding usbredir packets.
///
/// Decoding errors other than [`Error::Oversized`] consume the offending
/// packet, so the stream stays in sync and decoding can continue.
/// `Oversized` is fatal: the codec stops decoding (see [`Error::is_fatal`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("packet type {type_code}: length {length} exceeds the bound of {max} bytes")]
    Oversized {
        type_code: u32,
        length: u32,
        max: u32,
    },
    #[error("unknown packet type {type_code} ({length} bytes skipped)")]
    UnknownType { type_code: u32, length: u32 },
    #[error("{name}: length {length} is shorter than its {expected}-byte type header")]
    ShortPacket {
        name: &'static str,
        length: u32,
        expected: u32,
    },
    #[error("{name}: length {length}, expected exactly {expected}")]
    BadLength {
        name: &'static str,
        length: u32,
        expected: u32,
    },
    #[error("{name}: {data_len} data bytes, expected {expected}")]
    DataLength {
        name: &'static str,
        data_len: u32,
        expected: u32,
    },
    #[error("{name} is never sent to a usb-{receiver}")]
    WrongDirection {
        name: &'static str,
        receiver: &'static str,
    },
    #[error("first packet must be hello, got {name}")]
    HelloExpected { name: &'static str },
    #[error("duplicate hello")]
    DuplicateHello,
    #[error("filter_filter rules are not NUL-terminated")]
    FilterNotTerminated,
    #[error("cannot send {name} before our hello")]
    HelloNotSent { name: &'static str },
    #[error("cannot send {name} before the peer's hello")]
    PeerHelloPending { name: &'static str },
    #[error("id {0:#x} does not fit a 32-bit header id")]
    IdTooWide(u64),
    #[error("bulk length {0} needs the 32bits_bulk_length capability on both sides")]
    BulkTooLong(u32),
    #[error("hello version string is {0} bytes; at most 63 fit")]
    VersionTooLong(usize),
}

impl Error {
    /// True when the byte stream can no longer be trusted and the
    /// connection should be closed.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Oversized { .. })
    }
}
