//! ASIX bulk framing: the TX stream on bulk OUT, RX records on bulk IN,
//! and the time a frame occupies the wire.

use std::time::Duration;

/// Largest frame accepted in either direction (1514 + VLAN tag).
pub const MAX_FRAME: usize = 1518;
/// Largest bulk IN transfer the chip produces (RX_CTL.MFB = 0).
pub const MAX_RX_TRANSFER: usize = 2048;

/// The 4-byte header: length and its complement, little-endian.
pub fn header(len: usize) -> [u8; 4] {
    let len = len as u32 & 0x7ff;
    (len | ((len ^ 0xffff) << 16)).to_le_bytes()
}

/// Bytes a frame takes in an RX transfer: header, frame, pad to even.
pub fn rx_record_len(frame_len: usize) -> usize {
    4 + frame_len + (frame_len & 1)
}

/// Append one RX record.
pub fn push_rx_record(buf: &mut Vec<u8>, frame: &[u8]) {
    buf.extend_from_slice(&header(frame.len()));
    buf.extend_from_slice(frame);
    if frame.len() & 1 == 1 {
        buf.push(0);
    }
}

/// One bulk OUT transfer as the guest driver builds it: header, frame, and
/// the 4-byte zero-length pad when `(len + 4) % 512 == 0`.
pub fn tx_transfer(frame: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(frame.len() + 8);
    v.extend_from_slice(&header(frame.len()));
    v.extend_from_slice(frame);
    if (frame.len() + 4) % 512 == 0 {
        v.extend_from_slice(&[0x00, 0x00, 0xff, 0xff]);
    }
    v
}

/// What one call to [`TxParser::push`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TxOutcome {
    pub frames: Vec<Vec<u8>>,
    /// A header failed its complement check; the rest of the transfer was
    /// dropped.
    pub bad_header: bool,
    /// Frames longer than [`MAX_FRAME`], dropped.
    pub oversized: u32,
    /// Zero-length (pad) headers skipped.
    pub pads: u32,
}

/// Parses the bulk OUT byte stream into frames. A frame may span
/// transfers, as on the real chip.
#[derive(Debug, Default)]
pub struct TxParser {
    hdr: Vec<u8>,
    frame: Vec<u8>,
    want: usize,
}

impl TxParser {
    pub fn reset(&mut self) {
        *self = TxParser::default();
    }

    /// Bytes of an unfinished frame or header carried to the next transfer.
    pub fn pending(&self) -> usize {
        self.hdr.len() + self.frame.len()
    }

    pub fn push(&mut self, data: &[u8]) -> TxOutcome {
        self.push_limit(data, usize::MAX).1
    }

    /// Parse until `max_frames` frames came out; returns the bytes taken
    /// and what they held. Zero-length (pad) headers right after the last
    /// frame are taken too, so a transfer whose frames are all out is
    /// finished. After a bad header the rest of `data` counts as taken.
    pub fn push_limit(&mut self, mut data: &[u8], max_frames: usize) -> (usize, TxOutcome) {
        let total = data.len();
        let mut out = TxOutcome::default();
        while !data.is_empty() {
            if out.frames.len() >= max_frames {
                let at_header = self.want == 0 && self.hdr.is_empty();
                if at_header && data.len() >= 4 && data[..4] == PAD_HEADER {
                    data = &data[4..];
                    out.pads += 1;
                    continue;
                }
                break;
            }
            if self.want == 0 {
                let n = (4 - self.hdr.len()).min(data.len());
                self.hdr.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.hdr.len() < 4 {
                    break;
                }
                let h = u32::from_le_bytes([self.hdr[0], self.hdr[1], self.hdr[2], self.hdr[3]]);
                self.hdr.clear();
                let len = (h & 0x7ff) as usize;
                if (!h >> 16) & 0x7ff != h & 0x7ff {
                    out.bad_header = true;
                    self.reset();
                    data = &[];
                    break;
                }
                if len == 0 {
                    out.pads += 1;
                    continue;
                }
                self.want = len;
                self.frame = Vec::with_capacity(len);
            }
            let n = (self.want - self.frame.len()).min(data.len());
            self.frame.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.frame.len() == self.want {
                let frame = std::mem::take(&mut self.frame);
                self.want = 0;
                if frame.len() > MAX_FRAME {
                    out.oversized += 1;
                } else {
                    out.frames.push(frame);
                }
            }
        }
        (total - data.len(), out)
    }
}

