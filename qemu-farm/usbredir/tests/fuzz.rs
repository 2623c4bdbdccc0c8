//! Property tests: arbitrary bytes in arbitrary chunkings never panic or
//! hang the decoder, and valid messages survive a round trip.

mod common;
use common::*;
use proptest::prelude::*;
use usbredir::*;

/// Decode everything available; returns the results in order.
fn drain(c: &mut Codec) -> Vec<Result<Packet, Error>> {
    let mut v = Vec::new();
    // Each Some consumes at least a header or poisons the codec, so this
    // terminates; the bound turns a regression into a failure, not a hang.
    for _ in 0..100_000 {
        match c.next_packet() {
            Some(r) => v.push(r),
            None => return v,
        }
    }
    panic!("decoder did not settle");
}

fn decode_chunked(start: Codec, bytes: &[u8], cuts: &[usize]) -> Vec<Result<Packet, Error>> {
    let mut c = start;
    let mut out = Vec::new();
    let mut pos = 0;
    for &cut in cuts {
        let end = (pos + cut).min(bytes.len());
        c.feed(&bytes[pos..end]);
        out.extend(drain(&mut c));
        pos = end;
    }
    c.feed(&bytes[pos..]);
    out.extend(drain(&mut c));
    out
}

/// Bytes that look like packets often enough to reach the deep paths.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let pkt = (
        prop_oneof![0u32..30, 100u32..106, any::<u32>()],
        prop_oneof![0u32..200, Just(u32::MAX), any::<u32>()],
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..200),
    )
        .prop_map(|(t, l, id, body)| {
            let mut v = t.to_le_bytes().to_vec();
            v.extend(l.to_le_bytes());
            v.extend(id.to_le_bytes());
            v.extend(body);
            v
        });
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        proptest::collection::vec(pkt, 0..8).prop_map(|v| v.concat()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn host_decoder_never_panics(
        bytes in stream(),
        cuts in proptest::collection::vec(0usize..64, 0..20),
        after_hello in any::<bool>(),
    ) {
        let c = if after_hello {
            host_after_hello().with_max_packet_len(4096)
        } else {
            Codec::new(Role::Host, Caps(0x72)).with_max_packet_len(4096)
        };
        let whole = decode_chunked(host_after_hello().with_max_packet_len(4096), &bytes, &[]);
        let chunked = decode_chunked(c, &bytes, &cuts);
        if after_hello {
            // Chunking never changes what is decoded.
            prop_assert_eq!(whole, chunked);
        }
    }

    #[test]
    fn guest_decoder_never_panics(bytes in stream(), cuts in proptest::collection::vec(0usize..64, 0..20)) {
        decode_chunked(guest_after_hello(), &bytes, &cuts);
    }

    #[test]
    fn bulk_round_trip(id in any::<u64>(), ep_out in any::<bool>(), data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let mut g = guest_after_hello();
        let mut h = host_after_hello();
        let (endpoint, length, data) = if ep_out {
            (0x03, data.len() as u32, data)
        } else {
            (0x82, data.len() as u32, vec![])
        };
        let p = Packet::new(id, Message::BulkPacket(BulkPacket { endpoint, length, data, ..Default::default() }));
        let mut out = Vec::new();
        g.encode(&p, &mut out).unwrap();
        h.feed(&out);
        prop_assert_eq!(h.next_packet(), Some(Ok(p)));
    }

    #[test]
    fn control_reply_round_trip(id in any::<u64>(), req in any::<u8>(), value in any::<u16>(), data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut g = guest_after_hello();
        let mut h = host_after_hello();
        let p = Packet::new(id, Message::ControlPacket(ControlPacket {
            endpoint: 0x80, request: req, requesttype: 0xc0, value,
            length: data.len() as u16, data, ..Default::default()
        }));
        let mut out = Vec::new();
        h.encode(&p, &mut out).unwrap();
        g.feed(&out);
        prop_assert_eq!(g.next_packet(), Some(Ok(p)));
    }
}
