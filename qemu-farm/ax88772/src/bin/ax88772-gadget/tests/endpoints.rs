//! Tests of the model's reader and the endpoints' pumps: routing, binding
//! on plug and unplug, bulk IN and OUT, interrupt IN, and the AIO they use.

use super::*;

#[test]
fn route_hands_each_packet_to_its_taker() {
    let (link, _s, _m) = link_pair();
    let t = TempDir::new("route");
    let sh = shared(link, &t.0);
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let (bulk_tx, bulk_rx) = mpsc::sync_channel(4);
    let (int_tx, int_rx) = mpsc::sync_channel(1);
    let pumps = HashMap::from([(0x82, bulk_tx), (0x81, int_tx)]);
    let control = Message::ControlPacket(ControlPacket {
        request: 9,
        ..Default::default()
    });
    route(&sh, &ctrl_tx, &pumps, Packet::new(5, control));
    assert_eq!(ctrl_rx.try_recv().unwrap().id, 5);
    for ep in [0x82, 0x83] {
        let b = BulkPacket {
            endpoint: ep,
            data: vec![ep],
            ..Default::default()
        };
        route(
            &sh,
            &ctrl_tx,
            &pumps,
            Packet::new(6, Message::BulkPacket(b)),
        );
    }
    match bulk_rx.try_recv().unwrap() {
        ToPump::Bulk(b) => assert_eq!(b.data, [0x82]),
        ToPump::Interrupt(_) => panic!("a bulk packet became an interrupt one"),
    }
    assert!(bulk_rx.try_recv().is_err());
    // The interrupt pump holds one: a second is dropped, not waited on.
    for d in [1, 2] {
        let i = SmallDataPacket {
            endpoint: 0x81,
            data: vec![d],
            ..Default::default()
        };
        route(
            &sh,
            &ctrl_tx,
            &pumps,
            Packet::new(7, Message::InterruptPacket(i)),
        );
    }
    match int_rx.try_recv().unwrap() {
        ToPump::Interrupt(i) => assert_eq!(i.data, [1]),
        ToPump::Bulk(_) => panic!("an interrupt packet became a bulk one"),
    }
    assert!(int_rx.try_recv().is_err());
    assert!(ctrl_rx.try_recv().is_err());
    assert!(!t.0.join("UDC").exists());
}

#[test]
fn the_models_unplug_and_plug_unbind_and_bind_the_gadget() {
    let (link, _s, mut m) = link_pair();
    let t = TempDir::new("bind");
    let sh = shared(link, &t.0);
    let (ctrl_tx, _ctrl_rx) = mpsc::channel();
    let pumps = HashMap::new();
    let udc = t.0.join("UDC");
    let connect = || Packet::new(0, Message::DeviceConnect(sample_identity().0));
    // Plugged already: nothing to do.
    route(&sh, &ctrl_tx, &pumps, connect());
    assert!(!udc.exists());
    assert!(sh.plugged.load(Ordering::SeqCst));

    route(
        &sh,
        &ctrl_tx,
        &pumps,
        Packet::new(0, Message::DeviceDisconnect),
    );
    assert!(!sh.plugged.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&udc).unwrap(), "\n");
    assert!(matches!(m.next().msg, Message::DeviceDisconnectAck));
    assert!(logged(&log(), "I: gadget unbound"));

    route(&sh, &ctrl_tx, &pumps, connect());
    assert!(sh.plugged.load(Ordering::SeqCst));
    assert_eq!(std::fs::read_to_string(&udc).unwrap(), "dummy_udc.0");
    assert!(logged(&log(), "I: gadget bound"));
}

#[test]
fn a_failed_bind_is_reported() {
    let (link, _s, _m) = link_pair();
    let t = TempDir::new("nobind");
    let sh = shared(link, &t.0.join("absent"));
    log();
    sh.bind(true);
    let l = log();
    assert!(logged(&l, "W: writing \"dummy_udc.0\" to"), "{l:?}");
}

