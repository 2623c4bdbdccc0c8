//! Tests of the gadget's life and its end: a thread's failure (or panic)
//! reported to the main thread, and a worker failing after the gadget is
//! set up taking back everything it made, once, however many fail.

use super::*;
use std::os::unix::fs::OpenOptionsExt;
use std::thread::JoinHandle;

#[test]
fn a_failed_worker_is_reported_with_its_own_message_and_exits_1() {
    let (failures, failed) = failures();
    failures.worker("test worker", || {
        Err(anyhow::anyhow!("the cause").context("the model closed the connection"))
    });
    let e = failed.recv_timeout(PATIENCE).unwrap();
    assert_eq!(
        format!("{e:#}"),
        "the model closed the connection: the cause"
    );
    assert_eq!(exit_code(&e), 1);
    failures.main_path("test ep0", || bail!("reading ep0 events: gone"));
    let e = failed.recv_timeout(PATIENCE).unwrap();
    assert_eq!(format!("{e:#}"), "reading ep0 events: gone");
    assert_eq!(exit_code(&e), 2);
    assert_eq!(exit_code(&anyhow::anyhow!("any other")), 2);
}

#[test]
fn a_panicking_thread_is_reported_as_its_failure() {
    let (failures, failed) = failures();
    failures.worker("test worker", || panic!("boom"));
    let e = failed.recv_timeout(PATIENCE).unwrap();
    assert_eq!(format!("{e:#}"), "the test worker thread panicked: boom");
    assert_eq!(exit_code(&e), 1);
    failures.main_path("test ep0", || panic!("{}", "bang".to_string()));
    let e = failed.recv_timeout(PATIENCE).unwrap();
    assert_eq!(format!("{e:#}"), "the test ep0 thread panicked: bang");
    assert_eq!(exit_code(&e), 2);
}

#[test]
fn a_thread_ending_well_reports_nothing() {
    let (failures, failed) = failures();
    failures.worker("test worker", || Ok(()));
    drop(failures);
    assert!(matches!(
        failed.recv_timeout(PATIENCE),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
}

/// The model's identity with one endpoint, interrupt IN: the gadget's
/// threads are then ep0's, the model's reader and one pump, which ends
/// with the reader.
fn one_endpoint() -> Identity {
    let (connect, iface, _) = sample_identity();
    let mut eps = EpInfo::default();
    let i = usbredir::ep_index(0x81);
    eps.ep_type[i] = ep_type::INTERRUPT;
    eps.max_packet_size[i] = 8;
    Identity {
        connect,
        iface,
        eps,
        strings: ["ASIX".into(), "AX88772A".into(), "0001".into()],
    }
}

/// A pty standing in for FunctionFS's ep0, which the gadget opens by its
/// path: what the gadget writes there (its descriptors) is read at
/// `master`, and its reads wait for what is written to `master`.
struct FakeEp0 {
    master: File,
    /// The gadget's end, held here too so that its raw mode lasts.
    _slave: File,
    path: PathBuf,
}

impl FakeEp0 {
    fn new() -> FakeEp0 {
        // SAFETY: plain calls; the descriptor is checked before use.
        let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor owned by nobody else.
        let master = unsafe { File::from_raw_fd(fd) };
        let mut name = [0 as libc::c_char; 128];
        // SAFETY: `fd` is a pty master; `name` has room for its length.
        unsafe {
            assert_eq!(libc::grantpt(fd), 0);
            assert_eq!(libc::unlockpt(fd), 0);
            assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        }
        // SAFETY: ptsname_r wrote a NUL-terminated name.
        let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
        let path = PathBuf::from(path.to_str().unwrap());
        let slave = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&path)
            .unwrap();
        // Raw: no echo, every byte as it is.
        // SAFETY: a termios read, changed and written back on a tty.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0);
            libc::cfmakeraw(&mut t);
            assert_eq!(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t), 0);
            // The gadget opens ep0 without O_NOCTTY: a test process leading
            // its own session would take the pty as its terminal, and its
            // hang-up at the end as a SIGHUP.
            if libc::getsid(0) == libc::getpid() {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
            }
        }
        FakeEp0 {
            master,
            _slave: slave,
            path,
        }
    }
}

/// The FunctionFS mount points the fake unmounts took back.
static UNMOUNTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn unmounts_of(ffs: &Path) -> usize {
    UNMOUNTED
        .lock()
        .unwrap()
        .iter()
        .filter(|p| *p == ffs)
        .count()
}

/// [`Made`]'s unmount on the fake tree: the gadget is unbound by then.
/// What the fake mount made goes, and so does the gadget's `UDC` (in
/// configfs, an attribute that goes with its directory).
fn fake_unmount(ffs: &Path) -> std::io::Result<()> {
    UNMOUNTED.lock().unwrap().push(ffs.to_path_buf());
    let udc = ffs
        .parent()
        .unwrap()
        .join("usb_gadget")
        .join(NAME)
        .join("UDC");
    assert_eq!(std::fs::read_to_string(&udc)?, "\n", "unbound first");
    std::fs::remove_file(udc)?;
    for e in std::fs::read_dir(ffs)? {
        std::fs::remove_file(e?.path())?;
    }
    Ok(())
}

