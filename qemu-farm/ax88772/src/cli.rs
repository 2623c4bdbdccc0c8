//! Command line of `ax88772-emu`, turned into a validated configuration.

use clap::{ArgGroup, Parser};
use std::path::PathBuf;
use std::time::Duration;

use crate::addr::{SockAddr, WireSpec};
use crate::descriptors::Variant;
use crate::device::DeviceConfig;
use crate::impair::Rng;
use crate::mac::Addr0;
use crate::nic::{DuplexMismatch, RxMode};
use crate::phy::{LinkMode, Partner, Quirks};
use crate::server::{OnDisconnect, UsbRole};

/// Longest `--connect-timeout`, in seconds.
pub const MAX_CONNECT_TIMEOUT_S: u64 = 3600;
/// Deepest `--pace-burst-us`: one second of line rate.
pub const MAX_PACE_BURST_US: u64 = 1_000_000;
/// Most frames `--rx-queue` holds (about 6 MiB of full-size frames).
pub const MAX_RX_QUEUE: usize = 4096;

const ABOUT: &str = "Emulated ASIX AX88772A USB 2.0 Ethernet adapter for QEMU's usb-redir.";

const LONG_ABOUT: &str = "\
Emulated ASIX AX88772A USB 2.0 Ethernet adapter for QEMU's usb-redir.

The model speaks the usbredir protocol as the usb-host (the side that exports a
device) to QEMU's `-device usb-redir`, and carries the adapter's Ethernet frames
to a link partner over a QEMU `-netdev stream` or `-netdev dgram` socket, or
an existing tap interface of its network namespace (--wire tap:IFNAME).

QEMU listens, the model connects (recommended; the adapter appears on connect,
disappears when the model exits):
  qemu-system-x86_64 ... -device qemu-xhci,id=xhci \\
    -chardev socket,id=ur0,path=usb.sock,server=on,wait=off \\
    -device usb-redir,chardev=ur0,bus=xhci.0
  ax88772-emu --connect unix:usb.sock --wire dgram:unix:emu.sock,unix:partner.sock

The model listens, QEMU connects (start the model first, wait for readiness):
  ax88772-emu --listen unix:usb.sock --ready-file ready.json --ctl ctl.sock
  qemu-system-x86_64 ... -chardev socket,id=ur0,path=usb.sock,reconnect=1 ...

A physical adapter takes the model's place on the same QEMU command line:
  usbredirect --device 0b95:772a --as 127.0.0.1:4000
  with QEMU using -chardev socket,id=ur0,host=127.0.0.1,port=4000 (QEMU connects).
  (`--to HOST:PORT` makes usbredirect connect to a server=on chardev instead.)

Readiness: once every socket is bound, a line `I: ready {json}` goes to stderr
and --ready-file (if given) is written atomically with the same JSON.

