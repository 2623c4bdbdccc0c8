//! What the device counts and captures: the public [`Counters`] and `Stats`,
//! the device's [`NicEvents`] (counters, warnings, the pcap capture).

use serde::Serialize;

use super::Device;
use crate::goodput::NewPayload;
use crate::log_w;
use crate::nic::{Drop, NicEvents};
use crate::pcap::Pcap;

/// Frame and request counters (MDIO counts live in the PHY snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub tx_dropped_no_link: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// TCP payload bytes the frames that left for the wire carried for the
    /// first time (retransmissions not counted again): the host's own count
    /// of goodput, which the farm's throughput samples are read from.
    pub tx_tcp_new_bytes: u64,
    /// The same for the frames that went to the guest.
    pub rx_tcp_new_bytes: u64,
    /// TCP payload bytes the frames that left for the wire carried again:
    /// the guest's retransmissions.
    pub tx_tcp_again_bytes: u64,
    /// The same for the frames that went to the guest: the link partner's
    /// retransmissions, of what this device dropped or what the guest lost
    /// after it (the wire loses nothing).
    pub rx_tcp_again_bytes: u64,
    pub rx_length_errors: u64,
    pub rx_dropped_no_link: u64,
    pub rx_dropped_gated: u64,
    pub rx_filtered: u64,
    /// Frames lost to a full RX queue (flow control off, or frames
    /// already on their way when XOFF went out).
    pub rx_overflow: u64,
    /// Frames lost to a full RX queue on a link that negotiated flow
    /// control while MEDIUM.TFC was off: the MAC would have held them off
    /// with PAUSE, had the driver programmed the negotiated pause.
    pub rx_overflow_tfc_off: u64,
    /// PAUSE frames the MAC sent the partner (XOFF and XON).
    pub pause_sent: u64,
    /// PAUSE frames from the partner that held TX (MEDIUM.RFC on).
    pub pause_honoured: u64,
    /// PAUSE frames from the partner the MAC dropped (MEDIUM.RFC off).
    pub pause_ignored: u64,
    pub rx_too_big_for_request: u64,
    pub impair_dropped: u64,
    pub impair_corrupted: u64,
    /// Wire frames the MAC dropped for a bad FCS (corrupted on the way).
    pub rx_crc_errors: u64,
    /// Frames dropped while BMCR.ISOLATE cut the PHY off (either way).
    pub isolated_dropped: u64,
    /// Frames that met one coming the other way while the MAC's duplex
    /// (MEDIUM.FD) disagreed with the link's.
    pub duplex_collisions: u64,
    /// Frames that crossed while the PHY and the link partner ran
    /// different duplexes: the full-duplex end sent into the half-duplex
    /// end's frame (a late collision there, an FCS error at the other).
    pub wire_duplex_collisions: u64,
    /// Of those and of `duplex_collisions`, frames lost
    /// (`--duplex-mismatch lose`).
    pub duplex_collision_drops: u64,
    pub bulk_out_transfers: u64,
    pub bulk_in_transfers: u64,
    pub bulk_cancelled: u64,
    pub bulk_refused: u64,
    /// Transfers answered with STALL because their endpoint was halted
    /// (SET_FEATURE(ENDPOINT_HALT)).
    pub halted_stalls: u64,
    pub control_requests: u64,
    pub control_stalls: u64,
    pub mdio_faults_injected: u64,
    pub delay_overflow: u64,
    pub interrupt_packets: u64,
    pub usb_resets: u64,
    pub usbredir_errors: u64,
}

/// Counters and the wire capture: what the datapath reports lands here.
pub(super) struct Stats {
    pub(super) counters: Counters,
    pub(super) pcap: Option<Pcap>,
    /// TCP payload counted once per direction (the `*_tcp_new_bytes`).
    pub(super) tcp_tx: NewPayload,
    pub(super) tcp_rx: NewPayload,
}

impl NicEvents for Stats {
    fn tx_frame(&mut self, frame: &[u8]) {
        self.counters.tx_frames += 1;
        self.counters.tx_bytes += frame.len() as u64;
        self.counters.tx_tcp_new_bytes += self.tcp_tx.frame(frame);
        self.counters.tx_tcp_again_bytes += self.tcp_tx.take_again();
    }
    fn rx_frame(&mut self, frame: &[u8]) {
        self.counters.rx_frames += 1;
        self.counters.rx_bytes += frame.len() as u64;
        self.counters.rx_tcp_new_bytes += self.tcp_rx.frame(frame);
        self.counters.rx_tcp_again_bytes += self.tcp_rx.take_again();
    }
    fn on_wire(&mut self, frame: &[u8]) {
        if let Some(p) = &mut self.pcap {
            if let Err(e) = p.write(frame) {
                log_w!("pcap: {}: {e}; capture stopped", p.path().display());
                self.pcap = None;
            }
        }
    }
    fn dropped(&mut self, why: Drop, n: u64) {
        let c = &mut self.counters;
        *match why {
            Drop::TxNoLink => &mut c.tx_dropped_no_link,
            Drop::TxBadHeader | Drop::TxOversized => &mut c.tx_errors,
            Drop::RxNoLink => &mut c.rx_dropped_no_link,
            Drop::RxLength => &mut c.rx_length_errors,
            Drop::RxGated => &mut c.rx_dropped_gated,
            Drop::RxFiltered => &mut c.rx_filtered,
            Drop::RxOverflow => &mut c.rx_overflow,
            Drop::RxOverflowTfcOff => &mut c.rx_overflow_tfc_off,
            Drop::RxTooBigForRequest => &mut c.rx_too_big_for_request,
            Drop::Impaired => &mut c.impair_dropped,
            Drop::RxCrc => &mut c.rx_crc_errors,
            Drop::Isolated => &mut c.isolated_dropped,
            Drop::Collision => &mut c.duplex_collision_drops,
            Drop::DelayOverflow => &mut c.delay_overflow,
        } += n;
    }
    fn corrupted(&mut self) {
        self.counters.impair_corrupted += 1;
    }
    fn collision(&mut self) {
        self.counters.duplex_collisions += 1;
    }
    fn wire_collision(&mut self) {
        self.counters.wire_duplex_collisions += 1;
    }
    fn pause(&mut self, sent: bool, honoured: bool) {
        let c = &mut self.counters;
        *match (sent, honoured) {
            (true, _) => &mut c.pause_sent,
            (false, true) => &mut c.pause_honoured,
            (false, false) => &mut c.pause_ignored,
        } += 1;
    }
    fn warn(&mut self, msg: std::fmt::Arguments<'_>) {
        log_w!("{msg}");
    }
}

impl Device {
    pub fn counters(&self) -> &Counters {
        &self.stats.counters
    }

    pub fn reset_counters(&mut self) {
        self.stats.counters = Counters::default();
        self.nic.phy.reset_counters();
    }

    /// Count a decoding error reported by the codec.
    pub fn usbredir_error(&mut self) {
        self.stats.counters.usbredir_errors += 1;
    }
}
