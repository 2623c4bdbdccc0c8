//! One usbredir session toward QEMU across several sessions of the exporter
//! on the other side, as plain bytes (no IO here).
//!
//! `usbredirect` serves one device for as long as it exists: when the
//! device goes away (an unplug) it ends its session and exits, and a new
//! `usbredirect` serves the device when it returns. QEMU's `usb-redir`, on
//! the other hand, keeps one session for as long as its chardev is
//! connected, and a chardev backed by a virtio-serial port never sees the
//! port's guest side close. `ax88772-gadget --relay` splices the two: the
//! messages pass unchanged, whole (never a partial message into a new
//! session), and at each seam
//! - an exporter session that ends with the device connected sends QEMU a
//!   `device_disconnect` (QEMU's acknowledgement is not passed on: that
//!   exporter is gone);
//! - a new exporter session gets QEMU's hello, recorded at the start, and
//!   its own hello is not passed on (QEMU already has one, with the same
//!   capabilities, or the splice fails);
//! - what QEMU sends while no exporter session is up is dropped (after a
//!   disconnect QEMU has nothing in flight).

use usbredir::proto::{cap, msg_type as msg, DEFAULT_MAX_PACKET_LEN, HEADER_LEN_32, HEADER_LEN_64};
use usbredir::proto::{Caps, HELLO_VERSION_LEN};

/// Why the stream cannot be spliced.
#[derive(Debug, PartialEq, Eq)]
pub enum SpliceError {
    /// A message longer than the protocol's packet limit.
    Oversized { type_code: u32, length: u32 },
    /// A session's first message is not its hello.
    NoHello { from: &'static str, type_code: u32 },
    /// A hello too short to hold its version string.
    ShortHello { from: &'static str, length: usize },
    /// A later exporter session offers other capabilities than the first:
    /// QEMU's session was set up for those.
    CapsChanged { first: Vec<u32>, now: Vec<u32> },
}

impl std::fmt::Display for SpliceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpliceError::Oversized { type_code, length } => write!(
                f,
                "a usbredir message of type {type_code} with {length} bytes, over the limit of \
                 {DEFAULT_MAX_PACKET_LEN}"
            ),
            SpliceError::NoHello { from, type_code } => {
                write!(f, "{from} began with message type {type_code}, not a hello")
            }
            SpliceError::ShortHello { from, length } => {
                write!(f, "{from}'s hello has {length} bytes, too short")
            }
            SpliceError::CapsChanged { first, now } => write!(
                f,
                "the exporter's new session offers capabilities {now:x?}, its first offered \
                 {first:x?}"
            ),
        }
    }
}

impl std::error::Error for SpliceError {}

/// Splits a byte stream into whole usbredir messages, bytes unchanged.
#[derive(Default)]
pub struct Splitter {
    buf: Vec<u8>,
    /// Where the next message begins in `buf`.
    pos: usize,
}

impl Splitter {
    pub fn feed(&mut self, data: &[u8]) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes held that are not yet a whole message.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes held in memory: undecoded ones and passed ones not yet
    /// reclaimed (the buffer is compacted as the stream goes through).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// The next whole message (header included), if its bytes are all here.
    /// `header_len` is the stream's header size for that message.
    pub fn next(&mut self, header_len: usize) -> Result<Option<Vec<u8>>, SpliceError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < header_len {
            return Ok(None);
        }
        let type_code = u32::from_le_bytes(avail[0..4].try_into().unwrap_or_default());
        let length = u32::from_le_bytes(avail[4..8].try_into().unwrap_or_default());
        if length > DEFAULT_MAX_PACKET_LEN {
            return Err(SpliceError::Oversized { type_code, length });
        }
        let total = header_len + length as usize;
        if avail.len() < total {
            return Ok(None);
        }
        let m = avail[..total].to_vec();
        self.pos += total;
        Ok(Some(m))
    }
}

