//! The usbredir protocol (spice-usbredir, protocol version 0.7) as a sans-IO
//! codec.
//!
//! [`Codec`] turns received bytes into typed [`Packet`]s and packets into
//! bytes, for either role: [`Role::Host`] (the side that exports a device,
//! as this project's device models do) or [`Role::Guest`] (QEMU's
//! `usb-redir`, used by tests to play QEMU). It owns no socket.
//!
//! Header and message sizes depend on the capabilities both peers announce
//! in their hellos; the codec tracks the exchange. Decoding is strict:
//! every `header.length` is checked against the type-specific header size,
//! data is only accepted in the direction the protocol allows, lengths above
//! a bound are refused, and unknown types come back as errors.
//!
//! ```
//! use usbredir::{Caps, Codec, Role};
//! let mut dev = Codec::new(Role::Host, Caps::XHCI_HOST);
//! let mut qemu = Codec::new(Role::Guest, Caps(0xff));
//! let mut wire = Vec::new();
//! dev.encode_hello("model", &mut wire).unwrap();
//! qemu.feed(&wire);
//! let hello = qemu.next_packet().unwrap().unwrap();
//! assert_eq!(hello.msg.name(), "hello");
//! ```

mod codec;
mod error;
mod message;
pub mod proto;

pub use codec::Codec;
pub use error::Error;
pub use message::*;
pub use proto::{ep_index, Caps, Role, Status};
