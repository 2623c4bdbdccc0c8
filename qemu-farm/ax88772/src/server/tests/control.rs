//! Tests of the control socket: its clients' events, long and refused
//! requests, hang-ups, its privacy and the uid check.

use super::*;
use crate::ctl;
use crate::server::control::peer_uid;

/// A server with a control socket and one client accepted on it.
fn ctl_rig(name: &str) -> (Server, UnixStream, TmpDir) {
    let dir = TmpDir::new(name);
    let path = dir.join("ctl.sock");
    let mut s = server(mock_wire(), UsbRole::Connected, Some(path.clone()));
    let c = UnixStream::connect(&path).unwrap();
    for _ in 0..1000 {
        s.step().unwrap();
        if !s.ctl_clients.is_empty() {
            break;
        }
    }
    assert_eq!(s.ctl_clients.len(), 1, "the client was accepted");
    (s, c, dir)
}

/// Send `req` and run the loop until a whole reply line is back.
fn exchange(s: &mut Server, c: &mut UnixStream, req: &[u8]) -> String {
    c.set_nonblocking(false).unwrap();
    c.write_all(req).unwrap();
    c.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..10_000 {
        s.step().unwrap();
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got.contains(&b'\n') {
            return String::from_utf8(got).unwrap();
        }
    }
    panic!("no reply to the request");
}

/// `{"cmd":"ping"}` padded with spaces to `len` bytes, then a newline.
fn ping_of_length(len: usize) -> Vec<u8> {
    let mut line = br#"{"cmd":"ping"}"#.to_vec();
    line.resize(len, b' ');
    line.push(b'\n');
    line
}

#[test]
fn control_clients_are_not_read_at_eof_or_with_replies_piling_up() {
    let (a, _b) = UnixStream::pair().unwrap();
    let mut c = CtlClient {
        s: a,
        inbuf: Vec::new(),
        out: Vec::new(),
        discarding: false,
        eof: false,
        closed: false,
    };
    assert_eq!(c.events(), libc::POLLIN);
    c.out = b"{}\n".to_vec();
    assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
    c.eof = true;
    assert_eq!(c.events(), libc::POLLOUT, "nothing more to read at eof");
    c.eof = false;
    c.out = vec![b' '; CTL_OUT_HIGH];
    assert_eq!(c.events(), libc::POLLOUT, "replies pile up: read no more");
    c.out.clear();
    c.inbuf = b"{}\n".to_vec();
    assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
}

