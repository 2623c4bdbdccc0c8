//! Control protocol: one JSON object per line in, one JSON line out.
//!
//! Requests carry a `cmd` field; replies carry `"ok": true` plus data, or
//! `"ok": false` and an `error` string. Unparsable input gets an error
//! reply; it never stops the emulator.

use serde::Deserialize;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::impair::{Direction, ImpairConfig};
use crate::phy::{Cable, CableState, LinkMode};

/// Longest accepted request line.
pub const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Carrier on or off (cable plugged at the far end).
    Link {
        up: bool,
    },
    /// Change the link partner; omitted fields keep their value.
    Partner {
        autoneg: Option<bool>,
        modes: Option<Vec<LinkMode>>,
        pause: Option<bool>,
        asym_pause: Option<bool>,
        autoneg_ms: Option<u64>,
    },
    Quirks {
        lpa_zero: Option<bool>,
        reset_after_link_loss: Option<bool>,
    },
    /// Loss/corruption with a seed; `loss` and `corrupt` are probabilities.
    Impair {
        loss: Option<f64>,
        corrupt: Option<f64>,
        direction: Option<Direction>,
        seed: Option<u64>,
    },
    Cable {
        state: CableState,
        distance_m: Option<f64>,
    },
    Counters {
        reset: Option<bool>,
    },
    Pcap {
        action: PcapAction,
        path: Option<PathBuf>,
    },
    Phy,
    Describe,
    /// Simulate unplugging or replugging the adapter.
    Usb {
        action: UsbAction,
    },
    Ping,
}

#[derive(Debug, Deserialize, PartialEq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum PcapAction {
    Start,
    Stop,
}

#[derive(Debug, Deserialize, PartialEq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum UsbAction {
    Plug,
    Unplug,
}

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
pub fn handle_line(dev: &mut Device, now: Instant, line: &str, about: &Value) -> String {
    let v = match serde_json::from_str::<Request>(line.trim()) {
        Ok(r) => handle(dev, now, r, about),
        Err(e) => err(format!("bad request: {e}")),
    };
    v.to_string()
}

fn prob(name: &str, p: Option<f64>, old: f64) -> Result<f64, Value> {
    match p {
        None => Ok(old),
        Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Some(p) => Err(err(format!("{name} {p} is not a probability in [0, 1]"))),
    }
}

