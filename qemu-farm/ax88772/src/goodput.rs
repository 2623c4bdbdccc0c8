//! TCP payload the wire carried for the first time, one direction's count:
//! the goodput the host can vouch for without believing the guest. A
//! segment's payload counts only past the highest sequence number already
//! seen on its connection, so a retransmission (the sender lost it, or the
//! receiving driver dropped it after the wire) adds nothing, and no frame
//! adds more than the payload it carries. What the wire carried again is
//! counted apart (`again`).

/// Connections remembered at once (the oldest is forgotten first): the farm
/// runs one bulk flow at a time, and a guest opening thousands costs a
/// bounded table.
pub const MAX_FLOWS: usize = 64;

/// Source address, destination address, source port, destination port.
type Flow = [u8; 12];

#[derive(Debug, Default)]
pub struct NewPayload {
    /// Each connection and the sequence number just past its highest byte.
    flows: Vec<(Flow, u32)>,
    /// Payload bytes of known connections the wire carried again
    /// (retransmissions) since [`NewPayload::take_again`] was last called:
    /// with a lossless wire, what a receiver lost after it, or what the
    /// emulator itself dropped.
    again: u64,
}

impl NewPayload {
    /// The payload carried again since the last call.
    pub fn take_again(&mut self) -> u64 {
        std::mem::take(&mut self.again)
    }

    /// The bytes of `frame` (Ethernet II, IPv4, TCP; anything else is 0)
    /// that carry new payload.
    pub fn frame(&mut self, frame: &[u8]) -> u64 {
        let Some(s) = segment(frame) else {
            return 0;
        };
        let at = self.flows.iter().position(|(f, _)| *f == s.flow);
        if s.syn {
            // A new connection on the same ports starts its own numbering.
            if let Some(i) = at {
                self.flows.remove(i);
            }
            return 0;
        }
        if s.len == 0 {
            return 0;
        }
        let end = s.seq.wrapping_add(s.len);
        match at {
            Some(i) => {
                let high = &mut self.flows[i].1;
                // Serial-number arithmetic (RFC 1982): ahead by less than
                // 2^31 is newer.
                let ahead = end.wrapping_sub(*high);
                if ahead == 0 || ahead >= 1 << 31 {
                    self.again += u64::from(s.len);
                    return 0;
                }
                *high = end;
                let new = ahead.min(s.len);
                self.again += u64::from(s.len - new);
                u64::from(new)
            }
            None => {
                if self.flows.len() == MAX_FLOWS {
                    self.flows.remove(0);
                }
                self.flows.push((s.flow, end));
                u64::from(s.len)
            }
        }
    }
}

struct Segment {
    flow: Flow,
    seq: u32,
    len: u32,
    syn: bool,
}

