use super::*;
use crate::phy::PHY_ID_AX88772A;
use std::time::Instant;

const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc];

fn setup() -> (Mac, Phy) {
    (
        Mac::new(Variant::Ax88772a, MAC, Addr0::Alias),
        Phy::new(PHY_ID_AX88772A, Instant::now()),
    )
}

fn rd(m: &mut Mac, p: &mut Phy, request: u8, value: u16, index: u16, length: u16) -> Reply {
    let s = Setup {
        requesttype: 0xc0,
        request,
        value,
        index,
        length,
    };
    m.vendor(p, &s, &[], &mut Effects::default())
}

fn wr(m: &mut Mac, p: &mut Phy, request: u8, value: u16, index: u16, data: &[u8]) -> Reply {
    let s = Setup {
        requesttype: 0x40,
        request,
        value,
        index,
        length: data.len() as u16,
    };
    m.vendor(p, &s, data, &mut Effects::default())
}

#[test]
fn bind_reads_have_exact_lengths() {
    let (mut m, mut p) = setup();
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_NODE_ID, 0, 0, 6),
        Reply::Data(MAC.to_vec())
    );
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_PHY_ID, 0, 0, 2),
        Reply::Data(vec![0x00, 0x10])
    );
    assert_eq!(
        rd(&mut m, &mut p, cmd::STATMNGSTS_REG, 0, 0, 1),
        Reply::Data(vec![0x10])
    );
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::STATMNGSTS_REG, 0, 0, 1),
        Reply::Data(vec![0x11])
    );
    // Never more than asked.
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_NODE_ID, 0, 0, 4),
        Reply::Data(MAC[..4].to_vec())
    );
}

#[test]
fn hw_reset_sequence() {
    let (mut m, mut p) = setup();
    assert_eq!(
        wr(&mut m, &mut p, cmd::WRITE_GPIOS, 0x0080, 0, &[]),
        Reply::Done(0)
    );
    wr(&mut m, &mut p, cmd::SW_PHY_SELECT, 0x0011, 0, &[]);
    wr(&mut m, &mut p, cmd::SW_RESET, 0x0060, 0, &[]);
    assert_eq!(p.state(), crate::phy::PhyState::Reset);
    wr(&mut m, &mut p, cmd::SW_RESET, 0x0020, 0, &[]);
    wr(&mut m, &mut p, cmd::SW_RESET, 0x0000, 0, &[]);
    assert_eq!(p.state(), crate::phy::PhyState::Reset);
    wr(&mut m, &mut p, cmd::SW_RESET, 0x0020, 0, &[]);
    assert!(p.link_up());
    // Vendor PHY registers at address 0 (aliased) already hold the defaults.
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    let r = rd(&mut m, &mut p, cmd::READ_MII_REG, 0, 0x14, 2);
    assert_eq!(r, Reply::Data(vec![0x2c, 0x44]));
    wr(&mut m, &mut p, cmd::WRITE_IPG0, 0x001d, 0x0012, &[]);
    assert_eq!(m.ipg, [0x001d, 0x0012]);
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0088, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_MEDIUM_MODE, 0x0306, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_RX_CTL, 0, 0, 2),
        Reply::Data(vec![0x88, 0x00])
    );
    let r = rd(&mut m, &mut p, cmd::READ_MEDIUM_STATUS, 0, 0, 2);
    assert_eq!(r, Reply::Data(vec![0x06, 0x03]));
    assert!(m.rx_enabled());
    assert_eq!(m.line_rate(), 100_000_000);
    // 10 Mbit/s: MEDIUM.PS clear (the other bits as the driver leaves them).
    wr(&mut m, &mut p, cmd::WRITE_MEDIUM_MODE, 0x0106, 0, &[]);
    assert_eq!(m.line_rate(), 10_000_000);
    assert!(m.rx_enabled());
}

#[test]
fn mdio_reaches_the_phy_at_0x10_only() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 2, 2),
        Reply::Data(vec![0x3b, 0x00])
    );
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_MII_REG, 0x05, 2, 2),
        Reply::Data(vec![0xff, 0xff])
    );
    wr(
        &mut m,
        &mut p,
        cmd::WRITE_MII_REG,
        0x10,
        0x04,
        &[0xe1, 0x0d],
    );
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 4, 2),
        Reply::Data(vec![0xe1, 0x0d])
    );
    let mut absent = Mac::new(Variant::Ax88772a, MAC, Addr0::Absent);
    absent.host_en = true;
    let r = rd(&mut absent, &mut p, cmd::READ_MII_REG, 0, 2, 2);
    assert_eq!(r, Reply::Data(vec![0xff, 0xff]), "address 0 never reads 0");
}

