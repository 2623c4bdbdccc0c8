//! Typed usbredir messages.

use crate::proto::{msg_type as t, Caps, Status};

/// A hello: free-form version string and capability words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Version string, at most 63 bytes on the wire (NUL-terminated).
    pub version: String,
    /// First capability word; further words are kept in `extra_caps`.
    pub caps: Caps,
    /// Capability words beyond the first (unknown to protocol 0.7).
    pub extra_caps: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConnect {
    pub speed: u8,
    pub device_class: u8,
    pub device_subclass: u8,
    pub device_protocol: u8,
    pub vendor_id: u16,
    pub product_id: u16,
    /// Only on the wire when both peers have `connect_device_version`;
    /// decodes as 0 otherwise.
    pub device_version_bcd: u16,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// Number of valid entries (at most 32).
    pub interface_count: u32,
    pub interface: [u8; 32],
    pub interface_class: [u8; 32],
    pub interface_subclass: [u8; 32],
    pub interface_protocol: [u8; 32],
}

/// Endpoint table, indexed by [`crate::ep_index`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpInfo {
    pub ep_type: [u8; 32],
    pub interval: [u8; 32],
    pub interface: [u8; 32],
    /// On the wire only with `ep_info_max_packet_size` on both sides.
    pub max_packet_size: [u16; 32],
    /// On the wire only with `bulk_streams` on both sides.
    pub max_streams: [u32; 32],
}

impl Default for EpInfo {
    fn default() -> Self {
        EpInfo {
            ep_type: [crate::proto::ep_type::INVALID; 32],
            interval: [0; 32],
            interface: [0; 32],
            max_packet_size: [0; 32],
            max_streams: [0; 32],
        }
    }
}

/// A control transfer. For IN requests from the guest `data` is empty and
/// `length` is the number of bytes asked for; the reply carries exactly
/// `length` bytes. For OUT requests the guest sends `length` bytes and the
/// reply carries none.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ControlPacket {
    pub endpoint: u8,
    pub request: u8,
    pub requesttype: u8,
    pub status: Status,
    pub value: u16,
    pub index: u16,
    pub length: u16,
    pub data: Vec<u8>,
}

/// A bulk transfer; same data rules as [`ControlPacket`], per endpoint
/// direction. `length` is 32 bits wide with `32bits_bulk_length`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BulkPacket {
    pub endpoint: u8,
    pub status: Status,
    pub length: u32,
    pub stream_id: u32,
    pub data: Vec<u8>,
}

/// An interrupt or iso transfer (same header shape).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SmallDataPacket {
    pub endpoint: u8,
    pub status: Status,
    pub length: u16,
    pub data: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct BufferedBulkPacket {
    pub stream_id: u32,
    pub length: u32,
    pub endpoint: u8,
    pub status: Status,
    pub data: Vec<u8>,
}

/// Every message of protocol 0.7.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    DeviceConnect(DeviceConnect),
    DeviceDisconnect,
    Reset,
    InterfaceInfo(Box<InterfaceInfo>),
    EpInfo(Box<EpInfo>),
    SetConfiguration {
        configuration: u8,
    },
    GetConfiguration,
    ConfigurationStatus {
        status: Status,
        configuration: u8,
    },
    SetAltSetting {
        interface: u8,
        alt: u8,
    },
    GetAltSetting {
        interface: u8,
    },
    AltSettingStatus {
        status: Status,
        interface: u8,
        alt: u8,
    },
    StartIsoStream {
        endpoint: u8,
        pkts_per_urb: u8,
        no_urbs: u8,
    },
    StopIsoStream {
        endpoint: u8,
    },
    IsoStreamStatus {
        status: Status,
        endpoint: u8,
    },
    StartInterruptReceiving {
        endpoint: u8,
    },
    StopInterruptReceiving {
        endpoint: u8,
    },
    InterruptReceivingStatus {
        status: Status,
        endpoint: u8,
    },
    AllocBulkStreams {
        endpoints: u32,
        no_streams: u32,
    },
    FreeBulkStreams {
        endpoints: u32,
    },
    BulkStreamsStatus {
        endpoints: u32,
        no_streams: u32,
        status: Status,
    },
    /// Cancels the data packet whose id is the header id.
    CancelDataPacket,
    FilterReject,
    /// Filter rules string (usbredirfilter syntax), NUL excluded.
    FilterFilter {
        rules: Vec<u8>,
    },
    DeviceDisconnectAck,
    StartBulkReceiving {
        stream_id: u32,
        bytes_per_transfer: u32,
        endpoint: u8,
        no_transfers: u8,
    },
    StopBulkReceiving {
        stream_id: u32,
        endpoint: u8,
    },
    BulkReceivingStatus {
        stream_id: u32,
        endpoint: u8,
        status: Status,
    },
    ControlPacket(ControlPacket),
    BulkPacket(BulkPacket),
    IsoPacket(SmallDataPacket),
    InterruptPacket(SmallDataPacket),
    BufferedBulkPacket(BufferedBulkPacket),
}

