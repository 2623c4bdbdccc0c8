//! Tests of `--relay`: usbredirect sessions spliced into QEMU's, refused,
//! reset or waited for.

use super::*;

fn next_msg<S: Timed>(m: &mut Model<S>) -> Message {
    m.next().msg
}

/// What an exporter session (usbredirect) reads first: QEMU's hello.
fn qemu_hello_read_by<S: Timed>(m: &mut Model<S>) -> usbredir::Hello {
    match next_msg(m) {
        Message::Hello(h) => h,
        other => panic!("expected QEMU's hello, got {other:?}"),
    }
}

fn device_connect() -> Message {
    Message::DeviceConnect(sample_identity().0)
}

#[test]
fn the_relay_splices_each_usbredirect_session_into_qemus_one() {
    let (qemu_end, relay_end) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let caps = gadget_caps();
    let mut qemu = Model::peer(qemu_end, Role::Guest, caps);
    let relay_addr = addr.clone();
    let (ended, relay) = mpsc::channel();
    let (failures, failed) = failures();
    std::thread::spawn(move || {
        ended.send(relay_on(port(relay_end), &relay_addr, PATIENCE, &failures))
    });
    qemu.hello();

    // The first session: both hellos pass, and everything after them.
    let s1 = accept_within(&listener);
    let mut one = Model::peer(s1, Role::Host, caps);
    assert_eq!(qemu_hello_read_by(&mut one).caps, caps);
    one.hello();
    one.send(0, device_connect());
    assert!(matches!(next_msg(&mut qemu), Message::Hello(h) if h.caps == caps));
    assert_eq!(next_msg(&mut qemu), device_connect());
    qemu.send(5, Message::SetConfiguration { configuration: 1 });
    let p = one.next();
    assert_eq!(
        (p.id, p.msg),
        (5, Message::SetConfiguration { configuration: 1 })
    );

    // usbredirect ends (its device went away): QEMU hears of it, and its
    // acknowledgement goes nowhere.
    drop(one);
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    qemu.send(0, Message::DeviceDisconnectAck);

    // The next usbredirect gets QEMU's hello; its own goes no further.
    let s2 = accept_within(&listener);
    let mut two = Model::peer(s2, Role::Host, caps);
    assert_eq!(qemu_hello_read_by(&mut two).caps, caps);
    two.hello();
    two.send(0, device_connect());
    assert_eq!(next_msg(&mut qemu), device_connect());
    qemu.send(9, Message::Reset);
    let p = two.next();
    assert_eq!(
        (p.id, p.msg),
        (9, Message::Reset),
        "the ack was not passed on"
    );
    assert!(logged_anywhere(
        "usbredirect session 1 ended (closed); QEMU was told the device went away"
    ));
    assert!(logged_anywhere("usbredirect session 2 at"));

    // QEMU going away ends the relay.
    drop(qemu);
    let r = relay.recv_timeout(PATIENCE).expect("the relay ended");
    assert!(r.is_ok(), "{r:?}");
    assert!(logged_anywhere("QEMU closed the port"));
    // Nothing there failed.
    assert!(failed.try_recv().is_err());
}

#[test]
fn a_failed_usbredirect_session_is_reported_as_a_workers_failure() {
    let (qemu_end, relay_end) = UnixStream::pair().unwrap();
    let addr = refused_addr().to_string();
    let mut qemu = Model::peer(qemu_end, Role::Guest, gadget_caps());
    let (failures, failed) = failures();
    let a = addr.clone();
    let (ended, relay) = mpsc::channel();
    std::thread::spawn(move || {
        ended.send(relay_on(
            port(relay_end),
            &a,
            Duration::from_millis(100),
            &failures,
        ))
    });
    // QEMU's hello starts the sessions; no usbredirect ever listens.
    qemu.hello();
    let e = failed
        .recv_timeout(PATIENCE)
        .expect("the sessions' failure is reported, the process lives on");
    assert!(
        format!("{e:#}").starts_with(&format!("relay: cannot connect to {addr}: ")),
        "{e:#}"
    );
    assert_eq!(exit_code(&e), 1);
    // The relay itself goes on until QEMU goes.
    drop(qemu);
    let r = relay.recv_timeout(PATIENCE).expect("the relay ended");
    assert!(r.is_ok(), "{r:?}");
}