Control socket (--ctl): JSON lines, one reply line per request, e.g.
  {\"cmd\":\"link\",\"up\":false}   {\"cmd\":\"partner\",\"modes\":[\"10full\"],\"pause\":false}
  {\"cmd\":\"quirks\",\"lpa_zero\":true}   {\"cmd\":\"impair\",\"loss\":0.01,\"seed\":7}
  {\"cmd\":\"cable\",\"state\":\"open\",\"distance_m\":12}   {\"cmd\":\"counters\"}
  {\"cmd\":\"pcap\",\"action\":\"start\",\"path\":\"wire.pcap\",\"snaplen\":128} (in --capture-dir;
  snaplen optional: bytes kept of each frame)   {\"cmd\":\"phy\"}
  {\"cmd\":\"describe\"}   {\"cmd\":\"usb\",\"action\":\"unplug\"}   {\"cmd\":\"ping\"}
  {\"cmd\":\"usb\",\"action\":\"replug\",\"down_ms\":500}   {\"cmd\":\"impair\",\"latency_us\":2000,\"jitter_us\":500}
  {\"cmd\":\"mdio_fault\",\"op\":\"read\",\"regs\":[1],\"count\":1}   {\"cmd\":\"mdio_fault\",\"clear\":true}

Addresses: unix:PATH, a path containing '/', or HOST:PORT (tcp: / udp: prefixes
accepted). Wire: none | stream:ADDR (connect to -netdev stream,server=on) |
stream-listen:ADDR (for -netdev stream,server=off) | dgram:LOCAL,REMOTE (for
-netdev dgram with local/remote swapped).

Logs: plain `I:`/`W:`/`E:` lines on stderr. Exit status: 0 QEMU went away (with
--on-disconnect exit) or a signal; 2 the emulator could not run.";

#[derive(Debug, Parser)]
#[command(name = "ax88772-emu", version, about = ABOUT, long_about = LONG_ABOUT)]
#[command(group(ArgGroup::new("usb").required(true).args(["connect", "listen"])))]
pub struct Cli {
    /// Connect to QEMU's usbredir chardev (server=on,wait=off).
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<SockAddr>,
    /// Listen for QEMU's usbredir chardev (server=off,reconnect=1).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SockAddr>,
    /// What to do when QEMU goes away: exit, or wait for it again.
    #[arg(long, value_enum, default_value = "exit")]
    pub on_disconnect: OnDisconnect,
    /// Give up if the first --connect does not succeed within this many
    /// seconds (at most 3600).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=MAX_CONNECT_TIMEOUT_S))]
    pub connect_timeout: u64,
    /// Where Ethernet frames go: none, stream:ADDR, stream-listen:ADDR,
    /// dgram:LOCAL,REMOTE or tap:IFNAME (see above).
    #[arg(long, value_name = "SPEC", default_value = "none")]
    pub wire: WireSpec,
    /// Control socket (unix path) for JSON-line commands. It is created
    /// 0600 in a directory only this user may enter (made 0700 if missing);
    /// a live socket at the path is never replaced.
    #[arg(long, value_name = "PATH")]
    pub ctl: Option<PathBuf>,
    /// Directory `pcap start` writes captures in (new files only); without
    /// it the control socket cannot start a capture.
    #[arg(long, value_name = "DIR")]
    pub capture_dir: Option<PathBuf>,
    /// Write the readiness JSON here once every socket is bound.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Chip to model.
    #[arg(long, value_enum, default_value = "772a")]
    pub variant: Variant,
    /// MAC address (default: locally administered, derived from --seed).
    #[arg(long, value_name = "XX:XX:XX:XX:XX:XX", value_parser = parse_mac)]
    pub mac: Option<[u8; 6]>,
    /// Seed for the default MAC address and the impairment generator (any
    /// 64-bit value).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override the PHY identifier (hex), e.g. 0x003b1881.
    #[arg(long, value_name = "HEX", value_parser = parse_hex_u32)]
    pub phy_id: Option<u32>,
    /// MDIO address 0: alias of the internal PHY, or absent (reads 0xffff).
    #[arg(long, value_enum, default_value = "alias")]
    pub phy_addr0: Addr0,
    /// Do not pace frames to the negotiated line rate.
    #[arg(long)]
    pub unpaced: bool,
    /// Pacing burst in microseconds: how much of an idle wire's time frames
    /// may catch up after a scheduling hiccup (0: strict line-rate spacing;
    /// at most 1000000).
    #[arg(long, value_name = "US", default_value_t = crate::device::DEFAULT_PACE_BURST.as_micros() as u64, value_parser = clap::value_parser!(u64).range(0..=MAX_PACE_BURST_US))]
    pub pace_burst_us: u64,
    /// Carry this percentage of the negotiated line rate (1-100; 100: the
    /// line rate): a slower link, e.g. 95 for the 5 % loss the farm's
    /// throughput call must catch.
    #[arg(long, value_name = "PERCENT", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub pace_percent: u32,
    /// Autonegotiation time in milliseconds (0: instant; at most 10000).
    #[arg(long, value_name = "MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=crate::phy::MAX_AUTONEG.as_millis() as u64))]
    pub autoneg_ms: u64,
    /// Jitter added to each autonegotiation, in milliseconds: a draw in
    /// [0, MS] seeded from --seed (--autoneg-ms + this at most 10000).
    #[arg(long, value_name = "MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=crate::phy::MAX_AUTONEG.as_millis() as u64))]
    pub autoneg_jitter_ms: u64,
    /// Microseconds from SET_SW_MII until STATMNGSTS.HOST_EN reads 1 and
    /// MDIO reaches the PHY (0: at once; at most 100000). Linux polls
    /// HOST_EN 1 ms after SET_SW_MII, up to 30 times.
    #[arg(long, value_name = "US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub mii_delay_us: u64,
    /// How long BMCR.RESET reads 1 after it was written, in milliseconds
    /// (writes meanwhile are dropped; at most 500).
    #[arg(long, value_name = "MS", default_value_t = crate::device::DEFAULT_PHY_TIMING.reset.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=crate::phy::MAX_RESET.as_millis() as u64))]
    pub phy_reset_ms: u64,
    /// How long the PHY stays unreachable (MDIO reads 0xffff) after
    /// SW_RESET releases it, in milliseconds (at most 1000).
    #[arg(long, value_name = "MS", default_value_t = crate::device::DEFAULT_PHY_TIMING.powerup.as_millis() as u64, value_parser = clap::value_parser!(u64).range(0..=crate::phy::MAX_POWERUP.as_millis() as u64))]
    pub phy_powerup_ms: u64,
    /// Link partner modes, comma separated: 100full,100half,10full,10half.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "100full,100half,10full,10half", value_parser = parse_mode)]
    pub partner_modes: Vec<LinkMode>,
    /// The partner does not advertise pause.
    #[arg(long)]
    pub partner_no_pause: bool,
    /// The partner does not autonegotiate (forced to its best mode).
    #[arg(long)]
    pub partner_forced: bool,
    /// Partner quirk: LPA reads 0 after autonegotiation.
    #[arg(long)]
    pub quirk_lpa_zero: bool,
    /// Partner quirk: after link loss the link needs a PHY reset to return.
    #[arg(long)]
    pub quirk_reset_after_link_loss: bool,
    /// The AX88772A's stale-LPA erratum: after a link loss, LPA keeps the
    /// previous partner's abilities until a PHY reset (Linux's ax88796b
    /// resets the PHY in link_change_notify for this). `false` makes LPA
    /// follow every autonegotiation.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub quirk_stale_lpa: bool,
    /// Start with the cable unplugged at the far end.
    #[arg(long)]
    pub link_down: bool,
    /// Capture the wire to this pcap file from the start.
    #[arg(long, value_name = "PATH")]
    pub pcap: Option<PathBuf>,
    /// Frames held between the wire and the guest (1 to 4096). A full
    /// queue holds the partner off with PAUSE under flow control (MEDIUM.TFC
    /// on a link that negotiated it), else loses its frames.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_RX_QUEUE as u64))]
    pub rx_queue: usize,
    /// How RX records fill bulk IN requests: `stream` packs them as the
    /// chip's FIFO does, splitting a record across transfers; `whole` sends
    /// whole records only (a request too short for the next one babbles).
    #[arg(long, value_enum, default_value = "stream")]
    pub rx_mode: RxMode,
    /// A duplex mismatch (MEDIUM.FD against the link's duplex): `count`
    /// frames that overlap one coming the other way as collisions, or
    /// `lose` them too.
    #[arg(long, value_enum, default_value = "count")]
    pub duplex_mismatch: DuplexMismatch,
    /// Trace every usbredir message and MDIO access.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long)]
    pub quiet: bool,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<_> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("'{s}' is not XX:XX:XX:XX:XX:XX"));
    }
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("'{p}' is not a hex byte"))?;
    }
    if m[0] & 1 != 0 || m == [0; 6] {
        return Err(format!("'{s}' is not a valid unicast address"));
    }
    Ok(m)
}

fn parse_hex_u32(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("'{s}': {e}"))
}

fn parse_mode(s: &str) -> Result<LinkMode, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("'{s}': expected 100full, 100half, 10full or 10half"))
}

