//! Control protocol: one JSON object per line in, one JSON line out.
//!
//! Requests carry a `cmd` field; replies carry `"ok": true` plus data, or
//! `"ok": false` and an `error` string. Unparsable input gets an error
//! reply; it never stops the emulator.
//!
//! Every number a request carries is bounded; a value past its bound, or
//! one that does not fit the field's type, is refused with the field named
//! and nothing changes:
//!
//! | Field | Range |
//! | --- | --- |
//! | `partner.autoneg_ms`, `autoneg_jitter_ms` | 0..=10000 together |
//! | `phy_timing.reset_ms` / `powerup_ms` | 0..=500 / 0..=1000 |
//! | `impair.loss`, `corrupt` | [0, 1] |
//! | `impair.latency_us`, `jitter_us` | 0..=100000 together |
//! | `mdio_fault.regs` | at most 32 registers, each 0..=31 |
//! | `mdio_fault.count` | 0..=1000000 |
//! | `mdio_fault.probability` | [0, 1] |
//! | `cable.distance_m` | [0, 1000] |
//! | `pcap.snaplen` | 1..=65535 |
//! | `usb.down_ms` | 0..=600000 |
//! | `seed` (impair, mdio_fault) | any 64-bit value |
//!
//! This file holds the answering of requests; beside it: `request` (the
//! requests as parsed from their JSON) and `env` ([`CtlEnv`]: what a
//! request may touch besides the device).

use serde_json::{json, Value};
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::faults::MdioRule;
use crate::impair::ImpairConfig;
use crate::log_w;
use crate::pcap;
use crate::phy::Cable;

mod env;
mod request;

pub use env::CtlEnv;
pub use request::{PcapAction, Request, UsbAction};

/// Longest accepted request line.
pub const MAX_LINE: usize = 64 * 1024;

/// Longest wire latency plus jitter accepted, in microseconds.
pub const MAX_DELAY_US: u64 = 100_000;
/// Farthest cable fault accepted, in metres (a 100BASE-TX segment is at
/// most 100 m).
pub const MAX_DISTANCE_M: f64 = 1000.0;
/// Longest `usb replug` down time, in milliseconds.
pub const MAX_DOWN_MS: u64 = 600_000;

fn err(msg: impl std::fmt::Display) -> Value {
    json!({ "ok": false, "error": msg.to_string() })
}

fn ok(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.insert("ok".into(), Value::Bool(true));
        v
    } else {
        json!({ "ok": true, "value": v })
    }
}

/// Answer one request line. `about` is merged into `describe` replies.
pub fn handle_line(dev: &mut Device, now: Instant, line: &str, env: &CtlEnv) -> String {
    let v = match serde_json::from_str::<Request>(line.trim()) {
        Ok(r) => handle(dev, now, r, env),
        Err(e) => {
            let shown: String = line.chars().take(80).collect();
            log_w!("ctl: bad request refused ({e}): {shown:?}");
            match culprit(line) {
                Some(f) => err(format!("bad request: field {f}: {e}")),
                None => err(format!("bad request: {e}")),
            }
        }
    };
    v.to_string()
}

/// The field of a request object that keeps it from parsing: the one
/// whose removal lets the rest parse (every numeric field is optional).
/// Only small objects are searched.
fn culprit(line: &str) -> Option<String> {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line.trim()) else {
        return None;
    };
    if m.len() > 16 {
        return None;
    }
    m.keys()
        .filter(|k| k.as_str() != "cmd")
        .find(|k| {
            let mut rest = m.clone();
            rest.remove(k.as_str());
            serde_json::from_value::<Request>(Value::Object(rest)).is_ok()
        })
        .cloned()
}

fn prob(name: &str, p: Option<f64>, old: f64) -> Result<f64, Value> {
    match p {
        None => Ok(old),
        Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Some(p) => Err(err(format!("{name} {p} is not a probability in [0, 1]"))),
    }
}