impl Message {
    /// The `usb_redir_header.type` code.
    pub fn type_code(&self) -> u32 {
        match self {
            Message::Hello(_) => t::HELLO,
            Message::DeviceConnect(_) => t::DEVICE_CONNECT,
            Message::DeviceDisconnect => t::DEVICE_DISCONNECT,
            Message::Reset => t::RESET,
            Message::InterfaceInfo(_) => t::INTERFACE_INFO,
            Message::EpInfo(_) => t::EP_INFO,
            Message::SetConfiguration { .. } => t::SET_CONFIGURATION,
            Message::GetConfiguration => t::GET_CONFIGURATION,
            Message::ConfigurationStatus { .. } => t::CONFIGURATION_STATUS,
            Message::SetAltSetting { .. } => t::SET_ALT_SETTING,
            Message::GetAltSetting { .. } => t::GET_ALT_SETTING,
            Message::AltSettingStatus { .. } => t::ALT_SETTING_STATUS,
            Message::StartIsoStream { .. } => t::START_ISO_STREAM,
            Message::StopIsoStream { .. } => t::STOP_ISO_STREAM,
            Message::IsoStreamStatus { .. } => t::ISO_STREAM_STATUS,
            Message::StartInterruptReceiving { .. } => t::START_INTERRUPT_RECEIVING,
            Message::StopInterruptReceiving { .. } => t::STOP_INTERRUPT_RECEIVING,
            Message::InterruptReceivingStatus { .. } => t::INTERRUPT_RECEIVING_STATUS,
            Message::AllocBulkStreams { .. } => t::ALLOC_BULK_STREAMS,
            Message::FreeBulkStreams { .. } => t::FREE_BULK_STREAMS,
            Message::BulkStreamsStatus { .. } => t::BULK_STREAMS_STATUS,
            Message::CancelDataPacket => t::CANCEL_DATA_PACKET,
            Message::FilterReject => t::FILTER_REJECT,
            Message::FilterFilter { .. } => t::FILTER_FILTER,
            Message::DeviceDisconnectAck => t::DEVICE_DISCONNECT_ACK,
            Message::StartBulkReceiving { .. } => t::START_BULK_RECEIVING,
            Message::StopBulkReceiving { .. } => t::STOP_BULK_RECEIVING,
            Message::BulkReceivingStatus { .. } => t::BULK_RECEIVING_STATUS,
            Message::ControlPacket(_) => t::CONTROL_PACKET,
            Message::BulkPacket(_) => t::BULK_PACKET,
            Message::IsoPacket(_) => t::ISO_PACKET,
            Message::InterruptPacket(_) => t::INTERRUPT_PACKET,
            Message::BufferedBulkPacket(_) => t::BUFFERED_BULK_PACKET,
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        type_name(self.type_code()).unwrap_or("unknown")
    }
}

/// The protocol name of a type code, or `None` if the code is unknown.
pub fn type_name(code: u32) -> Option<&'static str> {
    Some(match code {
        t::HELLO => "hello",
        t::DEVICE_CONNECT => "device_connect",
        t::DEVICE_DISCONNECT => "device_disconnect",
        t::RESET => "reset",
        t::INTERFACE_INFO => "interface_info",
        t::EP_INFO => "ep_info",
        t::SET_CONFIGURATION => "set_configuration",
        t::GET_CONFIGURATION => "get_configuration",
        t::CONFIGURATION_STATUS => "configuration_status",
        t::SET_ALT_SETTING => "set_alt_setting",
        t::GET_ALT_SETTING => "get_alt_setting",
        t::ALT_SETTING_STATUS => "alt_setting_status",
        t::START_ISO_STREAM => "start_iso_stream",
        t::STOP_ISO_STREAM => "stop_iso_stream",
        t::ISO_STREAM_STATUS => "iso_stream_status",
        t::START_INTERRUPT_RECEIVING => "start_interrupt_receiving",
        t::STOP_INTERRUPT_RECEIVING => "stop_interrupt_receiving",
        t::INTERRUPT_RECEIVING_STATUS => "interrupt_receiving_status",
        t::ALLOC_BULK_STREAMS => "alloc_bulk_streams",
        t::FREE_BULK_STREAMS => "free_bulk_streams",
        t::BULK_STREAMS_STATUS => "bulk_streams_status",
        t::CANCEL_DATA_PACKET => "cancel_data_packet",
        t::FILTER_REJECT => "filter_reject",
        t::FILTER_FILTER => "filter_filter",
        t::DEVICE_DISCONNECT_ACK => "device_disconnect_ack",
        t::START_BULK_RECEIVING => "start_bulk_receiving",
        t::STOP_BULK_RECEIVING => "stop_bulk_receiving",
        t::BULK_RECEIVING_STATUS => "bulk_receiving_status",
        t::CONTROL_PACKET => "control_packet",
        t::BULK_PACKET => "bulk_packet",
        t::ISO_PACKET => "iso_packet",
        t::INTERRUPT_PACKET => "interrupt_packet",
        t::BUFFERED_BULK_PACKET => "buffered_bulk_packet",
        _ => return None,
    })
}

/// A message and the id of its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub id: u64,
    pub msg: Message,
}

impl Packet {
    pub fn new(id: u64, msg: Message) -> Packet {
        Packet { id, msg }
    }
}