/// What `exporter_sessions` starts from: QEMU's end of the port (its
/// hello already read by the relay), the relay's end, the relay's state,
/// and a listener standing in for usbredirect, with its address.
fn relay_after_qemus_hello() -> (Model, UnixStream, Mutex<Relay>, TcpListener, String) {
    let (qemu_end, relay_end) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let qemu = Model::peer(qemu_end, Role::Guest, gadget_caps());
    let sh = Mutex::new(Relay {
        splice: Splice::default(),
        to_exporter: None,
    });
    let mut hello = Vec::new();
    Codec::new(Role::Guest, gadget_caps())
        .encode_hello("qemu", &mut hello)
        .unwrap();
    sh.lock().unwrap().splice.from_qemu(hello).unwrap();
    (qemu, relay_end, sh, listener, addr)
}

#[test]
fn the_relay_refuses_a_usbredirect_with_other_capabilities() {
    let (mut qemu, relay_end, sh, listener, addr) = relay_after_qemus_hello();
    let exporter = std::thread::spawn(move || {
        for caps in [gadget_caps(), Caps::XHCI_HOST] {
            let s = accept_within(&listener);
            let mut e = Model::peer(s, Role::Host, caps);
            qemu_hello_read_by(&mut e);
            e.hello();
            e.send(0, device_connect());
            if caps != gadget_caps() {
                // Kept open: the relay must end it, not wait.
                return e;
            }
        }
        unreachable!()
    });
    let err = exporter_sessions(&sh, &addr, port(relay_end), PATIENCE).unwrap_err();
    assert!(
        format!("{err:#}").contains("new session offers capabilities"),
        "{err:#}"
    );
    // What QEMU heard: the first hello, the device, its going away, and
    // nothing of the second session.
    assert!(matches!(next_msg(&mut qemu), Message::Hello(_)));
    assert_eq!(next_msg(&mut qemu), device_connect());
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    assert!(qemu.try_next(Duration::from_millis(200)).is_none());
    drop(exporter.join().unwrap());
}

#[test]
fn the_relay_ends_on_a_port_that_fails_to_read() {
    let t = TempDir::new("relayport");
    // A directory: every read fails (EISDIR), again and again.
    let port = Conn::Port(File::open(&t.0).unwrap());
    let (failures, _failed) = failures();
    let r = in_thread(move || relay_on(port, "127.0.0.1:1", Duration::from_millis(100), &failures));
    let e = format!("{:#}", r.unwrap_err());
    assert!(e.contains("relay: reading the port"), "{e}");
}

#[test]
fn a_usbredirect_session_reset_by_its_peer_ends_with_that_reason() {
    let (mut qemu, relay_end, sh, listener, addr) = relay_after_qemus_hello();
    let (up, device_up) = mpsc::channel();
    let exporter = std::thread::spawn(move || {
        // The first session is reset (RST, not FIN) once QEMU has the device.
        let s = accept_within(&listener);
        let mut e = Model::peer(s, Role::Host, gadget_caps());
        qemu_hello_read_by(&mut e);
        e.hello();
        e.send(0, device_connect());
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a linger of the size given.
        let rc = unsafe {
            libc::setsockopt(
                e.s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        device_up.recv_timeout(PATIENCE).unwrap();
        drop(e);
        // The second offers other capabilities: the relay ends there.
        let s = accept_within(&listener);
        let mut e = Model::peer(s, Role::Host, Caps::XHCI_HOST);
        qemu_hello_read_by(&mut e);
        e.hello();
        e.send(0, device_connect());
        e
    });
    let relay =
        std::thread::spawn(move || exporter_sessions(&sh, &addr, port(relay_end), PATIENCE));
    assert!(matches!(next_msg(&mut qemu), Message::Hello(_)));
    assert_eq!(next_msg(&mut qemu), device_connect());
    up.send(()).unwrap();
    assert_eq!(next_msg(&mut qemu), Message::DeviceDisconnect);
    let err = in_thread(move || relay.join().unwrap()).unwrap_err();
    assert!(
        format!("{err:#}").contains("new session offers capabilities"),
        "{err:#}"
    );
    assert!(logged_anywhere(
        "usbredirect session 1 ended (Connection reset by peer"
    ));
    drop(exporter.join().unwrap());
}

#[test]
fn the_first_usbredirect_is_waited_for_within_its_limit_only() {
    let addr = refused_addr().to_string();
    let t = Instant::now();
    let a = addr.clone();
    let e = in_thread(move || connect_exporter(&a, Some(Duration::from_millis(200)))).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(
        format!("{e:#}").contains(&format!("cannot connect to {addr}")),
        "{e:#}"
    );
    // Without a limit it waits for the listener.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let waiter = std::thread::spawn(move || connect_exporter(&addr.to_string(), None));
    std::thread::sleep(Duration::from_millis(300));
    let l = TcpListener::bind(addr).unwrap();
    let _s = accept_within(&l);
    assert!(waiter.join().unwrap().is_ok());
}