#[test]
fn reader_decodes_the_models_stream() {
    let (link, s, mut m) = link_pair();
    let t = TempDir::new("reader");
    let sh = shared(link, &t.0);
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let (bulk_tx, bulk_rx) = mpsc::sync_channel(4);
    let pumps = HashMap::from([(0x82, bulk_tx)]);
    let (ended, reader_ended) = mpsc::channel();
    {
        let sh = sh.clone();
        std::thread::spawn(move || ended.send(reader(s, sh, ctrl_tx, pumps)));
    }
    let control = ControlPacket {
        endpoint: 0x80,
        requesttype: 0xc0,
        request: 7,
        length: 2,
        data: vec![1, 2],
        ..Default::default()
    };
    m.send(42, Message::ControlPacket(control.clone()));
    let data = vec![0x55; 3000];
    m.send(
        43,
        Message::BulkPacket(BulkPacket {
            endpoint: 0x82,
            length: data.len() as u32,
            data: data.clone(),
            ..Default::default()
        }),
    );
    m.send(44, Message::DeviceDisconnect);
    let p = ctrl_rx.recv_timeout(PATIENCE).unwrap();
    assert_eq!(p, Packet::new(42, Message::ControlPacket(control)));
    match bulk_rx.recv_timeout(PATIENCE).unwrap() {
        ToPump::Bulk(b) => assert_eq!(b.data, data),
        ToPump::Interrupt(_) => panic!("a bulk packet became an interrupt one"),
    }
    assert!(matches!(m.next().msg, Message::DeviceDisconnectAck));
    assert!(!sh.plugged.load(Ordering::SeqCst));
    // The unbind follows the acknowledgement.
    let deadline = Instant::now() + PATIENCE;
    while std::fs::read_to_string(t.0.join("UDC")).ok().as_deref() != Some("\n") {
        assert!(Instant::now() < deadline, "the gadget was not unbound");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The model hanging up ends the reader with that error, for the
    // gadget to end on; the pumps' channels close with it.
    drop(m);
    let e = reader_ended.recv_timeout(PATIENCE).unwrap().unwrap_err();
    assert_eq!(format!("{e:#}"), "the model closed the connection");
    assert!(matches!(
        bulk_rx.recv_timeout(PATIENCE),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
}

#[test]
fn reader_ends_on_a_bad_packet() {
    let (link, s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, _ctrl_rx) = mpsc::channel();
    // A header of a packet type usbredir does not have.
    m.s.write_all(&[0x77, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let e = in_thread(move || reader(s, sh, ctrl_tx, HashMap::new())).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.starts_with("the model sent a bad packet: unknown packet type 30583"),
        "{e}"
    );
    drop(m);
}

#[test]
fn reader_ends_on_a_failed_read() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, _ctrl_rx) = mpsc::channel();
    let t = TempDir::new("readerdir");
    // A directory: reading it fails (EISDIR).
    let s = Conn::Port(File::open(&t.0).unwrap());
    let e = in_thread(move || reader(s, sh, ctrl_tx, HashMap::new())).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        "reading from the model: Is a directory (os error 21)"
    );
}

#[test]
fn bulk_in_writes_what_the_model_returned_in_one_go() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    tx.send(bulk(0x82, Status::SUCCESS, &[b'a'; 1000])).unwrap();
    tx.send(bulk(0x82, Status::STALL, &[b'x'; 10])).unwrap();
    tx.send(bulk(0x82, Status::SUCCESS, &[b'b'; 1000])).unwrap();
    tx.send(bulk(0x82, Status::SUCCESS, &[b'c'; 1000])).unwrap();
    let (mut host, file) = records();
    let pump = std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (2048, 2)));
    for _ in 0..2 {
        let b = m.next_bulk();
        assert_eq!((b.endpoint, b.length, b.data.len()), (0x82, 2048, 0));
    }
    let got = record(&mut host);
    assert_eq!(got, [[b'a'; 1000], [b'b'; 1000], [b'c'; 1000]].concat());
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_writes_at_most_coalesce_and_one_transfer_at_once() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    for b in [1u8, 2, 3] {
        tx.send(bulk(0x82, Status::SUCCESS, &vec![b; COALESCE / 2]))
            .unwrap();
    }
    let (mut host, file) = records();
    let pump = std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (16384, 4)));
    assert_eq!(
        record(&mut host),
        [vec![1u8; COALESCE / 2], vec![2u8; COALESCE / 2]].concat()
    );
    assert_eq!(record(&mut host), vec![3u8; COALESCE / 2]);
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_asks_again_when_the_host_enables_anew() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    sh.enabled.store(false, Ordering::SeqCst);
    let (tx, rx) = mpsc::sync_channel(64);
    let (_host, file) = records();
    let pump = {
        let sh = sh.clone();
        std::thread::spawn(move || bulk_in(sh, BULK_IN, file, rx, (512, 2)))
    };
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    sh.enabled.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(m.next_bulk().length, 512);
    }
    // Two in flight, none answered: nothing more is asked.
    assert!(m.try_next(Duration::from_millis(300)).is_none());
    // Enabled again (a reset): what was asked before is forgotten.
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(m.next_bulk().length, 512);
    }
    assert!(m.try_next(Duration::from_millis(300)).is_none());
    drop(tx);
    in_thread(move || pump.join().unwrap());
}

