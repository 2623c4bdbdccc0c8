//! [`CtlEnv`]: what control requests may touch besides the device, and
//! the creation of capture files inside the capture directory only.

use serde_json::Value;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

/// What control requests may touch besides the device: the socket
/// addresses for `describe` and the directory captures are written in.
pub struct CtlEnv {
    pub about: Value,
    capture: Option<(PathBuf, OwnedFd)>,
    /// The origin of the `at_us` time stamp of `counters` replies.
    pub(super) started: Instant,
}

impl CtlEnv {
    /// Open the capture directory once; `pcap start` files go there only.
    pub fn new(
        about: Value,
        capture_dir: Option<PathBuf>,
    ) -> Result<CtlEnv, (String, std::io::Error)> {
        let capture = match capture_dir {
            None => None,
            Some(d) => {
                let c = CString::new(d.as_os_str().as_bytes())
                    .map_err(|e| (d.display().to_string(), std::io::Error::other(e)))?;
                // SAFETY: c is a valid NUL-terminated path; the descriptor
                // returned is owned by the OwnedFd below.
                let fd = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err((d.display().to_string(), std::io::Error::last_os_error()));
                }
                // SAFETY: fd is a fresh descriptor nobody else owns.
                Some((d, unsafe { OwnedFd::from_raw_fd(fd) }))
            }
        };
        Ok(CtlEnv {
            about,
            capture,
            started: Instant::now(),
        })
    }

    /// An environment without a capture directory (tests).
    pub fn bare(about: Value) -> CtlEnv {
        CtlEnv {
            about,
            capture: None,
            started: Instant::now(),
        }
    }

    /// Create a new capture file: a plain name (or a path naming a file
    /// directly inside the capture directory), opened with O_CREAT|O_EXCL|
    /// O_NOFOLLOW, so nothing outside the directory is written and no
    /// existing file or link is followed or truncated.
    pub(super) fn create_capture(&self, p: &Path) -> Result<(File, PathBuf), String> {
        let Some((dir, fd)) = &self.capture else {
            return Err("pcap start needs the emulator started with --capture-dir".into());
        };
        let rel = if p.is_absolute() {
            p.strip_prefix(dir).map_err(|_| {
                format!(
                    "{} is not inside the capture directory {}",
                    p.display(),
                    dir.display()
                )
            })?
        } else {
            p
        };
        let mut parts = rel.components();
        let name = match (parts.next(), parts.next()) {
            (Some(Component::Normal(n)), None) => n,
            _ => {
                return Err(format!(
                    "{} must name a file directly inside the capture directory {}",
                    p.display(),
                    dir.display()
                ))
            }
        };
        let c = CString::new(name.as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: fd is the open capture directory, c a valid file name.
        let f = unsafe {
            libc::openat(
                fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if f < 0 {
            return Err(format!(
                "{}: {}",
                p.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: f is a fresh descriptor nobody else owns.
        Ok((unsafe { File::from_raw_fd(f) }, dir.join(name)))
    }
}
