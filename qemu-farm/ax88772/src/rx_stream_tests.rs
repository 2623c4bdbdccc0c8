//! RX as a byte stream: records cut where bulk IN requests end, checked
//! against a model of the guest driver's reassembly.

use super::*;
use crate::descriptors::Variant;
use crate::mac::Effects;
use proptest::prelude::*;

/// Why the guest driver's reassembly rejected a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FixupError {
    /// The word where the next header should follow the rest of a split
    /// frame is no header: the partial frame is discarded.
    SyncLost,
    /// A header whose length and complement disagree.
    BadHeader,
    /// A header longer than MTU + 14 + 4.
    BadLength,
    /// The transfer did not end right after a record's pad.
    BadSkbLength,
    /// Fewer than 4 (and more than 2) bytes left for a header.
    ShortHeader,
}

/// Linux's `asix_rx_fixup_internal` as documented (asix_common.c): state
/// carried from one transfer to the next is the frame's remaining length,
/// the first half of a header split 2 + 2, and the frame being assembled.
/// Every record advances the offset by its length rounded up to even.
#[derive(Default)]
struct AsixRx {
    remaining: usize,
    split_head: bool,
    header: u32,
    skb: Option<Vec<u8>>,
    frames: Vec<Vec<u8>>,
    errors: Vec<FixupError>,
}

const MTU: usize = 1500;

fn le16(b: &[u8]) -> u32 {
    u32::from(u16::from_le_bytes([b[0], b[1]]))
}

fn header_ok(h: u32) -> bool {
    h & 0x7ff == (!h >> 16) & 0x7ff
}

impl AsixRx {
    fn reset(&mut self) {
        self.skb = None;
        self.remaining = 0;
        self.split_head = false;
        self.header = 0;
    }

    fn fail(&mut self, e: FixupError) -> bool {
        self.errors.push(e);
        self.reset();
        false
    }

    /// One bulk IN transfer; false where the driver returns 0 (rx error).
    fn fixup(&mut self, urb: &[u8]) -> bool {
        let len = urb.len();
        let mut offset = 0;
        if self.remaining > 0 && self.remaining + 4 <= len {
            let at = (self.remaining + 1) & !1;
            let h = u32::from_le_bytes([urb[at], urb[at + 1], urb[at + 2], urb[at + 3]]);
            if !header_ok(h) {
                self.errors.push(FixupError::SyncLost);
                self.reset();
            }
        }
        while offset + 2 <= len {
            if self.remaining == 0 {
                if len - offset == 2 {
                    self.header = le16(&urb[offset..]);
                    self.split_head = true;
                    offset += 2;
                    break;
                }
                if self.split_head {
                    self.header |= le16(&urb[offset..]) << 16;
                    self.split_head = false;
                    offset += 2;
                } else {
                    if len - offset < 4 {
                        return self.fail(FixupError::ShortHeader);
                    }
                    self.header = u32::from_le_bytes([
                        urb[offset],
                        urb[offset + 1],
                        urb[offset + 2],
                        urb[offset + 3],
                    ]);
                    offset += 4;
                }
                let size = (self.header & 0x7ff) as usize;
                if !header_ok(self.header) {
                    return self.fail(FixupError::BadHeader);
                }
                if size > MTU + 14 + 4 {
                    return self.fail(FixupError::BadLength);
                }
                self.skb = Some(Vec::with_capacity(size));
                self.remaining = size;
            }
            let copy = if self.remaining > len - offset {
                let c = len - offset;
                self.remaining -= c;
                c
            } else {
                let c = self.remaining;
                self.remaining = 0;
                c
            };
            if let Some(skb) = &mut self.skb {
                skb.extend_from_slice(&urb[offset..offset + copy]);
                if self.remaining == 0 {
                    self.frames.push(self.skb.take().unwrap_or_default());
                }
            }
            offset += (copy + 1) & !1;
        }
        if offset != len {
            return self.fail(FixupError::BadSkbLength);
        }
        true
    }
}