#[test]
fn mdio_reaches_the_phy_only_while_the_host_owns_it() {
    let (mut m, mut p) = setup();
    let read = |m: &mut Mac, p: &mut Phy| rd(m, p, cmd::READ_MII_REG, 0x10, 4, 2);
    assert_eq!(
        read(&mut m, &mut p),
        Reply::Data(vec![0xff, 0xff]),
        "chip owns MDIO"
    );
    wr(&mut m, &mut p, cmd::WRITE_MII_REG, 0x10, 4, &[0x41, 0x00]);
    assert_eq!(p.snapshot().advertise, 0x01e1, "the write was dropped");
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    assert_eq!(read(&mut m, &mut p), Reply::Data(vec![0xe1, 0x01]));
    wr(&mut m, &mut p, cmd::WRITE_MII_REG, 0x10, 4, &[0x41, 0x00]);
    assert_eq!(p.snapshot().advertise, 0x0041);
    wr(&mut m, &mut p, cmd::SET_HW_MII, 0, 0, &[]);
    assert_eq!(
        read(&mut m, &mut p),
        Reply::Data(vec![0xff, 0xff]),
        "handed back"
    );
}

#[test]
fn host_en_comes_the_mii_delay_after_set_sw_mii() {
    let (mut m, mut p) = setup();
    m.mii_delay = std::time::Duration::from_micros(500);
    let t = p.now();
    let stat = |m: &mut Mac, p: &mut Phy| rd(m, p, cmd::STATMNGSTS_REG, 0, 0, 1);
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    assert_eq!(stat(&mut m, &mut p), Reply::Data(vec![0x10]), "not yet");
    let r = rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 2, 2);
    assert_eq!(r, Reply::Data(vec![0xff, 0xff]), "MDIO not the host's yet");
    // A second SET_SW_MII does not start the wait over.
    p.set_time(t + std::time::Duration::from_micros(300));
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    p.set_time(t + std::time::Duration::from_micros(500));
    assert_eq!(stat(&mut m, &mut p), Reply::Data(vec![0x11]));
    let r = rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 2, 2);
    assert_eq!(r, Reply::Data(vec![0x3b, 0x00]));
    // The delay survives a USB reset.
    m.reset();
    assert_eq!(m.mii_delay, std::time::Duration::from_micros(500));
}

#[test]
fn short_data_stage_stalls() {
    let (mut m, mut p) = setup();
    assert_eq!(
        wr(&mut m, &mut p, cmd::WRITE_MII_REG, 0x10, 0, &[1]),
        Reply::Stall
    );
    assert_eq!(
        wr(&mut m, &mut p, cmd::WRITE_NODE_ID, 0, 0, &[1, 2, 3]),
        Reply::Stall
    );
    assert_eq!(m.node_id, MAC);
}

#[test]
fn data_beyond_wlength_does_not_count() {
    let (mut m, mut p) = setup();
    // Six bytes delivered, but the request announces only three.
    let s = Setup {
        requesttype: 0x40,
        request: cmd::WRITE_NODE_ID,
        value: 0,
        index: 0,
        length: 3,
    };
    let r = m.vendor(&mut p, &s, &[1, 2, 3, 4, 5, 6], &mut Effects::default());
    assert_eq!(r, Reply::Stall);
    assert_eq!(m.node_id, MAC);
}

#[test]
fn unknown_vendor_requests_stall() {
    let (mut m, mut p) = setup();
    assert_eq!(rd(&mut m, &mut p, 0x55, 0, 0, 4), Reply::Stall);
    assert_eq!(wr(&mut m, &mut p, 0x56, 0, 0, &[]), Reply::Stall);
    // Direction matters: 0x14 IN is not a request.
    assert_eq!(
        rd(&mut m, &mut p, cmd::WRITE_NODE_ID, 0, 0, 6),
        Reply::Stall
    );
}

#[test]
fn eeprom_mac_words_and_protection() {
    let (mut m, mut p) = setup();
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_EEPROM, 4, 0, 2),
        Reply::Data(vec![0x02, 0x00])
    );
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_EEPROM, 6, 0, 2),
        Reply::Data(vec![0xbb, 0xcc])
    );
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 4, 0x1234, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_EEPROM, 4, 0, 2),
        Reply::Data(vec![0x02, 0x00])
    );
    wr(&mut m, &mut p, cmd::WRITE_ENABLE, 0, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 4, 0x3412, &[]);
    wr(&mut m, &mut p, cmd::WRITE_DISABLE, 0, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_EEPROM, 4, 0, 2),
        Reply::Data(vec![0x12, 0x34])
    );
    // GPIO RSE reloads the node id from the EEPROM.
    wr(&mut m, &mut p, cmd::WRITE_GPIOS, 0x0080, 0, &[]);
    assert_eq!(m.node_id[..2], [0x12, 0x34]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_EEPROM, 300, 0, 2),
        Reply::Data(vec![0xff, 0xff])
    );
}

