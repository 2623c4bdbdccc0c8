//! Emulated ASIX AX88772A USB 2.0 Ethernet adapter, served to QEMU's
//! `usb-redir` device over the usbredir protocol.

pub mod addr;
pub mod cli;
pub mod config;
pub mod ctl;
pub mod descriptors;
pub mod device;
pub mod ep0;
pub mod faults;
pub mod framing;
pub mod gadget;
pub mod goodput;
pub mod impair;
pub mod link;
pub mod log;
pub mod mac;
pub mod mii;
pub mod net;
pub mod nic;
pub mod pcap;
pub mod pending;
pub mod phy;
pub mod server;
pub mod splice;
pub mod wire;