fn frame(len: usize, tag: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend((6..len).map(|i| (i as u8) ^ tag));
    f
}

fn nic(mode: RxMode) -> Nic {
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1]);
    cfg.paced = false;
    cfg.rx_mode = mode;
    let mut n = Nic::new(&cfg, Instant::now());
    n.mac.rx_ctl = 0x0088;
    n.mac.medium = 0x0336;
    n
}

/// Frames from the wire, then requests of the given lengths; the data of
/// each completed request, in order.
fn transfers(n: &mut Nic, frames: &[Vec<u8>], requests: &[u32]) -> Vec<Vec<u8>> {
    for f in frames {
        n.wire_frame(f.clone(), &mut NoEvents);
    }
    let mut out = Vec::new();
    for &len in requests {
        match n.take_rx(len, &mut NoEvents) {
            Some(RxData::Records(d)) => out.push(d),
            other => panic!("request of {len} bytes got {other:?}"),
        }
    }
    out
}

fn reassemble(urbs: &[Vec<u8>]) -> AsixRx {
    let mut rx = AsixRx::default();
    for u in urbs {
        rx.fixup(u);
    }
    rx
}

#[test]
fn the_stream_is_the_default_mode() {
    assert_eq!(
        DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1]).rx_mode,
        RxMode::Stream
    );
}

#[test]
fn a_frame_that_does_not_fit_continues_in_the_next_transfer() {
    let mut n = nic(RxMode::Stream);
    let frames: Vec<_> = (0..3).map(|i| frame(1000, i)).collect();
    let urbs = transfers(&mut n, &frames, &[2048, 2048]);
    assert_eq!(urbs[0].len(), 2048, "the first request is filled");
    assert_eq!(
        urbs[1].len(),
        3 * 1004 - 2048,
        "the rest of the third record"
    );
    assert_eq!(&urbs[0][2008..2012], &framing::header(1000));
    assert_eq!(&urbs[1][..], &frames[2][2048 - 2012..]);
    let rx = reassemble(&urbs);
    assert_eq!(rx.errors, []);
    assert_eq!(rx.frames, frames);
    assert_eq!(n.take_rx(2048, &mut NoEvents), None, "nothing left");
}

#[test]
fn an_odd_frame_split_carries_its_pad_into_the_next_transfer() {
    let mut n = nic(RxMode::Stream);
    let frames = vec![frame(1001, 1), frame(1001, 2)];
    // 1006 + 494: the second record's header and 490 of its 1001 bytes.
    let urbs = transfers(&mut n, &frames, &[1500, 1500]);
    assert_eq!(urbs.iter().map(Vec::len).collect::<Vec<_>>(), [1500, 512]);
    assert_eq!(urbs[1][510], frames[1][1000], "the last byte of the frame");
    assert_eq!(urbs[1][511], 0, "then its pad");
    let rx = reassemble(&urbs);
    assert_eq!(rx.errors, []);
    assert_eq!(rx.frames, frames);
}

#[test]
fn a_cut_between_an_odd_frames_last_byte_and_its_pad() {
    let mut n = nic(RxMode::Stream);
    let frames = vec![frame(1001, 3), frame(60, 4)];
    let urbs = transfers(&mut n, &frames, &[1004, 2048]);
    assert_eq!(urbs[0].len(), 1004);
    assert_eq!(&urbs[1][..2], &[frames[0][1000], 0]);
    assert_eq!(&urbs[1][2..6], &framing::header(60));
    let rx = reassemble(&urbs);
    assert_eq!(rx.errors, []);
    assert_eq!(rx.frames, frames);
}

#[test]
fn a_header_splits_two_and_two() {
    let mut n = nic(RxMode::Stream);
    // 1004 + 1042 = 2046: two bytes of the third header fit the request.
    let frames = vec![frame(1000, 5), frame(1038, 6), frame(100, 7)];
    let urbs = transfers(&mut n, &frames, &[2048, 2048]);
    assert_eq!(urbs[0].len(), 2048);
    assert_eq!(&urbs[0][2046..], &framing::header(100)[..2]);
    assert_eq!(&urbs[1][..2], &framing::header(100)[2..]);
    assert_eq!(urbs[1].len(), 2 + 100);
    let rx = reassemble(&urbs);
    assert_eq!(rx.errors, []);
    assert_eq!(rx.frames, frames);
}