/// A message's type code.
pub fn type_code(m: &[u8]) -> u32 {
    m.get(0..4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        .unwrap_or(u32::MAX)
}

/// The capability words of a hello (header of 12 bytes, as every hello has).
fn hello_caps(m: &[u8], from: &'static str) -> Result<Vec<u32>, SpliceError> {
    let body = m.get(HEADER_LEN_32..).unwrap_or_default();
    if body.len() < HELLO_VERSION_LEN {
        return Err(SpliceError::ShortHello {
            from,
            length: m.len(),
        });
    }
    Ok(body[HELLO_VERSION_LEN..]
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect())
}

fn first_word(caps: &[u32]) -> Caps {
    Caps(caps.first().copied().unwrap_or(0))
}

/// The splice's state: what each side said that the other must not hear
/// twice, and whether QEMU sees the device connected.
#[derive(Default)]
pub struct Splice {
    qemu_hello: Option<Vec<u8>>,
    /// The first capability word of QEMU's hello.
    qemu_caps: Caps,
    exporter_caps: Option<Vec<u32>>,
    /// Capabilities both sides have (none before both hellos): they set
    /// the header size and whether QEMU acknowledges a disconnect.
    common: Caps,
    /// An exporter session is up and its hello was read.
    live: bool,
    /// QEMU was told the device is connected (and not told otherwise).
    connected: bool,
    /// QEMU will acknowledge a disconnect the exporter never sent.
    swallow_ack: bool,
    /// Exporter sessions begun.
    pub sessions: u64,
    /// Messages from QEMU dropped with no exporter session up.
    pub dropped: u64,
}

impl Splice {
    /// Header size of the messages after both hellos.
    pub fn header_len(&self) -> usize {
        if self.common.has(cap::IDS_64BIT) {
            HEADER_LEN_64
        } else {
            HEADER_LEN_32
        }
    }

    /// Header size of QEMU's next message.
    pub fn qemu_header_len(&self) -> usize {
        if self.qemu_hello.is_none() {
            HEADER_LEN_32
        } else {
            self.header_len()
        }
    }

    /// Header size of the exporter session's next message.
    pub fn exporter_header_len(&self) -> usize {
        if self.live {
            self.header_len()
        } else {
            HEADER_LEN_32
        }
    }

    /// Whether QEMU's hello is here (an exporter session can begin).
    pub fn has_qemu_hello(&self) -> bool {
        self.qemu_hello.is_some()
    }

    /// Whether QEMU sees the device connected.
    pub fn connected(&self) -> bool {
        self.connected
    }

    /// A message from QEMU: what to pass to the exporter, if anything.
    pub fn from_qemu(&mut self, m: Vec<u8>) -> Result<Option<Vec<u8>>, SpliceError> {
        if self.qemu_hello.is_none() {
            if type_code(&m) != msg::HELLO {
                return Err(SpliceError::NoHello {
                    from: "QEMU",
                    type_code: type_code(&m),
                });
            }
            self.qemu_caps = first_word(&hello_caps(&m, "QEMU")?);
            self.qemu_hello = Some(m);
            // Each exporter session gets it from `session_start`.
            return Ok(None);
        }
        if self.swallow_ack && type_code(&m) == msg::DEVICE_DISCONNECT_ACK {
            self.swallow_ack = false;
            return Ok(None);
        }
        if !self.live {
            self.dropped += 1;
            return Ok(None);
        }
        Ok(Some(m))
    }

    /// A new exporter session: what to send it first (QEMU's hello), or
    /// None if QEMU has not said hello yet.
    pub fn session_start(&mut self) -> Option<Vec<u8>> {
        let h = self.qemu_hello.clone()?;
        self.live = false;
        self.sessions += 1;
        Some(h)
    }

    /// A message from the exporter session: what to pass to QEMU, if
    /// anything.
    pub fn from_exporter(&mut self, m: Vec<u8>) -> Result<Option<Vec<u8>>, SpliceError> {
        if !self.live {
            if type_code(&m) != msg::HELLO {
                return Err(SpliceError::NoHello {
                    from: "the exporter",
                    type_code: type_code(&m),
                });
            }
            let caps = hello_caps(&m, "the exporter")?;
            self.live = true;
            return match &self.exporter_caps {
                None => {
                    self.common = self.qemu_caps.common(first_word(&caps));
                    self.exporter_caps = Some(caps);
                    Ok(Some(m))
                }
                Some(first) if *first == caps => Ok(None),
                Some(first) => Err(SpliceError::CapsChanged {
                    first: first.clone(),
                    now: caps,
                }),
            };
        }
        match type_code(&m) {
            msg::DEVICE_CONNECT => self.connected = true,
            msg::DEVICE_DISCONNECT => self.connected = false,
            _ => {}
        }
        Ok(Some(m))
    }

    /// The exporter session ended: what to tell QEMU (a `device_disconnect`
    /// if QEMU still sees the device).
    pub fn session_end(&mut self) -> Option<Vec<u8>> {
        let header_len = self.header_len();
        self.live = false;
        if !self.connected {
            return None;
        }
        self.connected = false;
        self.swallow_ack = self.common.has(cap::DEVICE_DISCONNECT_ACK);
        let mut m = vec![0u8; header_len];
        m[0..4].copy_from_slice(&msg::DEVICE_DISCONNECT.to_le_bytes());
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Variant;
    use usbredir::{Codec, Message, Packet, Role};

    fn caps() -> Caps {
        Caps::XHCI_HOST.with(cap::DEVICE_DISCONNECT_ACK)
    }

    fn hello(caps: Caps) -> Vec<u8> {
        let mut out = Vec::new();
        Codec::new(Role::Host, caps)
            .encode_hello("test", &mut out)
            .unwrap();
        out
    }

    /// A message as the exporter (usbredir host) encodes it, both hellos
    /// exchanged.
    fn encode(caps: Caps, id: u64, m: Message) -> Vec<u8> {
        encode_as(Role::Host, caps, id, m)
    }

    /// A message as QEMU (usbredir guest) encodes it.
    fn from_qemu(caps: Caps, id: u64, m: Message) -> Vec<u8> {
        encode_as(Role::Guest, caps, id, m)
    }

    fn encode_as(role: Role, caps: Caps, id: u64, m: Message) -> Vec<u8> {
        let mut c = Codec::new(role, caps);
        c.feed(&hello(caps));
        c.next_packet().unwrap().unwrap();
        c.encode_hello("test", &mut Vec::new()).unwrap();
        let mut out = Vec::new();
        c.encode(&Packet { id, msg: m }, &mut out).unwrap();
        out
    }

    fn connect() -> Message {
        Message::DeviceConnect(crate::descriptors::device_connect(Variant::Ax88772a))
    }

    fn decode(caps: Caps, m: &[u8]) -> Message {
        let mut c = Codec::new(Role::Guest, caps);
        c.feed(&hello(caps));
        c.next_packet().unwrap().unwrap();
        c.feed(m);
        c.next_packet().unwrap().unwrap().msg
    }

    #[test]
    fn the_splitter_gives_whole_messages_unchanged() {
        let (a, b) = (hello(caps()), encode(caps(), 7, connect()));
        let mut s = Splitter::default();
        let all = [a.clone(), b.clone()].concat();
        s.feed(&all[..5]);
        assert_eq!(s.next(HEADER_LEN_32), Ok(None));
        s.feed(&all[5..a.len() - 1]);
        assert_eq!(s.next(HEADER_LEN_32), Ok(None));
        s.feed(&all[a.len() - 1..a.len() + 3]);
        assert_eq!(s.next(HEADER_LEN_32), Ok(Some(a.clone())));
        assert_eq!(s.next(HEADER_LEN_64), Ok(None));
        assert_eq!(s.buffered(), 3);
        s.feed(&all[a.len() + 3..]);
        assert_eq!(s.next(HEADER_LEN_64), Ok(Some(b)));
        assert_eq!(s.next(HEADER_LEN_64), Ok(None));
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn the_splitter_refuses_a_message_over_the_limit() {
        let mut m = vec![0u8; HEADER_LEN_64];
        m[0..4].copy_from_slice(&msg::BULK_PACKET.to_le_bytes());
        m[4..8].copy_from_slice(&(DEFAULT_MAX_PACKET_LEN + 1).to_le_bytes());
        let mut s = Splitter::default();
        s.feed(&m);
        let e = s.next(HEADER_LEN_64).unwrap_err();
        assert_eq!(
            e,
            SpliceError::Oversized {
                type_code: msg::BULK_PACKET,
                length: DEFAULT_MAX_PACKET_LEN + 1
            }
        );
        assert!(e.to_string().contains("type 101"), "{e}");
        // At the limit it waits for the body.
        m[4..8].copy_from_slice(&DEFAULT_MAX_PACKET_LEN.to_le_bytes());
        let mut s = Splitter::default();
        s.feed(&m);
        assert_eq!(s.next(HEADER_LEN_64), Ok(None));
    }

    #[test]
    fn the_splitter_holds_bounded_memory_while_a_message_is_always_partial() {
        // 1000-byte messages fed 1499 bytes at a time: a partial message is
        // always left (the two line up again only after 1.5 MB), so the
        // buffer is never empty and must be compacted.
        let m = |i: u32| {
            let mut v = vec![0u8; 1000];
            v[0..4].copy_from_slice(&msg::BULK_PACKET.to_le_bytes());
            v[4..8].copy_from_slice(&((1000 - HEADER_LEN_64) as u32).to_le_bytes());
            v[8..12].copy_from_slice(&i.to_le_bytes());
            v
        };
        let stream: Vec<u8> = (0..1000).flat_map(m).collect();
        let mut s = Splitter::default();
        let (mut got, mut most) = (0u32, 0usize);
        for chunk in stream.chunks(1499) {
            s.feed(chunk);
            most = most.max(s.held());
            while let Some(x) = s.next(HEADER_LEN_64).unwrap() {
                assert_eq!(x, m(got));
                got += 1;
            }
        }
        assert_eq!(got, 1000);
        assert!(most >= 1499, "held() counts what is held: {most}");
        assert!(
            most < 200 * 1024,
            "held up to {most} bytes of a 1 MB stream"
        );
    }

    #[test]
    fn a_hello_without_capability_words_is_taken() {
        let mut h = hello(caps());
        h.truncate(HEADER_LEN_32 + HELLO_VERSION_LEN);
        h[4..8].copy_from_slice(&(HELLO_VERSION_LEN as u32).to_le_bytes());
        let mut s = Splice::default();
        assert_eq!(s.from_qemu(h), Ok(None));
        assert!(s.has_qemu_hello());
        s.session_start();
        s.from_exporter(hello(caps())).unwrap();
        assert_eq!(
            s.header_len(),
            HEADER_LEN_32,
            "no 64-bit ids without QEMU's word"
        );
    }

    /// QEMU's hello, then the first exporter session's.
    fn spliced() -> Splice {
        let mut s = Splice::default();
        assert!(!s.has_qemu_hello());
        assert_eq!(s.qemu_header_len(), HEADER_LEN_32);
        assert_eq!(s.session_start(), None, "no session before QEMU's hello");
        assert_eq!(s.from_qemu(hello(caps())), Ok(None));
        assert!(s.has_qemu_hello());
        assert_eq!(s.session_start(), Some(hello(caps())));
        assert_eq!(s.exporter_header_len(), HEADER_LEN_32);
        assert_eq!(s.from_exporter(hello(caps())), Ok(Some(hello(caps()))));
        assert_eq!(s.header_len(), HEADER_LEN_64);
        assert_eq!(s.exporter_header_len(), HEADER_LEN_64);
        assert_eq!(s.qemu_header_len(), HEADER_LEN_64);
        s
    }

    #[test]
    fn the_first_session_passes_everything_both_ways() {
        let mut s = spliced();
        let c = encode(caps(), 0, connect());
        assert_eq!(s.from_exporter(c.clone()), Ok(Some(c)));
        assert!(s.connected());
        let q = from_qemu(caps(), 3, Message::SetConfiguration { configuration: 1 });
        assert_eq!(s.from_qemu(q.clone()), Ok(Some(q)));
        assert_eq!(s.dropped, 0);
        assert_eq!(s.sessions, 1);
    }

    #[test]
    fn a_session_that_ends_with_the_device_connected_tells_qemu_it_went_away() {
        let mut s = spliced();
        s.from_exporter(encode(caps(), 0, connect())).unwrap();
        let d = s.session_end().expect("a device_disconnect for QEMU");
        assert_eq!(d.len(), HEADER_LEN_64);
        assert_eq!(decode(caps(), &d), Message::DeviceDisconnect);
        assert!(!s.connected());
        // QEMU's acknowledgement is not for the next exporter.
        let ack = from_qemu(caps(), 0, Message::DeviceDisconnectAck);
        assert_eq!(s.from_qemu(ack.clone()), Ok(None));
        assert_eq!(s.dropped, 0, "the ack is swallowed, not dropped");
        // Anything else while no session is up is dropped.
        let q = from_qemu(caps(), 4, Message::Reset);
        assert_eq!(s.from_qemu(q.clone()), Ok(None));
        assert_eq!(s.dropped, 1);
        // The next session gets QEMU's hello; its own is not passed on.
        assert_eq!(s.session_start(), Some(hello(caps())));
        assert_eq!(s.exporter_header_len(), HEADER_LEN_32);
        assert_eq!(s.from_exporter(hello(caps())), Ok(None));
        let c = encode(caps(), 0, connect());
        assert_eq!(s.from_exporter(c.clone()), Ok(Some(c)));
        assert!(s.connected());
        // A second ack (not owed) reaches the exporter.
        assert_eq!(s.from_qemu(ack.clone()), Ok(Some(ack)));
        assert_eq!(s.from_qemu(q.clone()), Ok(Some(q)));
        assert_eq!(s.sessions, 2);
    }

    #[test]
    fn a_session_that_said_disconnect_itself_gets_no_second_one() {
        let mut s = spliced();
        s.from_exporter(encode(caps(), 0, connect())).unwrap();
        let d = encode(caps(), 0, Message::DeviceDisconnect);
        assert_eq!(s.from_exporter(d.clone()), Ok(Some(d)));
        assert_eq!(s.session_end(), None);
        // QEMU's ack answers a disconnect the old exporter sent: dropped
        // with it, not swallowed for later.
        let ack = from_qemu(caps(), 0, Message::DeviceDisconnectAck);
        assert_eq!(s.from_qemu(ack), Ok(None));
        assert_eq!(s.dropped, 1);
    }

    #[test]
    fn without_the_ack_capability_nothing_is_swallowed() {
        let no_ack = Caps::XHCI_HOST;
        let mut s = Splice::default();
        s.from_qemu(hello(caps())).unwrap();
        s.session_start();
        s.from_exporter(hello(no_ack)).unwrap();
        s.from_exporter(encode(no_ack, 0, connect())).unwrap();
        assert!(s.session_end().is_some());
        s.session_start();
        s.from_exporter(hello(no_ack)).unwrap();
        let ack = from_qemu(caps(), 0, Message::DeviceDisconnectAck);
        assert_eq!(s.from_qemu(ack.clone()), Ok(Some(ack)));
    }

    #[test]
    fn thirty_two_bit_ids_when_either_side_lacks_64_bit_ids() {
        let small = Caps(Caps::XHCI_HOST.0 & !(1 << cap::IDS_64BIT));
        let mut s = Splice::default();
        s.from_qemu(hello(caps())).unwrap();
        s.session_start();
        s.from_exporter(hello(small)).unwrap();
        assert_eq!(s.header_len(), HEADER_LEN_32);
        s.from_exporter(encode(small, 0, connect())).unwrap();
        assert_eq!(s.session_end().map(|d| d.len()), Some(HEADER_LEN_32));
    }

    #[test]
    fn a_session_with_other_capabilities_cannot_be_spliced() {
        let mut s = spliced();
        s.session_end();
        s.session_start();
        let e = s.from_exporter(hello(Caps::XHCI_HOST)).unwrap_err();
        assert!(matches!(e, SpliceError::CapsChanged { .. }), "{e:?}");
        assert!(e.to_string().contains("capabilities"), "{e}");
    }

    #[test]
    fn each_side_must_begin_with_its_hello() {
        let c = encode(caps(), 0, connect());
        let mut s = Splice::default();
        assert_eq!(
            s.from_qemu(c.clone()),
            Err(SpliceError::NoHello {
                from: "QEMU",
                type_code: msg::DEVICE_CONNECT
            })
        );
        s.from_qemu(hello(caps())).unwrap();
        s.session_start();
        let e = s.from_exporter(c).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the exporter began with message type 1"),
            "{e}"
        );
        let short = hello(caps())[..HEADER_LEN_32 + 10].to_vec();
        let mut s = Splice::default();
        assert_eq!(
            s.from_qemu(short),
            Err(SpliceError::ShortHello {
                from: "QEMU",
                length: HEADER_LEN_32 + 10
            })
        );
    }

    #[test]
    fn a_session_that_ends_before_the_device_connected_says_nothing() {
        let mut s = spliced();
        assert_eq!(s.session_end(), None);
        assert_eq!(s.exporter_header_len(), HEADER_LEN_32);
    }
}