pub fn handle(dev: &mut Device, now: Instant, r: Request, about: &Value) -> Value {
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
        } => {
            let mut p = dev.config().partner.clone();
            if let Some(m) = modes {
                if m.is_empty() {
                    return err("modes must name at least one of 10half, 10full, 100half, 100full");
                }
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
        Request::Quirks {
            lpa_zero,
            reset_after_link_loss,
        } => {
            let mut q = dev.config().quirks;
            q.lpa_zero = lpa_zero.unwrap_or(q.lpa_zero);
            q.reset_after_link_loss = reset_after_link_loss.unwrap_or(q.reset_after_link_loss);
            dev.set_quirks(now, q);
            ok(json!({ "quirks": q }))
        }
        Request::Impair {
            loss,
            corrupt,
            direction,
            seed,
        } => {
            let old = dev.impair_config().clone();
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
            };
            dev.set_impair(cfg.clone());
            ok(json!({ "impair": cfg }))
        }
        Request::Cable { state, distance_m } => {
            let d = distance_m.unwrap_or(0.0);
            if !d.is_finite() || d < 0.0 {
                return err(format!("distance_m {d} must be a non-negative number"));
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
            let s = dev.phy().snapshot();
            let v = json!({
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
        } => match dev.pcap_start(&p) {
            Ok(()) => ok(json!({ "pcap": p })),
            Err(e) => err(format!("pcap {}: {e}", p.display())),
        },
        Request::Pcap {
            action: PcapAction::Start,
            path: None,
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
            "pcap": dev.pcap_path(),
            "about": about,
        })),
        Request::Usb { action } => {
            match action {
                UsbAction::Plug => dev.plug(now),
                UsbAction::Unplug => dev.unplug(now),
            }
            ok(json!({ "plugged": dev.plugged() }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptors::Variant;
    use crate::device::DeviceConfig;

    fn dev() -> (Device, Instant) {
        let t = Instant::now();
        (
            Device::new(DeviceConfig::new(Variant::Ax88772a, [2, 0, 0, 0, 0, 1]), t),
            t,
        )
    }

    fn ask(d: &mut Device, t: Instant, line: &str) -> Value {
        serde_json::from_str(&handle_line(d, t, line, &json!({}))).unwrap()
    }

    #[test]
    fn link_down_and_up() {
        let (mut d, t) = dev();
        let r = ask(&mut d, t, r#"{"cmd":"link","up":false}"#);
        assert_eq!(r["ok"], true);
        assert_eq!(r["phy"]["state"], "link_down");
        let r = ask(&mut d, t, r#"{"cmd":"link","up":true}"#);
        assert_eq!(r["phy"]["state"], "link_up");
    }

    #[test]
    fn partner_and_quirks() {
        let (mut d, t) = dev();
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"partner","modes":["10full"],"pause":false}"#,
        );
        assert_eq!(r["phy"]["speed"], 10);
        assert_eq!(r["phy"]["lpa"], 0x4041);
        let r = ask(&mut d, t, r#"{"cmd":"quirks","lpa_zero":true}"#);
        assert_eq!(r["quirks"]["lpa_zero"], true);
        assert_eq!(ask(&mut d, t, r#"{"cmd":"phy"}"#)["phy"]["lpa"], 0);
        let r = ask(&mut d, t, r#"{"cmd":"partner","modes":[]}"#);
        assert_eq!(r["ok"], false);
    }

    #[test]
    fn impair_validates_probabilities() {
        let (mut d, t) = dev();
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"impair","loss":0.5,"seed":3,"direction":"rx"}"#,
        );
        assert_eq!(r["impair"]["loss"], 0.5);
        assert_eq!(r["impair"]["direction"], "rx");
        assert_eq!(
            ask(&mut d, t, r#"{"cmd":"impair","corrupt":2}"#)["ok"],
            false
        );
    }

    #[test]
    fn cable_counters_describe() {
        let (mut d, t) = dev();
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"cable","state":"short","distance_m":3.5}"#,
        );
        assert_eq!(r["phy"]["cable"]["state"], "short");
        assert_eq!(r["phy"]["link"], false);
        let r = ask(&mut d, t, r#"{"cmd":"counters"}"#);
        assert_eq!(r["counters"]["tx_frames"], 0);
        let r = ask(&mut d, t, r#"{"cmd":"describe"}"#);
        assert_eq!(r["config"]["variant"], "772a");
        assert_eq!(r["config"]["mac"], "02:00:00:00:00:01");
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn pcap_start_stop() {
        let (mut d, t) = dev();
        let p = std::env::temp_dir().join(format!("ax-ctl-{}.pcap", std::process::id()));
        let line = json!({"cmd":"pcap","action":"start","path":p}).to_string();
        assert_eq!(ask(&mut d, t, &line)["ok"], true);
        d.wire_frame(t, vec![0xff; 60]);
        let r = ask(&mut d, t, r#"{"cmd":"pcap","action":"stop"}"#);
        assert_eq!(r["frames"], 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 24 + 16 + 60);
        std::fs::remove_file(&p).unwrap();
        assert_eq!(
            ask(&mut d, t, r#"{"cmd":"pcap","action":"start"}"#)["ok"],
            false
        );
    }

    #[test]
    fn garbage_gets_an_error_reply() {
        let (mut d, t) = dev();
        for line in [
            "",
            "not json",
            "{}",
            r#"{"cmd":"nope"}"#,
            r#"{"cmd":"link"}"#,
            r#"{"cmd":"link","up":"yes"}"#,
            r#"{"cmd":"link","up":true,"extra":1}"#,
            "[1,2,3]",
            "\u{0}\u{1}\u{2}",
        ] {
            let r = ask(&mut d, t, line);
            assert_eq!(r["ok"], false, "{line:?}");
            assert!(r["error"].as_str().unwrap().starts_with("bad request"));
        }
    }
}