#[test]
fn a_record_may_span_three_short_requests() {
    let mut n = nic(RxMode::Stream);
    let frames = vec![frame(1518, 8)];
    let urbs = transfers(&mut n, &frames, &[512, 512, 512]);
    assert_eq!(
        urbs.iter().map(Vec::len).collect::<Vec<_>>(),
        [512, 512, 498]
    );
    assert_eq!(reassemble(&urbs).frames, frames);
}

#[test]
fn an_odd_request_gets_whole_fifo_words_and_a_one_byte_request_babbles() {
    let mut n = nic(RxMode::Stream);
    let frames = vec![frame(100, 9)];
    let urbs = transfers(&mut n, &frames, &[51]);
    assert_eq!(urbs[0].len(), 50);
    assert_eq!(n.take_rx(1, &mut NoEvents), Some(RxData::Babble));
    assert_eq!(n.take_rx(0, &mut NoEvents), Some(RxData::Babble));
    let rest = transfers(&mut n, &[], &[2048]);
    assert_eq!(rest[0].len(), 104 - 50, "a babble loses nothing");
    let rx = reassemble(&[urbs[0].clone(), rest[0].clone()]);
    assert_eq!((rx.errors, rx.frames), (vec![], frames));
}

#[test]
fn whole_mode_never_splits_and_loses_the_frame_a_request_cannot_hold() {
    let mut n = nic(RxMode::Whole);
    let frames: Vec<_> = (0..3).map(|i| frame(1000, i)).collect();
    let urbs = transfers(&mut n, &frames, &[2048]);
    assert_eq!(urbs[0].len(), 2 * 1004);
    assert_eq!(n.take_rx(512, &mut NoEvents), Some(RxData::Babble));
    assert_eq!(
        n.take_rx(2048, &mut NoEvents),
        None,
        "the third frame is lost"
    );
}

#[test]
fn frames_are_counted_when_their_last_byte_goes() {
    #[derive(Default)]
    struct Rx(Vec<usize>);
    impl NicEvents for Rx {
        fn rx_frame(&mut self, frame: &[u8]) {
            self.0.push(frame.len());
        }
    }
    let mut n = nic(RxMode::Stream);
    n.wire_frame(frame(1000, 1), &mut NoEvents);
    let mut ev = Rx::default();
    n.take_rx(512, &mut ev);
    assert_eq!(ev.0, Vec::<usize>::new());
    n.take_rx(2048, &mut ev);
    assert_eq!(ev.0, [1000]);
}

#[test]
fn a_flush_drops_the_rest_of_a_record_and_the_driver_resynchronises() {
    let mut n = nic(RxMode::Stream);
    let first = transfers(&mut n, &[frame(1000, 1)], &[512]);
    // SW_RESET RR: the FIFO is flushed with 492 bytes of the record unsent.
    n.apply(Effects {
        flush_rx: true,
        flush_tx: false,
    });
    assert_eq!(n.take_rx(2048, &mut NoEvents), None);
    let later = vec![frame(600, 2), frame(60, 3)];
    let second = transfers(&mut n, &later, &[2048]);
    assert_eq!(&second[0][..4], &framing::header(600), "a fresh record");
    let rx = reassemble(&[first[0].clone(), second[0].clone()]);
    // The driver looks for a header 492 bytes in, finds none, drops its
    // partial frame and takes the transfer from its start.
    assert_eq!(rx.errors, [FixupError::SyncLost]);
    assert_eq!(rx.frames, later);
}