#[test]
fn bulk_in_reports_a_failed_write() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (tx, rx) = mpsc::sync_channel(64);
    tx.send(bulk(0x82, Status::SUCCESS, &[1])).unwrap();
    drop(tx);
    let (host, file) = records();
    drop(host);
    // On a thread of its own, which gives back what it logged.
    let l = in_thread(move || {
        bulk_in(sh, BULK_IN, file, rx, (512, 1));
        log()
    });
    assert!(logged(&l, "W: ep 0x82:"), "{l:?}");
}

#[test]
fn is_gone_knows_the_errors_of_a_disabled_or_gone_function() {
    for e in [libc::ESHUTDOWN, libc::EIO, libc::ENODEV, libc::EINTR] {
        assert!(is_gone(&std::io::Error::from_raw_os_error(e)), "{e}");
    }
    for e in [libc::EPIPE, libc::EBADF, libc::EAGAIN] {
        assert!(!is_gone(&std::io::Error::from_raw_os_error(e)), "{e}");
    }
}

#[test]
fn interrupt_in_writes_only_successful_data() {
    let (mut host, file) = pipe();
    let (tx, rx) = mpsc::sync_channel(8);
    tx.send(interrupt(Status::STALL, &[1, 2])).unwrap();
    tx.send(interrupt(Status::SUCCESS, &[])).unwrap();
    tx.send(bulk(0x81, Status::SUCCESS, &[3])).unwrap();
    tx.send(interrupt(Status::SUCCESS, &[0xa1, 0x00, 0x01]))
        .unwrap();
    drop(tx);
    interrupt_in(INT_IN, file, rx);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, [0xa1, 0x00, 0x01]);
}

#[test]
fn interrupt_in_reports_a_failed_write() {
    let (host, file) = pipe();
    drop(host);
    let (tx, rx) = mpsc::sync_channel(8);
    tx.send(interrupt(Status::SUCCESS, &[1])).unwrap();
    drop(tx);
    log();
    interrupt_in(INT_IN, file, rx);
    assert!(logged(&log(), "W: ep 0x81:"));
}

#[test]
fn aio_check_passes_counts_and_turns_failures_into_errno() {
    assert_eq!(aio::check(0).unwrap(), 0);
    assert_eq!(aio::check(7).unwrap(), 7);
    // SAFETY: errno is this thread's own.
    unsafe { *libc::__errno_location() = libc::EBADF };
    assert_eq!(
        aio::check(-1).unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
}

#[test]
fn aio_reads_a_file() {
    let t = TempDir::new("aio");
    let p = t.0.join("f");
    std::fs::write(&p, "hello aio").unwrap();
    let f = File::open(&p).unwrap();
    let ctx = aio::Ctx::new(2).unwrap();
    let mut r = aio::Read::new(f.as_raw_fd(), 7, 64);
    ctx.submit(&mut r).unwrap();
    let mut ev = [aio::Event::default(); 2];
    assert_eq!(ctx.wait(&mut ev).unwrap(), 1);
    assert_eq!((ev[0].data, ev[0].res), (7, 9));
    assert_eq!(&r.buf[..9], b"hello aio");
}

#[test]
fn bulk_out_passes_transfers_on_at_most_in_flight_unanswered() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let t = TempDir::new("bulkout");
    let p = t.0.join("ep3");
    // A regular file: every read (at offset 0) completes at once with
    // the same transfer, here one larger than any Ethernet frame.
    let content: Vec<u8> = (0..2000).map(|i| (i % 251) as u8).collect();
    std::fs::write(&p, &content).unwrap();
    let file = File::open(&p).unwrap();
    let (tx, rx) = mpsc::sync_channel(64);
    let (done_tx, done_rx) = mpsc::channel();
    {
        let sh = sh.clone();
        std::thread::spawn(move || {
            bulk_out(sh, BULK_OUT, file, rx, 1).unwrap();
            let _ = done_tx.send(());
        });
    }
    let frame = |b: BulkPacket| (b.endpoint, b.length, b.data);
    let want = (0x03, 2000, content);
    assert_eq!(frame(m.next_bulk()), want);
    // One in flight: the next waits for the model's answer.
    assert!(m.try_next(Duration::from_millis(100)).is_none());
    tx.send(bulk(0x03, Status::SUCCESS, &[])).unwrap();
    assert_eq!(frame(m.next_bulk()), want);
    // Enabled again: the unanswered one is forgotten.
    sh.epoch.fetch_add(1, Ordering::SeqCst);
    assert_eq!(frame(m.next_bulk()), want);
    drop(tx);
    done_rx
        .recv_timeout(PATIENCE)
        .expect("bulk_out returns once nothing feeds it");
}

