//! `ax88772-emu`: parse arguments, build the configuration, run the loop.

use clap::Parser;
use std::process::ExitCode;
use std::time::Instant;

use ax88772::cli::Cli;
use ax88772::device::{format_mac, Device};
use ax88772::server::{install_signal_handlers, Server};
use ax88772::{log_e, log_i, wire};

fn run() -> anyhow::Result<()> {
    let s = Cli::parse().settings();
    ax88772::phy::check_autoneg(s.device.autoneg + s.device.autoneg_jitter)
        .map_err(|e| anyhow::anyhow!("--autoneg-ms plus --autoneg-jitter-ms: {e}"))?;
    ax88772::log::set_level(s.log_level);
    log_i!("{}", std::env::args().collect::<Vec<_>>().join(" "));
    log_i!(
        "ax88772-emu {} variant {:?} mac {} phy {:#010x}",
        env!("CARGO_PKG_VERSION"),
        s.device.variant,
        format_mac(&s.device.mac),
        s.device.phy_id
    );
    install_signal_handlers();
    let mut dev = Device::new(s.device, Instant::now());
    dev.set_impair(ax88772::impair::ImpairConfig {
        seed: s.seed,
        ..Default::default()
    });
    if s.link_down {
        dev.phy_mut().set_carrier(false);
    }
    if let Some(p) = &s.pcap {
        dev.pcap_start(p)
            .map_err(|e| anyhow::anyhow!("pcap {}: {e}", p.display()))?;
    }
    let wire = wire::open(&s.wire).map_err(|e| anyhow::anyhow!("wire {}: {e}", s.wire))?;
    let mut server =
        Server::with_capture_dir(dev, wire, s.role, s.on_disconnect, s.ctl, s.capture_dir)?;
    server.set_connect_timeout(s.connect_timeout);
    server.announce_ready(s.ready_file.as_ref())?;
    server.run()?;
    log_i!("exiting");
    Ok(())
}

fn main() -> ExitCode {
    let code = match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log_e!("{e:#}");
            ExitCode::from(2)
        }
    };
    ax88772::log::flush(std::time::Duration::from_secs(1));
    code
}