#[test]
fn closing_the_rx_gate_drops_the_rest_of_a_record() {
    #[derive(Default)]
    struct Drops(Vec<(Drop, u64)>);
    impl NicEvents for Drops {
        fn dropped(&mut self, why: Drop, n: u64) {
            self.0.push((why, n));
        }
    }
    let mut n = nic(RxMode::Stream);
    transfers(&mut n, &[frame(1000, 1), frame(60, 2)], &[512]);
    n.mac.medium = 0;
    let mut ev = Drops::default();
    assert_eq!(n.take_rx(2048, &mut ev), None);
    assert_eq!(ev.0, [(Drop::RxGated, 2)], "the queued frame and the tail");
    n.mac.medium = 0x0336;
    assert_eq!(
        n.take_rx(2048, &mut ev),
        None,
        "nothing left after reopening"
    );
    // Only the rest of a record, nothing queued behind it.
    let mut n = nic(RxMode::Stream);
    transfers(&mut n, &[frame(1000, 1)], &[512]);
    n.mac.medium = 0;
    let mut ev = Drops::default();
    assert_eq!(n.take_rx(2048, &mut ev), None);
    assert_eq!(ev.0, [(Drop::RxGated, 1)], "the tail alone");
    n.mac.medium = 0x0336;
    assert_eq!(n.take_rx(2048, &mut ev), None, "the tail is gone");
}

// The driver model is strict where the driver is: these are the cuts the
// chip never makes.
#[test]
fn the_driver_model_rejects_cuts_at_odd_offsets() {
    let mut rec = Vec::new();
    framing::push_rx_record(&mut rec, &frame(100, 1));
    framing::push_rx_record(&mut rec, &frame(60, 2));
    // A header split 3 + 1.
    let rx = reassemble(&[rec[..107].to_vec(), rec[107..].to_vec()]);
    assert!(!rx.errors.is_empty(), "{:?}", rx.errors);
    // A frame cut after an odd number of its bytes.
    let rx = reassemble(&[rec[..55].to_vec(), rec[55..].to_vec()]);
    assert_eq!(rx.errors[0], FixupError::BadSkbLength);
    // Stray zero bytes after the last record: no header.
    let mut extra = rec.clone();
    extra.extend([0, 0, 0, 0]);
    assert_eq!(reassemble(&[extra]).errors, [FixupError::BadHeader]);
    // Uncut, it reads both frames.
    assert_eq!(reassemble(&[rec]).frames.len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any frame lengths, any request lengths, frames arriving between
    /// requests: every transfer fits its request in whole 16-bit words, and
    /// the driver's reassembly gets every frame back, in order, without an
    /// error.
    #[test]
    fn the_driver_reassembles_every_cut_the_stream_makes(
        lens in proptest::collection::vec(14usize..=MAX_FRAME, 1..24),
        reqs in proptest::collection::vec(2u32..=4096, 1..64),
    ) {
        let mut n = nic(RxMode::Stream);
        let frames: Vec<_> = lens.iter().enumerate().map(|(i, &l)| frame(l, i as u8)).collect();
        let mut urbs = Vec::new();
        let mut next = 0;
        let mut req = reqs.iter().cycle();
        let mut turns = 0;
        while turns < 10_000 {
            turns += 1;
            // A new frame arrives every other turn until all have.
            if next < frames.len() && turns % 2 == 1 {
                n.wire_frame(frames[next].clone(), &mut NoEvents);
                next += 1;
            }
            let len = *req.next().unwrap_or(&2048);
            match n.take_rx(len, &mut NoEvents) {
                Some(RxData::Records(d)) => {
                    prop_assert!(d.len() <= len as usize && d.len() <= MAX_RX_TRANSFER);
                    prop_assert!(!d.is_empty() && d.len() % 2 == 0, "{}", d.len());
                    urbs.push(d);
                }
                Some(RxData::Babble) => prop_assert!(false, "an even request never babbles"),
                None if next == frames.len() => break,
                None => {}
            }
        }
        let rx = reassemble(&urbs);
        prop_assert_eq!(rx.errors, vec![]);
        prop_assert_eq!(rx.frames, frames);
    }
}
