//! Tests of the control protocol: each command's effect and reply, and
//! the refusal of bad requests and out-of-range values.

use super::*;
use crate::descriptors::Variant;
use crate::device::DeviceConfig;
use crate::phy::CableState;
use std::path::PathBuf;

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
    let line = |l: u64, j: u64| format!(r#"{{"cmd":"impair","latency_us":{l},"jitter_us":{j}}}"#);
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