/// A TCP segment in an untagged IPv4 frame that is not a fragment, read
/// with every length checked against the frame.
fn segment(f: &[u8]) -> Option<Segment> {
    if f.len() < 14 + 20 || f[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
    if ip[0] >> 4 != 4 || ihl < 20 || total < ihl + 20 || total > ip.len() || ip[9] != 6 {
        return None;
    }
    if fragment {
        return None;
    }
    let tcp = &ip[ihl..total];
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < 20 || doff > tcp.len() {
        return None;
    }
    let mut flow = [0u8; 12];
    flow[..8].copy_from_slice(&ip[12..20]);
    flow[8..].copy_from_slice(&tcp[..4]);
    Some(Segment {
        flow,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        len: (tcp.len() - doff) as u32,
        syn: tcp[13] & 0x02 != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame carrying a TCP segment of `len` payload bytes.
    fn tcp(sport: u16, seq: u32, len: usize, flags: u8) -> Vec<u8> {
        let total = 20 + 20 + len;
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 77, 0, 1, 10, 77, 0, 2,
        ];
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        f.extend_from_slice(&ip);
        let mut t = vec![0u8; 20];
        t[..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        f.extend_from_slice(&t);
        f.extend(std::iter::repeat_n(0xaa, len));
        f
    }

    const ACK: u8 = 0x10;
    const SYN: u8 = 0x02;

    #[test]
    fn a_retransmission_adds_nothing_and_new_bytes_count_once() {
        let mut n = NewPayload::default();
        assert_eq!(n.frame(&tcp(40000, 999, 0, SYN)), 0);
        assert_eq!(n.frame(&tcp(40000, 1000, 1460, ACK)), 1460);
        assert_eq!(n.frame(&tcp(40000, 2460, 1460, ACK)), 1460);
        // The first segment again: a retransmission.
        assert_eq!(n.frame(&tcp(40000, 1000, 1460, ACK)), 0);
        // Overlapping the highest byte (3920): only the 540 past it.
        assert_eq!(n.frame(&tcp(40000, 3000, 1460, ACK)), 540);
        // The retransmission and the 920 bytes of overlap were carried again.
        assert_eq!(n.take_again(), 1460 + 920);
        assert_eq!(n.take_again(), 0);
        // A pure ACK, and the other port's flow counted apart.
        assert_eq!(n.frame(&tcp(40000, 4460, 0, ACK)), 0);
        assert_eq!(n.frame(&tcp(40001, 7, 100, ACK)), 100);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut n = NewPayload::default();
        assert_eq!(n.frame(&tcp(1, u32::MAX - 99, 100, ACK)), 100);
        assert_eq!(n.frame(&tcp(1, 0, 1000, ACK)), 1000);
        // Half the number space behind is old.
        assert_eq!(n.frame(&tcp(1, 1u32 << 31, 1000, ACK)), 0);
    }

    #[test]
    fn a_syn_on_the_same_ports_starts_a_new_count() {
        let mut n = NewPayload::default();
        assert_eq!(n.frame(&tcp(9, 5_000_000, 1000, ACK)), 1000);
        assert_eq!(n.frame(&tcp(9, 10, 0, SYN)), 0);
        assert_eq!(n.frame(&tcp(9, 11, 1000, ACK)), 1000);
    }

    #[test]
    fn what_is_not_tcp_over_ipv4_or_lies_about_its_lengths_counts_nothing() {
        let mut n = NewPayload::default();
        let good = tcp(5, 1, 100, ACK);
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let mut udp = good.clone();
        udp[14 + 9] = 17;
        let mut long = good.clone();
        long[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
        let mut doff = good.clone();
        doff[14 + 20 + 12] = 4 << 4; // a header shorter than TCP's 20 bytes
        let mut frag = good.clone();
        frag[14 + 6] = 0x20;
        let mut v6 = good.clone();
        v6[14] = 0x65;
        // An IP header of 16 bytes, whose "TCP header" at byte 16 would
        // parse (a data offset of 5 where the acknowledgement number is).
        let mut short_ihl = good.clone();
        short_ihl[14] = 0x44;
        short_ihl[14 + 20 + 8] = 5 << 4;
        // A total length shorter than the IP header itself.
        let mut total_short = good.clone();
        total_short[14 + 2..14 + 4].copy_from_slice(&10u16.to_be_bytes());
        let bad = [arp, udp, long, doff, frag, v6, short_ihl, total_short];
        for f in bad.into_iter().chain([good[..40].to_vec(), vec![]]) {
            assert_eq!(n.frame(&f), 0, "{f:02x?}");
        }
        assert_eq!(n.frame(&good), 100);
    }

    #[test]
    fn a_segment_after_ip_options_counts() {
        // The same segment with a 24-byte IP header (one 4-byte option).
        let plain = tcp(6, 1, 100, ACK);
        let mut f = plain[..14 + 20].to_vec();
        f[14] = 0x46;
        f[14 + 2..14 + 4].copy_from_slice(&(24u16 + 20 + 100).to_be_bytes());
        f.extend_from_slice(&[1, 1, 1, 0]);
        f.extend_from_slice(&plain[14 + 20..]);
        assert_eq!(NewPayload::default().frame(&f), 100);
    }

    #[test]
    fn the_table_of_connections_is_bounded() {
        let mut n = NewPayload::default();
        for p in 0..(MAX_FLOWS as u16 * 4) {
            assert_eq!(n.frame(&tcp(p, 1, 10, ACK)), 10);
        }
        assert_eq!(n.flows.len(), MAX_FLOWS);
    }
}
