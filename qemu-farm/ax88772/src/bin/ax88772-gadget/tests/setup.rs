//! Tests of ep0's setup requests answered through the model: IN and OUT,
//! stalls, zero-length requests, no answer, a model gone.

use super::*;

fn control_reply(id: u64, status: Status, data: &[u8]) -> Packet {
    Packet::new(
        id,
        Message::ControlPacket(ControlPacket {
            status,
            length: data.len() as u16,
            data: data.to_vec(),
            ..Default::default()
        }),
    )
}

fn sent_control(m: &mut Model) -> (u64, ControlPacket) {
    let p = m.next();
    match p.msg {
        Message::ControlPacket(c) => (p.id, c),
        msg => panic!("expected a control packet, got {msg:?}"),
    }
}

const VENDOR_IN: Setup = Setup {
    request_type: 0xc0,
    request: 0x1b,
    value: 0x0102,
    index: 0x0304,
    length: 4,
};

const VENDOR_OUT: Setup = Setup {
    request_type: 0x40,
    request: 0x10,
    value: 0x0005,
    index: 0,
    length: 3,
};

#[test]
fn setup_answers_an_in_request_with_the_models_reply() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    // A reply to another request first: setup waits for its own.
    ctrl_tx
        .send(control_reply(id + 7, Status::SUCCESS, b"late"))
        .unwrap();
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b"abcdef"))
        .unwrap();
    let (mut host, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    drop(ep0);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"abcd");
    let (sent, c) = sent_control(&mut m);
    assert_eq!(sent, id);
    assert_eq!(
        c,
        ControlPacket {
            endpoint: 0x80,
            request: 0x1b,
            requesttype: 0xc0,
            status: Status::SUCCESS,
            value: 0x0102,
            index: 0x0304,
            length: 4,
            data: vec![],
        }
    );
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_waits_for_the_models_answer() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    // The answer comes only once the model has the request.
    let model = std::thread::spawn(move || {
        let (id, _) = sent_control(&mut m);
        ctrl_tx
            .send(control_reply(id, Status::SUCCESS, b"wxyz"))
            .unwrap();
        (m, ctrl_tx)
    });
    let (mut host, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    drop(ep0);
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"wxyz");
    assert_eq!(log(), Vec::<String>::new());
    drop(model.join().unwrap());
}

#[test]
fn setup_stalls_an_in_request_the_model_refused() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    // ep0 reads to stall an IN request: a read end takes that quietly.
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_reports_an_ep0_error_other_than_a_stall() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    // A write end cannot be read: the stall fails with EBADF.
    let (_r, mut ep0) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    let l = log();
    assert!(logged(&l, "W: ep0:"), "{l:?}");
}

#[test]
fn setup_passes_an_out_requests_data_to_the_model() {
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b""))
        .unwrap();
    let (mut ep0, mut w) = pipe();
    w.write_all(&[7, 8, 9]).unwrap();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_OUT).unwrap();
    let (_, c) = sent_control(&mut m);
    assert_eq!(
        (
            c.endpoint,
            c.request,
            c.requesttype,
            c.value,
            c.length,
            c.data
        ),
        (0x00, 0x10, 0x40, 0x0005, 3, vec![7, 8, 9])
    );
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_warns_of_an_out_request_refused_after_its_data() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    let (mut ep0, mut w) = pipe();
    w.write_all(&[7, 8, 9]).unwrap();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_OUT).unwrap();
    let l = log();
    assert!(logged(&l, "refused OUT request 0x40/0x10"), "{l:?}");
}

#[test]
fn setup_finishes_a_zero_length_out_request_either_way() {
    let no_data = Setup {
        length: 0,
        ..VENDOR_OUT
    };
    // Accepted: a read of nothing (a read end takes it quietly).
    let (link, _s, mut m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx
        .send(control_reply(id, Status::SUCCESS, b""))
        .unwrap();
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
    assert_eq!(sent_control(&mut m).1.length, 0);
    assert_eq!(log(), Vec::<String>::new());
    // Refused: a write of nothing (a write end takes it quietly).
    let id = sh.link.next_id.load(Ordering::SeqCst);
    ctrl_tx.send(control_reply(id, Status::STALL, b"")).unwrap();
    let (_r, mut ep0) = pipe();
    setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
    assert_eq!(log(), Vec::<String>::new());
}

#[test]
fn setup_ends_a_zero_length_out_request_with_a_read_or_a_write() {
    let no_data = Setup {
        length: 0,
        ..VENDOR_OUT
    };
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel();
    // Each case gets the end of a pipe that cannot do what it should:
    // the error it reports shows which it did.
    for (status, read_end) in [(Status::SUCCESS, false), (Status::STALL, true)] {
        let id = sh.link.next_id.load(Ordering::SeqCst);
        ctrl_tx.send(control_reply(id, status, b"")).unwrap();
        let (r, w) = pipe();
        let mut ep0 = if read_end { r } else { w };
        log();
        setup(&sh, &mut ep0, &ctrl_rx, no_data).unwrap();
        let l = log();
        assert!(
            logged(&l, "W: ep0: Bad file descriptor"),
            "{status:?}: {l:?}"
        );
    }
}

#[test]
fn setup_without_an_answer_stalls_and_says_so() {
    let (link, _s, _m) = link_pair();
    let sh = shared(link, Path::new(""));
    let (ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    drop(ctrl_tx);
    let (mut ep0, _w) = pipe();
    log();
    setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap();
    let l = log();
    assert!(logged(&l, "did not answer request 0xc0/0x1b"), "{l:?}");
    assert!(!logged(&l, "W: ep0:"), "{l:?}");
}

#[test]
fn setup_fails_when_the_model_is_gone() {
    let (link, _s, m) = link_pair();
    drop(m);
    let sh = shared(link, Path::new(""));
    let (_ctrl_tx, ctrl_rx) = mpsc::channel::<Packet>();
    let (mut ep0, _w) = pipe();
    let e = setup(&sh, &mut ep0, &ctrl_rx, VENDOR_IN).unwrap_err();
    assert!(e.to_string().contains("writing to the model"), "{e}");
}