/// [`fake_unmount`], taking its time: a failure coming after the first
/// lands while the clean-up runs.
fn slow_unmount(ffs: &Path) -> std::io::Result<()> {
    std::thread::sleep(Duration::from_millis(300));
    fake_unmount(ffs)
}

/// The gadget's `life` on a fake tree in `t` (configfs there, FunctionFS
/// in `t/ffs`: `ep0` the pty, `ep1` a file), with `extra` arguments, on a
/// thread of its own: what it returned and the lines it logged.
fn live(
    t: &TempDir,
    extra: &[&str],
    (link, s): (Link, Conn),
    ep0: &FakeEp0,
    unmount: fn(&Path) -> std::io::Result<()>,
) -> JoinHandle<(Result<()>, Vec<String>)> {
    let ffs = t.0.join("ffs");
    let mut v = vec![
        "--configfs",
        t.0.to_str().unwrap(),
        "--ffs",
        ffs.to_str().unwrap(),
    ];
    v.extend(extra);
    let a = args(&v);
    let pty = ep0.path.clone();
    std::thread::spawn(move || {
        let id = one_endpoint();
        let eps = gadget::endpoints(&id.eps).unwrap();
        let d = gadget::descriptors(&id.iface, &eps).unwrap();
        let mut made = Made {
            unmount,
            ..Made::default()
        };
        let mount = |ffs: &Path| -> Result<()> {
            std::os::unix::fs::symlink(&pty, ffs.join("ep0"))?;
            std::fs::write(ffs.join("ep1"), "")?;
            Ok(())
        };
        let udc = "dummy_udc.0".to_string();
        let r = life(&a, &id, &eps, &d, link, s, udc, &mut made, mount);
        assert!(made.steps.is_empty(), "{:?}", made.steps);
        (r, log())
    })
}

#[test]
fn the_model_hanging_up_after_the_set_up_takes_the_gadget_back() {
    let t = TempDir::new("life-hangup");
    // configfs has usb_gadget of its own: it stays.
    std::fs::create_dir(t.0.join("usb_gadget")).unwrap();
    let before = tree(&t.0);
    let (link, s, m) = link_pair();
    let mut ep0 = FakeEp0::new();
    let life = live(&t, &[], (link, s), &ep0, fake_unmount);
    // Set up: bound, after the function's descriptors went to ep0.
    let udc = t.0.join("usb_gadget/ax88772/UDC");
    let deadline = Instant::now() + PATIENCE;
    while std::fs::read_to_string(&udc).ok().as_deref() != Some("dummy_udc.0") {
        assert!(Instant::now() < deadline, "the gadget was not bound");
        std::thread::sleep(Duration::from_millis(5));
    }
    let id = one_endpoint();
    let d = gadget::descriptors(&id.iface, &gadget::endpoints(&id.eps).unwrap()).unwrap();
    let mut got = vec![0u8; d.len() + gadget::strings().len()];
    ep0.master.read_exact(&mut got).unwrap();
    assert_eq!(got, [d, gadget::strings()].concat());

    drop(m);
    let (r, l) = in_thread(move || life.join().unwrap());
    let e = r.unwrap_err();
    assert_eq!(format!("{e:#}"), "the model closed the connection");
    assert_eq!(exit_code(&e), 1);
    assert_eq!(tree(&t.0), before, "everything made is gone, nothing else");
    assert_eq!(unmounts_of(&t.0.join("ffs")), 1);
    assert_eq!(l, ["I: gadget bound"], "a clean clean-up");
}

#[test]
fn two_workers_failing_together_take_the_gadget_back_once() {
    let t = TempDir::new("life-two");
    let before = tree(&t.0);
    let (link, s, m) = link_pair();
    let ep0 = FakeEp0::new();
    // The model is gone and `--relay` names no port: the model's reader
    // and the relay fail as soon as they start, the gadget bound between.
    drop(m);
    let life = live(
        &t,
        &["--relay", "no-port-named"],
        (link, s),
        &ep0,
        slow_unmount,
    );
    let (r, l) = in_thread(move || life.join().unwrap());
    let e = r.unwrap_err();
    let said = format!("{e:#}");
    assert!(
        [
            "the model closed the connection",
            "--relay wants NAME=HOST:PORT"
        ]
        .contains(&said.as_str()),
        "{said}"
    );
    assert_eq!(exit_code(&e), 1);
    assert_eq!(tree(&t.0), before);
    assert_eq!(l, ["I: gadget bound"], "nothing was taken back twice");
    // The other failure is in by now: nothing more is undone.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(unmounts_of(&t.0.join("ffs")), 1);
    assert_eq!(tree(&t.0), before);
}