/// The zero-length header the driver appends when a transfer would end on
/// a packet boundary.
const PAD_HEADER: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Time a frame of `len` bytes (no FCS) occupies a `rate` bit/s wire:
/// padded to 60 bytes, plus FCS, preamble and inter-frame gap.
pub fn wire_time(len: usize, rate: u64) -> Duration {
    let bits = (len.max(60) + 4 + 8 + 12) as u64 * 8;
    Duration::from_nanos(bits * 1_000_000_000 / rate.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| i as u8).collect()
    }

    #[test]
    fn header_examples() {
        assert_eq!(header(90), [0x5a, 0x00, 0xa5, 0xff]);
        assert_eq!(header(508), [0xfc, 0x01, 0x03, 0xfe]);
        assert_eq!(header(60), [0x3c, 0x00, 0xc3, 0xff]);
    }

    #[test]
    fn pad_case_508_bytes() {
        let t = tx_transfer(&frame(508));
        assert_eq!(t.len(), 516);
        assert_eq!(&t[512..], &[0x00, 0x00, 0xff, 0xff]);
        let out = TxParser::default().push(&t);
        assert_eq!(out.frames, vec![frame(508)]);
        assert_eq!(out.pads, 1);
        assert_eq!(tx_transfer(&frame(509)).len(), 513);
    }

    #[test]
    fn odd_lengths_round_trip_through_rx_records() {
        let mut buf = Vec::new();
        push_rx_record(&mut buf, &frame(42));
        push_rx_record(&mut buf, &frame(61));
        assert_eq!(buf.len(), 112, "the observed 42 + 61 reply");
        assert_eq!(buf.len(), rx_record_len(42) + rx_record_len(61));
        assert_eq!(buf[4 + 42 + 4 + 61], 0, "pad byte");
        // The same records parse back as a TX stream would.
        let mut p = TxParser::default();
        let mut again = Vec::new();
        for chunk in [&buf[..46], &buf[46..111]] {
            again.extend(p.push(chunk).frames);
        }
        assert_eq!(again, vec![frame(42), frame(61)]);
    }

    #[test]
    fn frame_split_across_transfers() {
        let t = tx_transfer(&frame(100));
        let mut p = TxParser::default();
        assert!(p.push(&t[..3]).frames.is_empty());
        assert!(p.push(&t[3..50]).frames.is_empty());
        assert_eq!(p.pending(), 46);
        assert_eq!(p.push(&t[50..]).frames, vec![frame(100)]);
        assert_eq!(p.pending(), 0);
    }

    #[test]
    fn the_rest_of_a_split_frame_is_followed_by_the_next_frame() {
        let mut t = tx_transfer(&frame(100));
        t.extend(tx_transfer(&frame(60)));
        let mut p = TxParser::default();
        assert!(p.push(&t[..50]).frames.is_empty());
        assert_eq!(p.push(&t[50..]).frames, vec![frame(100), frame(60)]);
        assert_eq!(p.pending(), 0);
    }

    #[test]
    fn bad_header_drops_the_rest() {
        let mut t = vec![0x10, 0x00, 0x00, 0x00];
        t.extend(tx_transfer(&frame(20)));
        let out = TxParser::default().push(&t);
        assert!(out.bad_header);
        assert!(out.frames.is_empty());
    }

    #[test]
    fn oversized_frame_dropped() {
        let t = tx_transfer(&frame(2000));
        let out = TxParser::default().push(&t);
        assert_eq!((out.frames.len(), out.oversized), (0, 1));
    }

    #[test]
    fn the_longest_frame_passes_and_one_byte_more_is_dropped() {
        let mut p = TxParser::default();
        assert_eq!(p.push(&tx_transfer(&frame(MAX_FRAME))).frames.len(), 1);
        let out = p.push(&tx_transfer(&frame(MAX_FRAME + 1)));
        assert_eq!((out.frames.len(), out.oversized), (0, 1));
    }

    #[test]
    fn a_reset_drops_half_a_frame() {
        let t = tx_transfer(&frame(100));
        let mut p = TxParser::default();
        p.push(&t[..50]);
        p.reset();
        assert_eq!(p.pending(), 0);
        assert_eq!(p.push(&t).frames, vec![frame(100)]);
    }

    #[test]
    fn a_limited_push_stops_after_its_frames_and_takes_a_trailing_pad() {
        let mut t = tx_transfer(&frame(508));
        t.extend(tx_transfer(&frame(60)));
        let mut p = TxParser::default();
        let (n, out) = p.push_limit(&t, 1);
        assert_eq!((n, out.frames, out.pads), (516, vec![frame(508)], 1));
        let (n, out) = p.push_limit(&t[516..], 0);
        assert_eq!((n, out.frames.len()), (0, 0), "no room: nothing taken");
        let (n, out) = p.push_limit(&t[516..], 5);
        assert_eq!((n, out.frames), (64, vec![frame(60)]));
        // After a bad header the rest of the transfer is taken (dropped).
        let mut bad = vec![0x10, 0, 0, 0];
        bad.extend(tx_transfer(&frame(60)));
        let (n, out) = p.push_limit(&bad, 1);
        assert_eq!((n, out.bad_header, out.frames.len()), (bad.len(), true, 0));
    }

    #[test]
    fn wire_times() {
        assert_eq!(wire_time(1514, 100_000_000), Duration::from_nanos(123_040));
        assert_eq!(wire_time(10, 100_000_000), Duration::from_nanos(6_720));
        assert_eq!(wire_time(1514, 10_000_000), Duration::from_nanos(1_230_400));
    }

    proptest! {
        #[test]
        fn tx_parser_never_panics(data in proptest::collection::vec(any::<u8>(), 0..3000), cut in 0usize..3000) {
            let mut p = TxParser::default();
            let cut = cut.min(data.len());
            let mut n = p.push(&data[..cut]).frames.len();
            n += p.push(&data[cut..]).frames.len();
            prop_assert!(n <= data.len() / 5 + 1);
        }

        /// Parsing a frame at a time gives what one pass gives.
        #[test]
        fn a_frame_at_a_time_parses_like_one_pass(data in proptest::collection::vec(any::<u8>(), 0..3000), lens in proptest::collection::vec(1usize..=1600, 0..5)) {
            let mut stream = Vec::new();
            for &l in &lens {
                stream.extend(tx_transfer(&frame(l)));
            }
            stream.extend(data);
            let whole = TxParser::default().push(&stream);
            let mut p = TxParser::default();
            let (mut pos, mut frames, mut bad, mut oversized) = (0, Vec::new(), false, 0);
            while pos < stream.len() {
                let (n, out) = p.push_limit(&stream[pos..], 1);
                prop_assert!(out.frames.len() <= 1);
                prop_assert!(n > 0, "progress at {pos}");
                pos += n;
                frames.extend(out.frames);
                bad |= out.bad_header;
                oversized += out.oversized;
            }
            prop_assert_eq!(frames, whole.frames);
            prop_assert_eq!((bad, oversized), (whole.bad_header, whole.oversized));
        }

        #[test]
        fn tx_round_trip(lens in proptest::collection::vec(1usize..=1514, 1..6)) {
            let mut p = TxParser::default();
            let mut got = Vec::new();
            for &l in &lens {
                let out = p.push(&tx_transfer(&frame(l)));
                prop_assert!(!out.bad_header);
                got.extend(out.frames);
            }
            prop_assert_eq!(got, lens.iter().map(|&l| frame(l)).collect::<Vec<_>>());
        }
    }
}
