//! Tests of the NIC datapath itself: the delay line and the events it
//! reports without a session.

use super::*;
use crate::descriptors::Variant;

/// Counts what the datapath reports.
#[derive(Default)]
struct Seen {
    tx: usize,
    wire: usize,
    drops: Vec<(Drop, u64)>,
}

impl NicEvents for Seen {
    fn tx_frame(&mut self, _frame: &[u8]) {
        self.tx += 1;
    }
    fn on_wire(&mut self, _frame: &[u8]) {
        self.wire += 1;
    }
    fn dropped(&mut self, why: Drop, frames: u64) {
        self.drops.push((why, frames));
    }
}

fn nic() -> (Nic, Instant) {
    let t = Instant::now();
    let mut cfg = DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1]);
    cfg.paced = false;
    let mut n = Nic::new(&cfg, t);
    n.mac.rx_ctl = 0x0088;
    n.mac.medium = 0x0336;
    (n, t)
}

#[test]
fn a_delay_line_lets_frames_go_when_due_and_frees_their_room() {
    let t = Instant::now();
    let later = t + Duration::from_millis(5);
    let mut d = DelayLine::default();
    let f: Vec<u8> = (0..1500).map(|i| i as u8).collect();
    let n = DELAY_BYTES / f.len();
    for _ in 0..n {
        assert!(d.has_room(f.len()));
        d.push(later, f.clone());
    }
    assert!(!d.has_room(f.len()), "bounded in bytes");
    assert_eq!(d.pop_due(t), None, "not due yet");
    for _ in 0..n {
        assert_eq!(d.pop_due(later).as_deref(), Some(&f[..]));
    }
    assert_eq!(d.pop_due(later), None);
    assert!(d.has_room(DELAY_BYTES), "the bytes let go are free again");
    for _ in 0..DELAY_FRAMES {
        d.push(t, Vec::new());
    }
    assert!(!d.has_room(0), "bounded in frames");
    d.pop_due(t);
    assert!(d.has_room(0));
}

#[test]
fn events_report_frames_and_drops_without_a_session() {
    let (mut n, _) = nic();
    let mut ev = Seen::default();
    let mut f = vec![0xff; 6];
    f.extend([0u8; 54]);
    n.bulk_out(&framing::tx_transfer(&f), &mut ev);
    n.send_due(&mut ev);
    assert_eq!((ev.tx, ev.wire, n.take_wire().len()), (1, 1, 1));
    n.bulk_out(&[0xde, 0xad, 0xbe, 0xef], &mut ev);
    n.wire_frame(vec![0; 10], &mut ev);
    assert_eq!(ev.drops, [(Drop::TxBadHeader, 1), (Drop::RxLength, 1)]);
    // The no-op reporter is enough to run the datapath.
    n.wire_frame(f.clone(), &mut NoEvents);
    assert!(matches!(
        n.take_rx(2048, &mut NoEvents),
        Some(RxData::Records(_))
    ));
    assert_eq!(n.take_rx(2048, &mut NoEvents), None);
}
