//! The wire as a tap interface: the link partner is then a kernel's own
//! network stack, outside the guest (phyfarm's host-side partner, a network
//! namespace holding the tap, an address, an iperf3 server and nothing
//! else). The interface must already exist in the emulator's network
//! namespace; it is attached, never created, so a wrong name cannot put a
//! guest's frames into a namespace nobody configured.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};

use super::Wire;
use crate::framing::MAX_FRAME;
use crate::log_w;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

pub struct TapWire {
    file: File,
    name: String,
    warned: bool,
    pub dropped: u64,
}

impl TapWire {
    pub fn attach(name: &str) -> io::Result<TapWire> {
        // Asked of this process's network namespace itself (a /sys mounted
        // for another namespace would answer for that one).
        let cname = std::ffi::CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "tap: NUL in the name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        if unsafe { libc::if_nametoindex(cname.as_ptr()) } == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("tap:{name}: no such interface in this network namespace"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("tap:{name}: /dev/net/tun: {e}")))?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        // The spec's parser allows 1 to 15 bytes: the name stays NUL-ended.
        let n = name.len().min(libc::IFNAMSIZ - 1);
        req.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        // SAFETY: `req` is a valid ifreq for the duration of the call and
        // TUNSETIFF reads and writes only within it.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("tap:{name}: TUNSETIFF: {e} (is it a tap this user may attach to?)"),
            ));
        }
        Ok(TapWire {
            file,
            name: name.to_string(),
            warned: false,
            dropped: 0,
        })
    }
}

impl Wire for TapWire {
    fn fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn recv(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; MAX_FRAME + 64];
        match self.file.read(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            // The interface is down (EIO): nothing to read yet.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn send(&mut self, frame: &[u8]) {
        // A tap takes every frame it is given (the kernel queues or drops it
        // itself, as a NIC's ring would); only a down interface refuses.
        // One write is one frame: a tap never takes part of one.
        match self.file.write(frame) {
            Ok(n) if n == frame.len() => self.warned = false,
            Ok(n) => {
                self.dropped += 1;
                log_w!(
                    "wire: tap:{} took {n} of a {}-byte frame",
                    self.name,
                    frame.len()
                );
            }
            Err(e) => {
                self.dropped += 1;
                if !self.warned {
                    log_w!(
                        "wire: tap:{} send failed ({e}); frames are dropped",
                        self.name
                    );
                    self.warned = true;
                }
            }
        }
    }

    fn describe(&self) -> String {
        format!("tap:{}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_is_named_and_never_created() {
        let e = TapWire::attach("pfnosuch0")
            .err()
            .expect("no such interface");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("tap:pfnosuch0"), "{e}");
        assert!(!std::path::Path::new("/sys/class/net/pfnosuch0").exists());
    }

    #[test]
    fn an_interface_that_is_not_a_tap_is_refused() {
        // Loopback exists in every network namespace and is no tap.
        let e = TapWire::attach("lo").err().expect("lo is not a tap");
        assert!(e.to_string().contains("tap:lo"), "{e}");
    }
}