#[test]
fn rx_filter() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0088, 0, &[]);
    assert!(m.accepts(&MAC));
    assert!(m.accepts(&[0xff; 6]));
    assert!(!m.accepts(&[0x02, 0, 0, 0, 0, 1]));
    let all_nodes = [0x33, 0x33, 0, 0, 0, 1];
    assert!(!m.accepts(&all_nodes));
    // The filter Linux writes for 33:33:00:00:00:01 (bit 62).
    wr(
        &mut m,
        &mut p,
        cmd::WRITE_MULTI_FILTER,
        0,
        0,
        &[0, 0, 0, 0, 0, 0, 0, 0x40],
    );
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0098, 0, &[]);
    assert!(m.accepts(&all_nodes));
    assert!(!m.accepts(&[0x01, 0, 0x5e, 0, 0, 1]));
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0089, 0, &[]);
    assert!(m.accepts(&[0x02, 0, 0, 0, 0, 1]), "promiscuous");
}

#[test]
fn ether_crc_matches_linux() {
    assert_eq!(ether_crc(&[0x33, 0x33, 0, 0, 0, 1]) >> 26, 62);
    assert_eq!(ether_crc(&[0x01, 0x00, 0x5e, 0, 0, 1]) >> 26, 31);
}

#[test]
fn chip_codes() {
    let m = Mac::new(Variant::Ax88772b, MAC, Addr0::Alias);
    assert_eq!(m.statmngsts(Instant::now()) & 0x70, 0x20);
}

#[test]
fn eeprom_writes_need_write_enable_and_stop_at_write_disable() {
    let (mut m, mut p) = setup();
    let word = |m: &mut Mac, p: &mut Phy, i| rd(m, p, cmd::READ_EEPROM, i, 0, 2);
    let before = word(&mut m, &mut p, 0x20);
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 0x20, 0x1234, &[]);
    assert_eq!(word(&mut m, &mut p, 0x20), before, "write-protected");
    wr(&mut m, &mut p, cmd::WRITE_ENABLE, 0, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 0x20, 0x1234, &[]);
    assert_eq!(word(&mut m, &mut p, 0x20), Reply::Data(vec![0x34, 0x12]));
    assert_eq!(
        m.eeprom()[0x20],
        0x1234,
        "what describe shows is what the guest reads"
    );
    assert_eq!(
        Reply::Data(
            m.eeprom()[..1]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect()
        ),
        word(&mut m, &mut p, 0)
    );
    wr(&mut m, &mut p, cmd::WRITE_DISABLE, 0, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 0x20, 0x5678, &[]);
    assert_eq!(word(&mut m, &mut p, 0x20), Reply::Data(vec![0x34, 0x12]));
    // A USB reset is a power-on of the MAC, not of its EEPROM.
    m.reset();
    assert_eq!(word(&mut m, &mut p, 0x20), Reply::Data(vec![0x34, 0x12]));
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 0x20, 0x5678, &[]);
    assert_eq!(
        word(&mut m, &mut p, 0x20),
        Reply::Data(vec![0x34, 0x12]),
        "write-protected again after the reset"
    );
}

#[test]
fn monitor_mode_reads_back_and_qctctrl_is_accepted() {
    let (mut m, mut p) = setup();
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_MONITOR_MODE, 0, 0, 1),
        Reply::Data(vec![0])
    );
    wr(&mut m, &mut p, cmd::WRITE_MONITOR_MODE, 0x07, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_MONITOR_MODE, 0, 0, 1),
        Reply::Data(vec![0x07])
    );
    // The 6.12 driver's QCTCTRL write (ax88772a_hw_reset) is taken, not stalled.
    assert_eq!(
        wr(&mut m, &mut p, cmd::QCTCTRL, 0x8000, 0x8001, &[]),
        Reply::Done(0)
    );
}

