//! Paced bulk OUT completions leave the event loop by their deadline: the
//! loop never sleeps past a completion the device has due, and nothing the
//! device produced waits for the next event. Time is the test's own clock.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ax88772::framing;
use common::*;
use usbredir::{BulkPacket, Message};

#[test]
fn completions_are_never_held_past_their_deadline() {
    let t0 = Instant::now();
    let mut cfg = config(true);
    cfg.pace_burst = Duration::ZERO;
    let (mut server, mut peer, _wire, clock) = rig(cfg, t0);
    bring_up(&mut server, &mut peer);

    let len = 1514;
    let wt = framing::wire_time(len, 100_000_000);
    let n = 40u32;
    let mut deadline = HashMap::new();
    for k in 0..n {
        let data = framing::tx_transfer(&vec![0x02; len]);
        let id = peer.send(Message::BulkPacket(BulkPacket {
            endpoint: 0x03,
            length: data.len() as u32,
            data,
            ..Default::default()
        }));
        deadline.insert(id, t0 + wt * (k + 1));
    }
    // The loop reads the whole batch at t0.
    server.step().unwrap();

    let step = Duration::from_micros(5);
    let slack = step;
    let mut seen = HashMap::new();
    let mut t = t0;
    while t < t0 + wt * (n + 2) {
        clock.set(t);
        let sleep = server.prepare(t);
        for p in peer.take() {
            if let Message::BulkPacket(b) = &p.msg {
                assert_eq!(b.status, usbredir::Status::SUCCESS);
                seen.insert(p.id, t);
            }
        }
        let next_due = deadline
            .iter()
            .filter(|(id, _)| !seen.contains_key(id))
            .map(|(_, d)| *d)
            .min();
        if let Some(d) = next_due {
            assert!(
                d > t,
                "completion due at {:?} not sent at {:?}",
                d - t0,
                t - t0
            );
            assert!(
                sleep <= d - t,
                "the loop would sleep {sleep:?} with a completion due in {:?}",
                d - t
            );
        }
        t += step;
    }
    assert_eq!(seen.len(), n as usize, "every transfer completed");
    for (id, d) in &deadline {
        let at = seen[id];
        assert!(at >= *d, "completed before its frame left the MAC");
        assert!(at <= *d + slack, "held {:?} past its deadline", at - *d);
    }
}

/// A replug whose disconnect is acknowledged at once, with transfers still
/// arriving from a peer that has not caught up (a USB gadget's pumps), is
/// plugged back in when its down time ends.
#[test]
fn a_replug_acknowledged_at_once_plugs_back_in_after_its_down_time() {
    let t0 = Instant::now();
    let (mut server, mut peer, _wire, clock) = rig(config(false), t0);
    bring_up(&mut server, &mut peer);
    for _ in 0..16 {
        peer.send(Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: 16384,
            ..Default::default()
        }));
    }
    server.step().unwrap();
    peer.take();
    let down = Duration::from_millis(300);
    let now = server.now();
    server.device_mut().replug(now, down);
    server.step().unwrap();
    let out: Vec<_> = peer.take().iter().map(|p| p.msg.name()).collect();
    assert!(out.contains(&"device_disconnect"), "{out:?}");
    peer.send(Message::DeviceDisconnectAck);
    let data = framing::tx_transfer(&[0x02; 60]);
    peer.send(Message::BulkPacket(BulkPacket {
        endpoint: 0x03,
        length: data.len() as u32,
        data,
        ..Default::default()
    }));
    peer.send(Message::Reset);
    for ms in [10, 100, 299] {
        clock.set(t0 + Duration::from_millis(ms));
        server.step().unwrap();
        let out: Vec<_> = peer.take().iter().map(|p| p.msg.name()).collect();
        assert!(!out.contains(&"device_connect"), "at {ms} ms: {out:?}");
    }
    clock.set(t0 + down + Duration::from_millis(1));
    server.step().unwrap();
    let out: Vec<_> = peer.take().iter().map(|p| p.msg.name()).collect();
    assert!(out.contains(&"device_connect"), "{out:?}");
}
