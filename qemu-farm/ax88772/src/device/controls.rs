//! Knobs the control socket (`ctl`) turns on a running device: impairment,
//! MDIO faults, the pcap capture, link partner, PHY quirks, pacing, autoneg.

use std::path::Path;
use std::time::{Duration, Instant};

use super::Device;
use crate::faults::MdioFaults;
use crate::impair::ImpairConfig;
use crate::log_w;
use crate::nic::{DuplexMismatch, RxMode};
use crate::pcap::Pcap;
use crate::phy::{Partner, Quirks, Timing};

impl Device {
    // Controls used by the control socket.

    pub fn set_impair(&mut self, cfg: ImpairConfig) {
        self.nic.set_impair(cfg);
    }

    pub fn impair_config(&self) -> &ImpairConfig {
        self.nic.impair_config()
    }

    pub fn mdio_faults(&self) -> &MdioFaults {
        &self.mdio_faults
    }

    pub fn mdio_faults_mut(&mut self) -> &mut MdioFaults {
        &mut self.mdio_faults
    }

    pub fn pcap_start(&mut self, path: &Path) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.stats.pcap = Some(Pcap::create(path)?);
        Ok(())
    }

    /// Capture into a file the caller opened (the control socket opens it
    /// inside the capture directory), `snaplen` bytes of each frame.
    pub fn pcap_start_file(
        &mut self,
        file: std::fs::File,
        path: &Path,
        snaplen: u32,
    ) -> std::io::Result<()> {
        self.pcap_stop()?;
        self.stats.pcap = Some(Pcap::new(file, path, snaplen)?);
        Ok(())
    }

    /// Stop capturing; returns the number of frames written.
    pub fn pcap_stop(&mut self) -> std::io::Result<u64> {
        match self.stats.pcap.take() {
            Some(p) => {
                if p.dropped > 0 {
                    log_w!(
                        "pcap: {}: {} frames dropped (the writer fell behind)",
                        p.path().display(),
                        p.dropped
                    );
                }
                p.finish()
            }
            None => Ok(0),
        }
    }

    pub fn pcap_path(&self) -> Option<&Path> {
        self.stats.pcap.as_ref().map(|p| p.path())
    }

    pub fn set_partner(&mut self, now: Instant, p: Partner) {
        self.tick(now);
        self.cfg.partner = p.clone();
        self.nic.phy.set_partner(p);
    }

    pub fn set_quirks(&mut self, now: Instant, q: Quirks) {
        self.tick(now);
        self.cfg.quirks = q;
        self.nic.phy.set_quirks(q);
    }

    /// Depth of the pacer's token bucket (see [`DeviceConfig::pace_burst`](super::DeviceConfig::pace_burst)).
    pub fn set_pace_burst(&mut self, d: Duration) {
        self.cfg.pace_burst = d;
        self.nic.set_pace_burst(d);
    }

    /// What a duplex mismatch does to colliding frames.
    pub fn set_duplex_mismatch(&mut self, d: DuplexMismatch) {
        self.cfg.duplex_mismatch = d;
        self.nic.set_duplex_mismatch(d);
    }

    /// How RX records fill bulk IN requests.
    pub fn set_rx_mode(&mut self, m: RxMode) {
        self.cfg.rx_mode = m;
        self.nic.set_rx_mode(m);
    }

    /// The PHY's reset and power-up times.
    pub fn set_phy_timing(&mut self, t: Timing) {
        self.cfg.phy_timing = t;
        self.nic.phy.set_timing(t);
    }

    /// Jitter added to each autonegotiation, drawn from the configured seed.
    pub fn set_autoneg_jitter(&mut self, j: Duration) {
        self.cfg.autoneg_jitter = j;
        let seed = self.cfg.autoneg_seed;
        self.nic.phy.set_autoneg_jitter(j, seed);
    }

    pub fn set_autoneg_delay(&mut self, d: Duration) {
        self.cfg.autoneg = d;
        self.nic.phy.set_autoneg_delay(d);
    }
}