#[test]
fn bulk_out_reports_a_failed_read_and_reads_again() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    // A non-blocking socket: a read with nothing there completes with
    // EAGAIN.
    let (mut host, ep) = UnixStream::pair().unwrap();
    ep.set_nonblocking(true).unwrap();
    let file = File::from(OwnedFd::from(ep));
    let (tx, rx) = mpsc::sync_channel(64);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        bulk_out(sh, BULK_OUT, file, rx, 1).unwrap();
        let _ = done_tx.send(());
    });
    let deadline = Instant::now() + PATIENCE;
    while !logged_anywhere("W: ep 0x03: Resource temporarily unavailable") {
        assert!(
            Instant::now() < deadline,
            "the failed read was not reported"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    host.write_all(b"late").unwrap();
    assert_eq!(m.next_bulk().data, b"late");
    drop(tx);
    // One more transfer finds the model's answers gone.
    host.write_all(b"last").unwrap();
    done_rx
        .recv_timeout(PATIENCE)
        .expect("bulk_out returns once nothing feeds it");
}

#[test]
fn bulk_out_ends_with_a_failed_aio_call_as_its_error() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let t = TempDir::new("bulkoutdir");
    // A directory cannot be read through AIO: io_submit refuses it.
    let file = File::open(&t.0).unwrap();
    let (_tx, rx) = mpsc::sync_channel(64);
    let e = in_thread(move || bulk_out(sh, BULK_OUT, file, rx, 2)).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        "ep 0x03: io_submit: Invalid argument (os error 22)"
    );
}

#[test]
fn an_ended_gadget_is_neither_bound_nor_unbound() {
    let (link, _s, _m) = link_pair();
    let t = TempDir::new("ended");
    let sh = shared(link, &t.0);
    assert!(!sh.has_ended());
    sh.end();
    assert!(sh.has_ended());
    log();
    sh.bind(true);
    sh.bind(false);
    assert!(!t.0.join("UDC").exists());
    assert_eq!(log(), Vec::<String>::new());
}

/// A FunctionFS event as ep0 reads it (`struct usb_functionfs_event`).
fn ffs_event(kind: u8) -> [u8; gadget::EVENT_LEN] {
    let mut e = [0u8; gadget::EVENT_LEN];
    e[8] = kind;
    e
}

const ENABLE: u8 = 2;
const DISABLE: u8 = 3;

#[test]
fn ep0_events_pass_the_hosts_enabling_on_until_the_gadget_ends() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    sh.enabled.store(false, Ordering::SeqCst);
    let (_ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    let (ep0, mut host) = pipe();
    let (ended, events_ended) = mpsc::channel();
    {
        let sh = sh.clone();
        std::thread::spawn(move || {
            let r = ep0_events(&sh, ep0, &ctrl_rx, Some(0x81));
            let _ = ended.send((r.map_err(|e| e.to_string()), log()));
        });
    }
    host.write_all(&ffs_event(ENABLE)).unwrap();
    assert_eq!(m.next().msg, Message::SetConfiguration { configuration: 1 });
    assert_eq!(
        m.next().msg,
        Message::StartInterruptReceiving { endpoint: 0x81 }
    );
    let deadline = Instant::now() + PATIENCE;
    while !sh.enabled.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the function was not enabled");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(sh.epoch.load(Ordering::SeqCst), 1);
    // Ended (a failure elsewhere): the clean-up's unbinding disables the
    // function, and that is not passed on.
    sh.end();
    host.write_all(&ffs_event(DISABLE)).unwrap();
    let (r, l) = events_ended.recv_timeout(PATIENCE).unwrap();
    assert_eq!(r, Ok(()));
    assert_eq!(l, ["I: the host enabled the function"]);
    assert!(sh.enabled.load(Ordering::SeqCst));
    assert!(m.try_next(Duration::from_millis(100)).is_none());
}

#[test]
fn a_failed_ep0_read_ends_the_gadget_as_its_main_path_does() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (_ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    // A write end: reading it fails (EBADF).
    let (_r, ep0) = pipe();
    let (failures, failed) = failures();
    failures.main_path("ep0", move || ep0_events(&sh, ep0, &ctrl_rx, None));
    let e = failed.recv_timeout(PATIENCE).unwrap();
    assert_eq!(
        format!("{e:#}"),
        "reading ep0 events: Bad file descriptor (os error 9)"
    );
    assert_eq!(exit_code(&e), 2);
}
