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

use serde::Deserialize;
use serde_json::{json, Value};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::faults::{MdioOp, MdioRule};
use crate::impair::{Direction, ImpairConfig};
use crate::log_w;
use crate::pcap;
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
        autoneg_jitter_ms: Option<u64>,
    },
    /// The PHY's reset and power-up times; omitted fields keep their value.
    PhyTiming {
        reset_ms: Option<u64>,
        powerup_ms: Option<u64>,
    },
    Quirks {
        lpa_zero: Option<bool>,
        reset_after_link_loss: Option<bool>,
        stale_lpa: Option<bool>,
    },
    /// Loss/corruption with a seed; `loss` and `corrupt` are probabilities.
    Impair {
        loss: Option<f64>,
        corrupt: Option<f64>,
        direction: Option<Direction>,
        seed: Option<u64>,
        latency_us: Option<u64>,
        jitter_us: Option<u64>,
    },
    /// MDIO accesses that fail (the vendor request STALLs): a rule per
    /// request, or `clear`.
    MdioFault {
        op: Option<MdioOp>,
        regs: Option<Vec<u8>>,
        count: Option<u64>,
        probability: Option<f64>,
        seed: Option<u64>,
        clear: Option<bool>,
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
        /// Bytes kept of each frame [default: all].
        snaplen: Option<u32>,
    },
    Phy,
    Describe,
    /// Simulate unplugging or replugging the adapter.
    Usb {
        action: UsbAction,
        /// For `replug`: how long the adapter stays unplugged.
        down_ms: Option<u64>,
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
    /// Unplug, then plug back in after `down_ms` (default 500).
    Replug,
}

/// Longest wire latency plus jitter accepted, in microseconds.
pub const MAX_DELAY_US: u64 = 100_000;
/// Farthest cable fault accepted, in metres (a 100BASE-TX segment is at
/// most 100 m).
pub const MAX_DISTANCE_M: f64 = 1000.0;
/// Longest `usb replug` down time, in milliseconds.
pub const MAX_DOWN_MS: u64 = 600_000;

/// What control requests may touch besides the device: the socket
/// addresses for `describe` and the directory captures are written in.
pub struct CtlEnv {
    pub about: Value,
    capture: Option<(PathBuf, OwnedFd)>,
    /// The origin of the `at_us` time stamp of `counters` replies.
    started: Instant,
}

