//! Linux native AIO (io_setup/io_submit/io_getevents), which FunctionFS
//! endpoint files support, for the few calls `bulk_out` makes.

use std::io;
use std::os::fd::RawFd;

const IOCB_CMD_PREAD: u16 = 0;

/// `struct iocb` (include/uapi/linux/aio_abi.h), little-endian layout.
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: u32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Event {
    pub data: u64,
    obj: u64,
    pub res: i64,
    res2: i64,
}

/// One read with its own buffer; both stay put while it is queued.
pub struct Read {
    iocb: Box<Iocb>,
    pub buf: Box<[u8]>,
}

impl Read {
    pub fn new(fd: RawFd, data: u64, len: usize) -> Read {
        let mut buf = vec![0u8; len].into_boxed_slice();
        let iocb = Box::new(Iocb {
            data,
            opcode: IOCB_CMD_PREAD,
            fildes: fd as u32,
            buf: buf.as_mut_ptr() as u64,
            nbytes: len as u64,
            ..Default::default()
        });
        Read { iocb, buf }
    }
}

pub struct Ctx(libc::c_ulong);

pub(super) fn check(r: libc::c_long) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

impl Ctx {
    pub fn new(n: u32) -> io::Result<Ctx> {
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes the context id into `ctx`.
        check(unsafe { libc::syscall(libc::SYS_io_setup, n as libc::c_long, &mut ctx) })?;
        Ok(Ctx(ctx))
    }

    /// Queue `r`; it must not be queued already.
    pub fn submit(&self, r: &mut Read) -> io::Result<()> {
        let mut p: *mut Iocb = &mut *r.iocb;
        loop {
            // SAFETY: one valid iocb whose buffer outlives the request
            // (the Read is kept by the caller until its event is taken).
            let rc =
                unsafe { libc::syscall(libc::SYS_io_submit, self.0, 1 as libc::c_long, &mut p) };
            match check(rc) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait for at least one completion; how many landed in `events`.
    pub fn wait(&self, events: &mut [Event]) -> io::Result<usize> {
        // SAFETY: `events` has room for events.len() io_events.
        check(unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                self.0,
                1 as libc::c_long,
                events.len() as libc::c_long,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            )
        })
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: destroys the context this value owns.
        unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
    }
}