#[test]
fn mdio_register_31_is_the_last_one_that_reaches_the_phy() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::SET_SW_MII, 0, 0, &[]);
    rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 31, 2);
    wr(&mut m, &mut p, cmd::WRITE_MII_REG, 0x10, 31, &[0x01, 0x00]);
    rd(&mut m, &mut p, cmd::READ_MII_REG, 0x10, 32, 2);
    wr(&mut m, &mut p, cmd::WRITE_MII_REG, 0x10, 32, &[0x01, 0x00]);
    let s = p.snapshot();
    assert_eq!(s.mdio_reads.get("0x1f"), Some(&1), "{:?}", s.mdio_reads);
    assert_eq!(s.mdio_writes.get("0x1f"), Some(&1), "{:?}", s.mdio_writes);
    assert_eq!(s.mdio_reads.len(), 1, "register 32 reached the PHY");
    assert_eq!(s.mdio_writes.len(), 1, "register 32 reached the PHY");
}

#[test]
fn sw_reset_flushes_only_the_queues_it_names() {
    let (mut m, mut p) = setup();
    let mut reset = |value: u16| {
        let s = Setup {
            requesttype: 0x40,
            request: cmd::SW_RESET,
            value,
            index: 0,
            length: 0,
        };
        let mut fx = Effects::default();
        assert_eq!(m.vendor(&mut p, &s, &[], &mut fx), Reply::Done(0));
        (fx.flush_rx, fx.flush_tx)
    };
    assert_eq!(reset(SW_RESET_IPRL), (false, false));
    assert_eq!(reset(SW_RESET_IPRL | SW_RESET_RR), (true, false));
    assert_eq!(reset(SW_RESET_IPRL | SW_RESET_RT), (false, true));
}

#[test]
fn a_setup_packet_prints_as_usbmon_names_its_fields() {
    let s = Setup {
        requesttype: 0xc0,
        request: cmd::READ_MII_REG,
        value: 0x10,
        index: 1,
        length: 2,
    };
    assert_eq!(
        s.to_string(),
        "bmRequestType=0xc0 bRequest=0x07 wValue=0x0010 wIndex=0x0001 wLength=2"
    );
}

#[test]
fn rx_needs_both_rx_ctl_so_and_medium_re() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0088, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_MEDIUM_MODE, 0x0206, 0, &[]);
    assert!(!m.rx_enabled(), "MEDIUM.RE clear");
    wr(&mut m, &mut p, cmd::WRITE_MEDIUM_MODE, 0x0306, 0, &[]);
    assert!(m.rx_enabled());
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0008, 0, &[]);
    assert!(!m.rx_enabled(), "RX_CTL.SO clear");
}

#[test]
fn broadcast_and_multicast_need_their_rx_ctl_bits() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0080, 0, &[]);
    assert!(!m.accepts(&[0xff; 6]), "broadcast without AB");
    assert!(m.accepts(&MAC));
    // The filter bit of 33:33:00:00:00:01 is set, but AM is not.
    let mut filter = [0u8; 8];
    filter[7] = 0x40;
    wr(&mut m, &mut p, cmd::WRITE_MULTI_FILTER, 0, 0, &filter);
    wr(&mut m, &mut p, cmd::WRITE_RX_CTL, 0x0088, 0, &[]);
    assert!(
        !m.accepts(&[0x33, 0x33, 0, 0, 0, 1]),
        "multicast without AM"
    );
}

#[test]
fn gpios_read_back_and_only_rse_reloads_the_node_id() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::WRITE_ENABLE, 0, 0, &[]);
    wr(&mut m, &mut p, cmd::WRITE_EEPROM, 4, 0x3412, &[]);
    wr(&mut m, &mut p, cmd::WRITE_GPIOS, 0x0001, 0, &[]);
    assert_eq!(
        rd(&mut m, &mut p, cmd::READ_GPIOS, 0, 0, 1),
        Reply::Data(vec![0x01])
    );
    assert_eq!(m.node_id, MAC, "no RSE, no reload");
    wr(&mut m, &mut p, cmd::WRITE_GPIOS, 0x0081, 0, &[]);
    assert_eq!(m.node_id[..2], [0x12, 0x34]);
}

#[test]
fn an_eeprom_write_past_the_last_word_is_ignored() {
    let (mut m, mut p) = setup();
    wr(&mut m, &mut p, cmd::WRITE_ENABLE, 0, 0, &[]);
    let last = EEPROM_WORDS as u16 - 1;
    assert_eq!(
        wr(&mut m, &mut p, cmd::WRITE_EEPROM, last, 0x1234, &[]),
        Reply::Done(0)
    );
    assert_eq!(
        wr(&mut m, &mut p, cmd::WRITE_EEPROM, last + 1, 0x5678, &[]),
        Reply::Done(0)
    );
    assert_eq!(m.eeprom()[usize::from(last)], 0x1234);
}