impl CtlEnv {
    /// Open the capture directory once; `pcap start` files go there only.
    pub fn new(
        about: Value,
        capture_dir: Option<PathBuf>,
    ) -> Result<CtlEnv, (String, std::io::Error)> {
        let capture = match capture_dir {
            None => None,
            Some(d) => {
                let c = CString::new(d.as_os_str().as_bytes())
                    .map_err(|e| (d.display().to_string(), std::io::Error::other(e)))?;
                // SAFETY: c is a valid NUL-terminated path; the descriptor
                // returned is owned by the OwnedFd below.
                let fd = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err((d.display().to_string(), std::io::Error::last_os_error()));
                }
                // SAFETY: fd is a fresh descriptor nobody else owns.
                Some((d, unsafe { OwnedFd::from_raw_fd(fd) }))
            }
        };
        Ok(CtlEnv {
            about,
            capture,
            started: Instant::now(),
        })
    }

    /// An environment without a capture directory (tests).
    pub fn bare(about: Value) -> CtlEnv {
        CtlEnv {
            about,
            capture: None,
            started: Instant::now(),
        }
    }

    /// Create a new capture file: a plain name (or a path naming a file
    /// directly inside the capture directory), opened with O_CREAT|O_EXCL|
    /// O_NOFOLLOW, so nothing outside the directory is written and no
    /// existing file or link is followed or truncated.
    fn create_capture(&self, p: &Path) -> Result<(File, PathBuf), String> {
        let Some((dir, fd)) = &self.capture else {
            return Err("pcap start needs the emulator started with --capture-dir".into());
        };
        let rel = if p.is_absolute() {
            p.strip_prefix(dir).map_err(|_| {
                format!(
                    "{} is not inside the capture directory {}",
                    p.display(),
                    dir.display()
                )
            })?
        } else {
            p
        };
        let mut parts = rel.components();
        let name = match (parts.next(), parts.next()) {
            (Some(Component::Normal(n)), None) => n,
            _ => {
                return Err(format!(
                    "{} must name a file directly inside the capture directory {}",
                    p.display(),
                    dir.display()
                ))
            }
        };
        let c = CString::new(name.as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: fd is the open capture directory, c a valid file name.
        let f = unsafe {
            libc::openat(
                fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if f < 0 {
            return Err(format!(
                "{}: {}",
                p.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: f is a fresh descriptor nobody else owns.
        Ok((unsafe { File::from_raw_fd(f) }, dir.join(name)))
    }
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
        serde_json::from_str(&handle_line(d, t, line, &CtlEnv::bare(json!({})))).unwrap()
    }

    #[test]
    fn clearing_the_mdio_faults_takes_no_rule_fields() {
        let (mut d, t) = dev();
        for f in [
            r#""op":"read""#,
            r#""regs":[1]"#,
            r#""count":1"#,
            r#""probability":0.5"#,
        ] {
            let line = format!(r#"{{"cmd":"mdio_fault","clear":true,{f}}}"#);
            let r = ask(&mut d, t, &line);
            assert_eq!(r["ok"], false, "{line}: {r}");
            assert_eq!(r["error"], "clear takes no rule fields", "{line}");
        }
        let r = ask(&mut d, t, r#"{"cmd":"mdio_fault","clear":true}"#);
        assert_eq!(r["ok"], true, "{r}");
    }

    #[test]
    fn a_cable_fault_at_a_negative_distance_is_refused() {
        let (mut d, t) = dev();
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"cable","state":"open","distance_m":-1.0}"#,
        );
        assert_eq!(r["ok"], false, "{r}");
        assert!(
            r["error"].as_str().unwrap().contains("distance_m -1"),
            "{r}"
        );
        assert_eq!(d.phy_mut().snapshot().cable.state, CableState::Ok);
    }

    #[test]
    fn phy_timing_is_set_and_values_out_of_range_are_refused_by_name() {
        let (mut d, t) = dev();
        let r = ask(&mut d, t, r#"{"cmd":"phy_timing","reset_ms":20}"#);
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["phy"]["timing"]["reset"], 20);
        assert_eq!(r["phy"]["timing"]["powerup"], 10, "kept");
        let r = ask(&mut d, t, r#"{"cmd":"phy_timing","reset_ms":501}"#);
        assert_eq!(r["error"], "reset_ms must be at most 500", "{r}");
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"phy_timing","powerup_ms":99999999999}"#,
        );
        assert_eq!(r["error"], "powerup_ms must be at most 1000", "{r}");
        assert_eq!(d.config().phy_timing.reset, Duration::from_millis(20));
        let r = ask(&mut d, t, r#"{"cmd":"partner","autoneg_ms":10001}"#);
        assert_eq!(r["error"], "autoneg_ms must be at most 10000", "{r}");
        assert_eq!(d.config().autoneg, Duration::ZERO, "nothing changed");
        let r = ask(&mut d, t, r#"{"cmd":"partner","autoneg_ms":10000}"#);
        assert_eq!(r["ok"], true, "{r}");
        let r = ask(&mut d, t, r#"{"cmd":"partner","autoneg_jitter_ms":1}"#);
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .starts_with("autoneg_jitter_ms"),
            "{r}"
        );
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"partner","autoneg_ms":1500,"autoneg_jitter_ms":1500}"#,
        );
        assert_eq!(r["phy"]["autoneg_jitter_ms"], 1500, "{r}");
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
        let r = ask(&mut d, t, r#"{"cmd":"phy"}"#);
        assert_eq!(r["phy"]["quirks"]["stale_lpa"], true, "on by default");
        // A partner change without the driver's PHY reset leaves LPA as
        // it was.
        let r = ask(&mut d, t, r#"{"cmd":"partner","modes":["10full"]}"#);
        assert_eq!(r["phy"]["speed"], 10);
        assert_eq!(r["phy"]["lpa"], 0x45e1, "{r}");
        let r = ask(&mut d, t, r#"{"cmd":"quirks","stale_lpa":false}"#);
        assert_eq!(r["quirks"]["stale_lpa"], false);
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
        assert_eq!(
            r["phy"]["state"], "autoneg",
            "a partner advertising nothing"
        );
        assert_eq!(r["phy"]["autoneg_complete"], false);
        assert!(
            d.phy().next_event().is_none(),
            "nothing to wait for: no busy loop"
        );
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
        let env = CtlEnv::bare(json!({}));
        let at = |d: &mut Device, t: Instant| -> u64 {
            let v: Value =
                serde_json::from_str(&handle_line(d, t, r#"{"cmd":"counters"}"#, &env)).unwrap();
            v["at_us"].as_u64().unwrap()
        };
        let t0 = env.started;
        assert_eq!(at(&mut d, t0 + Duration::from_millis(1500)), 1_500_000);
        assert_eq!(at(&mut d, t0 + Duration::from_micros(2_000_250)), 2_000_250);
        let r = ask(&mut d, t, r#"{"cmd":"describe"}"#);
        assert_eq!(r["config"]["variant"], "772a");
        assert_eq!(r["config"]["mac"], "02:00:00:00:00:01");
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"));
    }

    fn capture_dir(name: &str) -> (PathBuf, CtlEnv) {
        let d = std::env::temp_dir().join(format!("ax-ctl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let env = CtlEnv::new(json!({}), Some(d.clone())).unwrap();
        (d, env)
    }

    fn ask_in(d: &mut Device, t: Instant, env: &CtlEnv, v: Value) -> Value {
        serde_json::from_str(&handle_line(d, t, &v.to_string(), env)).unwrap()
    }

    #[test]
    fn pcap_start_stop() {
        let (mut d, t) = dev();
        let (dir, env) = capture_dir("ok");
        let p = dir.join("wire.pcap");
        let r = ask_in(
            &mut d,
            t,
            &env,
            json!({"cmd":"pcap","action":"start","path":p}),
        );
        assert_eq!(r["ok"], true, "{r}");
        d.wire_frame(t, vec![0xff; 60]);
        let r = ask_in(&mut d, t, &env, json!({"cmd":"pcap","action":"stop"}));
        assert_eq!(r["frames"], 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 24 + 16 + 60);
        // A relative name lands in the capture directory too.
        let r = ask_in(
            &mut d,
            t,
            &env,
            json!({"cmd":"pcap","action":"start","path":"b.pcap"}),
        );
        assert_eq!(r["pcap"], json!(dir.join("b.pcap")));
        ask_in(&mut d, t, &env, json!({"cmd":"pcap","action":"stop"}));
        assert!(dir.join("b.pcap").exists());
        // Headers only: each frame cut to its snapshot length.
        let r = ask_in(
            &mut d,
            t,
            &env,
            json!({"cmd":"pcap","action":"start","path":"c.pcap","snaplen":20}),
        );
        assert_eq!(r["snaplen"], 20, "{r}");
        d.wire_frame(t, vec![0xff; 60]);
        ask_in(&mut d, t, &env, json!({"cmd":"pcap","action":"stop"}));
        assert_eq!(
            std::fs::metadata(dir.join("c.pcap")).unwrap().len(),
            24 + 16 + 20
        );
        for bad in [0, 65536] {
            let r = ask_in(
                &mut d,
                t,
                &env,
                json!({"cmd":"pcap","action":"start","path":"d.pcap","snaplen":bad}),
            );
            assert_eq!(
                r["error"],
                format!("snaplen {bad} must be 1..=65535"),
                "{r}"
            );
        }
        assert!(
            !dir.join("d.pcap").exists(),
            "nothing created for a refused start"
        );
        assert_eq!(
            ask(&mut d, t, r#"{"cmd":"pcap","action":"start"}"#)["ok"],
            false
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pcap_writes_only_new_files_inside_the_capture_dir() {
        use std::os::unix::fs::PermissionsExt;
        let (mut d, t) = dev();
        let (dir, env) = capture_dir("guard");
        let outside = dir.with_extension("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::fs::write(dir.join("old.pcap"), b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link.pcap")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        for path in [
            json!(outside),
            json!("../x.pcap"),
            json!(dir.join("../y.pcap")),
            json!("sub/z.pcap"),
            json!("old.pcap"),
            json!("link.pcap"),
            json!("/etc/passwd"),
            json!(""),
        ] {
            let r = ask_in(
                &mut d,
                t,
                &env,
                json!({"cmd":"pcap","action":"start","path":path}),
            );
            assert_eq!(r["ok"], false, "{path} accepted: {r}");
            assert!(r["error"].as_str().unwrap().starts_with("pcap"), "{r}");
        }
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.join("old.pcap")).unwrap(), b"keep");
        assert!(!dir.join("sub/z.pcap").exists());
        let r = ask_in(
            &mut d,
            t,
            &env,
            json!({"cmd":"pcap","action":"start","path":"new.pcap"}),
        );
        assert_eq!(r["ok"], true);
        let mode = std::fs::metadata(dir.join("new.pcap"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Without a capture directory nothing is written anywhere.
        let r = ask(
            &mut d,
            t,
            &json!({"cmd":"pcap","action":"start","path":dir.join("n.pcap")}).to_string(),
        );
        assert_eq!(r["ok"], false);
        assert!(r["error"].as_str().unwrap().contains("--capture-dir"));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&outside).unwrap();
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

    #[test]
    fn wire_delay_is_accepted_up_to_its_limit_and_not_beyond() {
        let (mut d, t) = dev();
        let line =
            |l: u64, j: u64| format!(r#"{{"cmd":"impair","latency_us":{l},"jitter_us":{j}}}"#);
        let r = ask(&mut d, t, &line(MAX_DELAY_US - 10, 10));
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["impair"]["latency_us"], MAX_DELAY_US - 10);
        let r = ask(&mut d, t, &line(MAX_DELAY_US - 10, 11));
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(
            d.impair_config().jitter_us,
            10,
            "the refused request changed nothing"
        );
    }

    #[test]
    fn every_number_past_its_bound_is_refused_with_the_field_and_range_named() {
        let (mut d, t) = dev();
        let before = ask(&mut d, t, r#"{"cmd":"describe"}"#);
        // (request, the field, the bound the error names)
        let big = [
            (
                r#"{"cmd":"partner","autoneg_ms":10001}"#,
                "autoneg_ms",
                "10000",
            ),
            (
                r#"{"cmd":"partner","autoneg_jitter_ms":18446744073709551615}"#,
                "autoneg_jitter_ms",
                "10000",
            ),
            (
                r#"{"cmd":"phy_timing","reset_ms":18446744073709551615}"#,
                "reset_ms",
                "500",
            ),
            (
                r#"{"cmd":"phy_timing","powerup_ms":1001}"#,
                "powerup_ms",
                "1000",
            ),
            (r#"{"cmd":"impair","loss":1.5}"#, "loss", "[0, 1]"),
            (r#"{"cmd":"impair","corrupt":-0.1}"#, "corrupt", "[0, 1]"),
            (
                r#"{"cmd":"impair","latency_us":18446744073709551615,"jitter_us":1}"#,
                "latency_us",
                "100000",
            ),
            (
                r#"{"cmd":"impair","jitter_us":100001}"#,
                "jitter_us",
                "100000",
            ),
            (
                r#"{"cmd":"mdio_fault","count":1000001}"#,
                "count",
                "1000000",
            ),
            (r#"{"cmd":"mdio_fault","regs":[32]}"#, "regs", "0..31"),
            (
                r#"{"cmd":"mdio_fault","probability":2}"#,
                "probability",
                "[0, 1]",
            ),
            (
                r#"{"cmd":"cable","state":"open","distance_m":1000.5}"#,
                "distance_m",
                "1000",
            ),
            (
                r#"{"cmd":"cable","state":"open","distance_m":1e308}"#,
                "distance_m",
                "1000",
            ),
            (
                r#"{"cmd":"pcap","action":"start","path":"x","snaplen":65536}"#,
                "snaplen",
                "65535",
            ),
            (
                r#"{"cmd":"usb","action":"replug","down_ms":600001}"#,
                "down_ms",
                "600000",
            ),
        ];
        for (line, field, bound) in big {
            let r = ask(&mut d, t, line);
            assert_eq!(r["ok"], false, "{line}: {r}");
            let e = r["error"].as_str().unwrap();
            assert!(e.contains(field) && e.contains(bound), "{line}: {e}");
        }
        // Numbers the field's type cannot hold: refused by name, no panic.
        let untyped = [
            (
                r#"{"cmd":"partner","autoneg_ms":18446744073709551616}"#,
                "autoneg_ms",
            ),
            (
                r#"{"cmd":"partner","autoneg_jitter_ms":-1}"#,
                "autoneg_jitter_ms",
            ),
            (r#"{"cmd":"phy_timing","powerup_ms":1.5}"#, "powerup_ms"),
            (r#"{"cmd":"impair","seed":1e30}"#, "seed"),
            (r#"{"cmd":"mdio_fault","regs":[256]}"#, "regs"),
            (r#"{"cmd":"mdio_fault","count":-5}"#, "count"),
            (
                r#"{"cmd":"pcap","action":"start","path":"x","snaplen":4294967296}"#,
                "snaplen",
            ),
            (
                r#"{"cmd":"usb","action":"replug","down_ms":1e30}"#,
                "down_ms",
            ),
        ];
        for (line, field) in untyped {
            let r = ask(&mut d, t, line);
            assert_eq!(r["ok"], false, "{line}: {r}");
            let e = r["error"].as_str().unwrap();
            assert!(e.contains(&format!("field {field}")), "{line}: {e}");
        }
        let after = ask(&mut d, t, r#"{"cmd":"describe"}"#);
        assert_eq!(after, before, "nothing refused changed anything");
        // The bounds themselves are taken.
        for line in [
            r#"{"cmd":"cable","state":"open","distance_m":1000}"#,
            r#"{"cmd":"mdio_fault","count":1000000,"regs":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31]}"#,
            r#"{"cmd":"usb","action":"replug","down_ms":600000}"#,
        ] {
            assert_eq!(ask(&mut d, t, line)["ok"], true, "{line}");
        }
    }

    #[test]
    fn a_cable_fault_at_the_port_itself_is_taken() {
        let (mut d, t) = dev();
        let r = ask(
            &mut d,
            t,
            r#"{"cmd":"cable","state":"open","distance_m":0.0}"#,
        );
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(d.phy_mut().snapshot().cable.state, CableState::Open);
    }
}