// Long: one arm per control command, each the command's whole handling (the table in qemu-farm/README.md).
pub fn handle(dev: &mut Device, now: Instant, r: Request, env: &CtlEnv) -> Value {
    match r {
        Request::Ping => ok(json!({})),
        Request::Link { up } => {
            dev.phy_mut().set_time(now);
            dev.phy_mut().set_carrier(up);
            dev.poll(now);
            ok(json!({ "phy": dev.phy().snapshot() }))
        }
        Request::Partner {
            autoneg,
            modes,
            pause,
            asym_pause,
            autoneg_ms,
            autoneg_jitter_ms,
        } => {
            let delay = autoneg_ms.map_or(dev.config().autoneg, Duration::from_millis);
            let jitter =
                autoneg_jitter_ms.map_or(dev.config().autoneg_jitter, Duration::from_millis);
            if let Err(e) = crate::phy::check_autoneg(delay) {
                return err(e);
            }
            if crate::phy::check_autoneg(delay + jitter).is_err() {
                return err(format!(
                    "autoneg_jitter_ms: autoneg_ms plus autoneg_jitter_ms must be at most {}",
                    crate::phy::MAX_AUTONEG.as_millis()
                ));
            }
            if autoneg_jitter_ms.is_some() {
                dev.set_autoneg_jitter(jitter);
            }
            let mut p = dev.config().partner.clone();
            if let Some(m) = modes {
                // No modes: a partner that advertises nothing, so
                // autonegotiation never completes.
                p.modes = m;
            }
            p.autoneg = autoneg.unwrap_or(p.autoneg);
            p.pause = pause.unwrap_or(p.pause);
            p.asym_pause = asym_pause.unwrap_or(p.asym_pause);
            if let Some(ms) = autoneg_ms {
                dev.set_autoneg_delay(Duration::from_millis(ms));
            }
            dev.set_partner(now, p);
            dev.poll(now);
            ok(json!({ "phy": dev.phy().snapshot() }))
        }
        Request::PhyTiming {
            reset_ms,
            powerup_ms,
        } => {
            let mut t = dev.config().phy_timing;
            if let Some(ms) = reset_ms {
                t.reset = Duration::from_millis(ms);
            }
            if let Some(ms) = powerup_ms {
                t.powerup = Duration::from_millis(ms);
            }
            if let Err(e) = t.check() {
                return err(e);
            }
            dev.set_phy_timing(t);
            ok(json!({ "phy": dev.phy().snapshot() }))
        }
        Request::Quirks {
            lpa_zero,
            reset_after_link_loss,
            stale_lpa,
        } => {
            let mut q = dev.config().quirks;
            q.lpa_zero = lpa_zero.unwrap_or(q.lpa_zero);
            q.reset_after_link_loss = reset_after_link_loss.unwrap_or(q.reset_after_link_loss);
            q.stale_lpa = stale_lpa.unwrap_or(q.stale_lpa);
            dev.set_quirks(now, q);
            ok(json!({ "quirks": q }))
        }
        Request::Impair {
            loss,
            corrupt,
            direction,
            seed,
            latency_us,
            jitter_us,
        } => {
            let old = dev.impair_config().clone();
            let latency_us = latency_us.unwrap_or(old.latency_us);
            let jitter_us = jitter_us.unwrap_or(old.jitter_us);
            if latency_us.saturating_add(jitter_us) > MAX_DELAY_US {
                return err(format!(
                    "latency_us + jitter_us must be at most {MAX_DELAY_US}"
                ));
            }
            let cfg = ImpairConfig {
                loss: match prob("loss", loss, old.loss) {
                    Ok(p) => p,
                    Err(e) => return e,
                },
                corrupt: match prob("corrupt", corrupt, old.corrupt) {
                    Ok(p) => p,
                    Err(e) => return e,
                },
                direction: direction.unwrap_or(old.direction),
                seed: seed.unwrap_or(old.seed),
                latency_us,
                jitter_us,
            };
            dev.set_impair(cfg.clone());
            ok(json!({ "impair": cfg }))
        }
        Request::MdioFault {
            op,
            regs,
            count,
            probability,
            seed,
            clear,
        } => {
            if clear == Some(true) {
                if op.is_some() || regs.is_some() || count.is_some() || probability.is_some() {
                    return err("clear takes no rule fields");
                }
                dev.mdio_faults_mut().clear();
            } else {
                let rule = MdioRule::new(
                    op.unwrap_or_default(),
                    regs.unwrap_or_default(),
                    count,
                    probability.unwrap_or(1.0),
                    seed.unwrap_or(0),
                );
                if let Err(e) = dev.mdio_faults_mut().add(rule) {
                    return err(e);
                }
            }
            ok(json!({ "mdio_faults": dev.mdio_faults() }))
        }
        Request::Cable { state, distance_m } => {
            let d = distance_m.unwrap_or(0.0);
            if !(0.0..=MAX_DISTANCE_M).contains(&d) {
                return err(format!(
                    "distance_m {d} must be a number in [0, {MAX_DISTANCE_M}]"
                ));
            }
            dev.phy_mut().set_time(now);
            dev.phy_mut().set_cable(Cable {
                state,
                distance_m: d,
            });
            dev.poll(now);
            ok(json!({ "phy": dev.phy().snapshot() }))
        }
        Request::Counters { reset } => {
            // Frames whose time has come are counted first, and the reply
            // says when it was taken on the emulator's clock: a client that
            // reads the counters second by second gets the wire's rate in
            // this process's time, whatever delayed the reply on its way.
            dev.poll(now);
            let s = dev.phy().snapshot();
            let v = json!({
                "at_us": now.saturating_duration_since(env.started).as_micros() as u64,
                "counters": dev.counters(),
                "mdio_reads": s.mdio_reads,
                "mdio_writes": s.mdio_writes,
            });
            if reset == Some(true) {
                dev.reset_counters();
            }
            ok(v)
        }
        Request::Pcap {
            action: PcapAction::Start,
            path: Some(p),
            snaplen,
        } => {
            let snaplen = snaplen.unwrap_or(pcap::SNAPLEN_MAX);
            if !(1..=pcap::SNAPLEN_MAX).contains(&snaplen) {
                return err(format!(
                    "snaplen {snaplen} must be 1..={}",
                    pcap::SNAPLEN_MAX
                ));
            }
            match env.create_capture(&p) {
                Ok((file, full)) => match dev.pcap_start_file(file, &full, snaplen) {
                    Ok(()) => ok(json!({ "pcap": full, "snaplen": snaplen })),
                    Err(e) => err(format!("pcap {}: {e}", full.display())),
                },
                Err(e) => err(format!("pcap: {e}")),
            }
        }
        Request::Pcap {
            action: PcapAction::Start,
            path: None,
            ..
        } => err("pcap start needs a path"),
        Request::Pcap {
            action: PcapAction::Stop,
            ..
        } => {
            let path = dev.pcap_path().map(|p| p.to_path_buf());
            match dev.pcap_stop() {
                Ok(n) => ok(json!({ "pcap": path, "frames": n })),
                Err(e) => err(format!("pcap: {e}")),
            }
        }
        Request::Phy => ok(json!({ "phy": dev.phy().snapshot() })),
        Request::Describe => ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "config": dev.config(),
            "plugged": dev.plugged(),
            "announced": dev.announced(),
            "mac_registers": dev.mac(),
            "impair": dev.impair_config(),
            "faults": {
                "mdio": dev.mdio_faults(),
                "replug_in_ms": dev.replug_at().map(|t| t.saturating_duration_since(now).as_millis() as u64),
                "partner": dev.config().partner,
                "impair": dev.impair_config(),
            },
            "pcap": dev.pcap_path(),
            "about": env.about,
        })),
        Request::Usb { action, down_ms } => {
            if down_ms.is_some() && action != UsbAction::Replug {
                return err("down_ms goes with action replug");
            }
            match action {
                UsbAction::Plug => dev.plug(now),
                UsbAction::Unplug => dev.unplug(now),
                UsbAction::Replug => {
                    let ms = down_ms.unwrap_or(500);
                    if ms > MAX_DOWN_MS {
                        return err(format!("down_ms must be at most {MAX_DOWN_MS}"));
                    }
                    dev.replug(now, Duration::from_millis(ms));
                }
            }
            ok(
                json!({ "plugged": dev.plugged(), "replug_in_ms": dev.replug_at().map(|t| t.saturating_duration_since(now).as_millis() as u64) }),
            )
        }
    }
}

#[cfg(test)]
mod tests;