#[test]
fn a_request_of_exactly_the_longest_length_is_answered() {
    let (mut s, mut c, _dir) = ctl_rig("maxline");
    let reply = exchange(&mut s, &mut c, &ping_of_length(ctl::MAX_LINE));
    assert!(reply.contains(r#""ok":true"#), "{reply}");
    let reply = exchange(&mut s, &mut c, &ping_of_length(ctl::MAX_LINE + 1));
    assert!(reply.contains("request longer than"), "{reply}");
    // The client is still served.
    let reply = exchange(&mut s, &mut c, &ping_of_length(20));
    assert!(reply.contains(r#""ok":true"#), "{reply}");
}

#[test]
fn a_client_that_hangs_up_before_its_reply_is_let_go() {
    let (mut s, mut c, dir) = ctl_rig("hangup");
    c.write_all(b"{\"cmd\":\"ping\"}\n").unwrap();
    drop(c);
    // Its reply cannot be written (EPIPE): the client is dropped.
    for _ in 0..100 {
        s.step().unwrap();
        if s.ctl_clients.is_empty() {
            break;
        }
    }
    assert!(s.ctl_clients.is_empty());
    // And the loop serves others.
    let path = dir.join("ctl.sock");
    let mut c2 = UnixStream::connect(&path).unwrap();
    let reply = exchange(&mut s, &mut c2, b"{\"cmd\":\"ping\"}\n");
    assert!(reply.contains(r#""ok":true"#), "{reply}");
}

#[test]
fn peer_credentials_name_our_uid() {
    let (a, _b) = UnixStream::pair().unwrap();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(peer_uid(&a), Some(unsafe { libc::geteuid() }));
}

#[test]
fn the_second_control_client_is_answered_on_its_own_events() {
    let (mut s, _first, dir) = ctl_rig("two");
    let mut second = UnixStream::connect(dir.join("ctl.sock")).unwrap();
    for _ in 0..100 {
        s.step().unwrap();
        if s.ctl_clients.len() == 2 {
            break;
        }
    }
    assert_eq!(s.ctl_clients.len(), 2);
    let reply = exchange(&mut s, &mut second, b"{\"cmd\":\"ping\"}\n");
    assert!(reply.contains(r#""ok":true"#), "{reply}");
}

#[test]
fn a_client_a_few_replies_behind_is_still_read() {
    let (a, _b) = UnixStream::pair().unwrap();
    let c = CtlClient {
        s: a,
        inbuf: Vec::new(),
        out: vec![b' '; 64 * 1024],
        discarding: false,
        eof: false,
        closed: false,
    };
    assert_eq!(c.events(), libc::POLLIN | libc::POLLOUT);
}

fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn the_control_socket_is_private_and_so_is_its_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TmpDir::new("private");
    // A missing directory is made, 0700; the socket is 0600.
    let p = dir.join("made/ctl.sock");
    let l = bind_ctl(&p).unwrap();
    assert_eq!(mode(&dir.join("made")), 0o700);
    assert_eq!(mode(&p), 0o600);
    drop(l);
    // A directory others may enter is refused, and named.
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = bind_ctl(&open.join("ctl.sock")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("mode 755"), "{e}");
    // So is a parent that is not a directory, whatever its mode.
    let file = dir.join("file");
    std::fs::write(&file, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = bind_ctl(&file.join("ctl.sock")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("not a directory"), "{e}");
}

#[test]
fn a_stale_control_socket_is_replaced_and_a_live_one_is_not() {
    let dir = TmpDir::new("stale");
    let p = dir.join("ctl.sock");
    // A socket whose emulator is gone (the file stays behind).
    drop(UnixListener::bind(&p).unwrap());
    let s = server(mock_wire(), UsbRole::Connected, Some(p.clone()));
    UnixStream::connect(&p).expect("the new socket listens");
    // A second emulator on the same path leaves the first alone.
    match Server::new(
        device(),
        mock_wire(),
        UsbRole::Connected,
        OnDisconnect::Exit,
        Some(p.clone()),
    ) {
        Err(ServerError::Bind { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::AddrInUse, "{source}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a live control socket was replaced"),
    }
    UnixStream::connect(&p).expect("the first emulator still listens");
    drop(s);
    assert!(!p.exists(), "the socket is removed with its server");
}

/// A connection to `path` from a child process running as uid and gid
/// 65534: the child's exit status is 0 when the server hung up on it,
/// 1 when it was kept (no hang-up within 10 s), above when it could not
/// connect at all.
fn connect_as_nobody(s: &mut Server, path: &std::path::Path) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    // Everything the child needs is made before the fork: it makes
    // system calls only.
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *b as libc::c_char;
    }
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    // SAFETY: the child makes raw system calls only (no allocation, no
    // locks) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls on values made before the fork.
        unsafe {
            let nobody = 65534 as libc::c_long;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) != 0
                || libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) != 0
            {
                libc::_exit(3);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(4);
            }
            if libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) != 0
            {
                libc::_exit(5);
            }
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            let mut b = 0u8;
            let r = libc::read(fd, (&mut b as *mut u8).cast(), 1);
            libc::_exit(if r == 0 { 0 } else { 1 });
        }
    }
    let mut status = 0;
    for _ in 0..400 {
        s.step().unwrap();
        // SAFETY: waitpid on our own child, status valid for writes.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            assert!(libc::WIFEXITED(status), "child status {status:#x}");
            return libc::WEXITSTATUS(status);
        }
    }
    // SAFETY: as above; the child is ours.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    panic!("the child connecting as uid 65534 did not finish");
}

#[test]
fn a_control_client_of_another_uid_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let (a, _b) = UnixStream::pair().unwrap();
    assert_eq!(peer_uid(&a), Some(me), "a socket pair's peer is us");
    if me != 0 {
        // Only root can connect as another uid; the check above is all
        // that runs without it.
        eprintln!("not root: a connection from another uid cannot be made here");
        return;
    }
    let dir = TmpDir::new("otheruid");
    let path = dir.join("ctl.sock");
    let mut s = server(mock_wire(), UsbRole::Connected, Some(path.clone()));
    // bind_ctl made both private; open them so that uid 65534 reaches
    // the uid check behind them.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        connect_as_nobody(&mut s, &path),
        0,
        "the server hung up on uid 65534"
    );
    assert!(s.ctl_clients.is_empty());
    // Our own connections are still served.
    let mut c = UnixStream::connect(&path).unwrap();
    let reply = exchange(&mut s, &mut c, b"{\"cmd\":\"ping\"}\n");
    assert!(reply.contains(r#""ok":true"#), "{reply}");
}