/// Locally administered unicast address from a seed: 02:xx:xx:xx:xx:xx.
pub fn mac_from_seed(seed: u64) -> [u8; 6] {
    let r = Rng::new(seed).next_u64().to_le_bytes();
    [0x02, r[0], r[1], r[2], r[3], r[4]]
}

/// Everything `main` needs, validated.
pub struct Settings {
    pub device: DeviceConfig,
    pub role: UsbRole,
    pub on_disconnect: OnDisconnect,
    pub connect_timeout: Duration,
    pub wire: WireSpec,
    pub ctl: Option<PathBuf>,
    pub capture_dir: Option<PathBuf>,
    pub ready_file: Option<PathBuf>,
    pub pcap: Option<PathBuf>,
    pub link_down: bool,
    pub seed: u64,
    pub log_level: u8,
}

impl Cli {
    pub fn settings(self) -> Settings {
        let mut device =
            DeviceConfig::new(self.variant, self.mac.unwrap_or(mac_from_seed(self.seed)));
        if let Some(id) = self.phy_id {
            device.phy_id = id;
        }
        device.addr0 = self.phy_addr0;
        device.paced = !self.unpaced;
        device.pace_burst = Duration::from_micros(self.pace_burst_us);
        device.pace_percent = self.pace_percent;
        device.rx_queue_frames = self.rx_queue;
        device.rx_mode = self.rx_mode;
        device.duplex_mismatch = self.duplex_mismatch;
        device.autoneg = Duration::from_millis(self.autoneg_ms);
        device.autoneg_jitter = Duration::from_millis(self.autoneg_jitter_ms);
        device.autoneg_seed = self.seed;
        device.mii_delay = Duration::from_micros(self.mii_delay_us);
        device.phy_timing = crate::phy::Timing {
            reset: Duration::from_millis(self.phy_reset_ms),
            powerup: Duration::from_millis(self.phy_powerup_ms),
        };
        device.partner = Partner {
            autoneg: !self.partner_forced,
            modes: self.partner_modes,
            pause: !self.partner_no_pause,
            asym_pause: false,
        };
        device.quirks = Quirks {
            lpa_zero: self.quirk_lpa_zero,
            reset_after_link_loss: self.quirk_reset_after_link_loss,
            stale_lpa: self.quirk_stale_lpa,
        };
        let role = match (self.connect, self.listen) {
            (Some(a), _) => UsbRole::Connect(a),
            (None, Some(a)) => UsbRole::Listen(a),
            (None, None) => UsbRole::Connected,
        };
        Settings {
            device,
            role,
            on_disconnect: self.on_disconnect,
            connect_timeout: Duration::from_secs(self.connect_timeout),
            wire: self.wire,
            ctl: self.ctl,
            capture_dir: self.capture_dir,
            ready_file: self.ready_file,
            pcap: self.pcap,
            link_down: self.link_down,
            seed: self.seed,
            log_level: if self.quiet {
                0
            } else {
                1 + self.verbose.min(1)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_typical_command_line() {
        let cli = Cli::try_parse_from([
            "ax88772-emu",
            "--listen",
            "unix:usb.sock",
            "--wire",
            "dgram:unix:a.sock,unix:b.sock",
            "--partner-modes",
            "10full,10half",
            "--seed",
            "5",
            "--unpaced",
            "--pace-burst-us",
            "500",
        ])
        .unwrap();
        let s = cli.settings();
        assert!(matches!(s.role, UsbRole::Listen(SockAddr::Unix(_))));
        assert_eq!(
            s.device.partner.modes,
            vec![LinkMode::Full10, LinkMode::Half10]
        );
        assert_eq!(s.device.mac, mac_from_seed(5));
        assert_eq!(s.device.mac[0], 0x02);
        assert!(!s.device.paced);
        assert_eq!(s.device.pace_burst, Duration::from_micros(500));
    }

    #[test]
    fn timing_options_have_safe_defaults_and_bounds_named_in_the_error() {
        let base = ["ax88772-emu", "--connect", "h:1"];
        let s = Cli::try_parse_from(base).unwrap().settings();
        assert_eq!(s.device.phy_timing, crate::device::DEFAULT_PHY_TIMING);
        assert_eq!(s.device.rx_mode, crate::nic::RxMode::Stream);
        for (opt, max) in [
            ("--autoneg-ms", 10_000),
            ("--autoneg-jitter-ms", 10_000),
            ("--mii-delay-us", 100_000),
            ("--phy-reset-ms", 500),
            ("--phy-powerup-ms", 1000),
            ("--connect-timeout", MAX_CONNECT_TIMEOUT_S),
            ("--pace-burst-us", MAX_PACE_BURST_US),
            ("--pace-percent", 100),
            ("--rx-queue", MAX_RX_QUEUE as u64),
        ] {
            let ok = max.to_string();
            assert!(Cli::try_parse_from(base.iter().copied().chain([opt, ok.as_str()])).is_ok());
            for bad in [(max + 1).to_string(), u64::MAX.to_string(), "1e99".into()] {
                let e = Cli::try_parse_from(base.iter().copied().chain([opt, bad.as_str()]))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(opt), "{e}");
            }
            let e = Cli::try_parse_from(base.iter().copied().chain([opt, "99999999999"]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("..={max}")), "the range is named: {e}");
        }
        let e = Cli::try_parse_from(base.iter().copied().chain(["--rx-queue", "0"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--rx-queue") && e.contains("1..=4096"), "{e}");
    }

    #[test]
    fn the_stale_lpa_erratum_is_on_unless_turned_off() {
        let base = ["ax88772-emu", "--connect", "h:1"];
        let s = Cli::try_parse_from(base).unwrap().settings();
        assert!(s.device.quirks.stale_lpa);
        let off = base.iter().copied().chain(["--quirk-stale-lpa", "false"]);
        assert!(
            !Cli::try_parse_from(off)
                .unwrap()
                .settings()
                .device
                .quirks
                .stale_lpa
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert!(
            Cli::try_parse_from(["ax88772-emu"]).is_err(),
            "needs --connect or --listen"
        );
        let bad_mac = [
            "ax88772-emu",
            "--connect",
            "h:1",
            "--mac",
            "01:00:00:00:00:01",
        ];
        assert!(Cli::try_parse_from(bad_mac).is_err(), "multicast MAC");
        let bad_mode = [
            "ax88772-emu",
            "--connect",
            "h:1",
            "--partner-modes",
            "1000full",
        ];
        assert!(Cli::try_parse_from(bad_mode).is_err());
        let both = ["ax88772-emu", "--connect", "h:1", "--listen", "h:2"];
        assert!(Cli::try_parse_from(both).is_err());
    }

    #[test]
    fn a_mac_has_six_hex_bytes() {
        assert_eq!(
            parse_mac("02:00:00:aa:bb:0c"),
            Ok([2, 0, 0, 0xaa, 0xbb, 0x0c])
        );
        for bad in ["02:00:00:aa:bb", "02:00:00:aa:bb:cc:dd", ""] {
            assert!(
                parse_mac(bad).unwrap_err().contains("is not XX:XX"),
                "{bad}"
            );
        }
        assert_eq!(
            parse_mac("02:00:00:aa:bb:zz").unwrap_err(),
            "'zz' is not a hex byte"
        );
    }

    #[test]
    fn phy_id_and_log_level_options() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["ax88772-emu", "--listen", "unix:usb.sock"];
            v.extend_from_slice(extra);
            Cli::try_parse_from(v).map(Cli::settings)
        };
        let s = parse(&["--phy-id", "0x003b1881"]).unwrap();
        assert_eq!(s.device.phy_id, 0x003b_1881);
        assert_eq!(
            parse(&["--phy-id", "3b1862"]).unwrap().device.phy_id,
            0x3b_1862
        );
        assert!(parse(&["--phy-id", "0xnothex"]).is_err());
        assert!(
            parse(&["--phy-id", "0x1ffffffff"]).is_err(),
            "wider than 32 bits"
        );
        // Quiet 0, default 1 (info), -v and more 2 (trace).
        assert_eq!(parse(&[]).unwrap().log_level, 1);
        assert_eq!(parse(&["-v"]).unwrap().log_level, 2);
        assert_eq!(parse(&["-v", "-v"]).unwrap().log_level, 2);
        assert_eq!(parse(&["--quiet"]).unwrap().log_level, 0);
    }

    #[test]
    fn seeds_give_distinct_macs() {
        assert_ne!(mac_from_seed(1), mac_from_seed(2));
        assert_eq!(mac_from_seed(1), mac_from_seed(1));
    }

    #[test]
    fn the_partner_autonegotiates_with_pause_unless_told_otherwise() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["ax88772-emu", "--listen", "unix:usb.sock"];
            v.extend_from_slice(extra);
            Cli::try_parse_from(v).unwrap().settings().device.partner
        };
        let p = parse(&[]);
        assert!(p.autoneg && p.pause, "{p:?}");
        let p = parse(&["--partner-forced"]);
        assert!(!p.autoneg && p.pause, "{p:?}");
        let p = parse(&["--partner-no-pause"]);
        assert!(p.autoneg && !p.pause, "{p:?}");
    }
}
