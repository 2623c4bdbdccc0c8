//! Reading files that untrusted input controls without following links.
//!
//! A pull request controls its series files, and the build it triggers
//! controls everything it writes into its build tree. phyfarm runs as root
//! on the runner, so a symbolic link there (`bzImage -> /root/.pgpass`)
//! would make phyfarm read, copy or publish a runner file. Every such file
//! is opened here: each path component is opened with `O_NOFOLLOW` relative
//! to the tree's root (so a linked directory is refused too), `..` and
//! absolute paths are refused, and the final file must be a regular file.
//! A refusal names the path; it never quotes any content.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    #[error("{}: is a symbolic link; phyfarm follows no links from a pull request or a build tree", path.display())]
    Symlink { path: PathBuf },
    #[error("{}: is {kind}, not a regular file", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{}: leaves its tree ({reason})", path.display())]
    Outside { path: PathBuf, reason: &'static str },
    #[error("{}: larger than {limit} bytes; refusing to read it", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl SafeFsError {
    fn io(path: &Path, source: std::io::Error) -> SafeFsError {
        SafeFsError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A link, or something else where a file was expected: the input's
    /// fault, not the runner's.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, SafeFsError::Io { .. })
    }
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

fn cstr(path: &Path, name: &std::ffi::OsStr) -> Result<CString, SafeFsError> {
    CString::new(name.as_bytes()).map_err(|_| SafeFsError::Outside {
        path: path.to_path_buf(),
        reason: "a NUL byte in its name",
    })
}

fn openat(dir: Option<&OwnedFd>, name: &CString, flags: i32) -> std::io::Result<OwnedFd> {
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: name is NUL-terminated; on success the descriptor is ours.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: fd was just returned by openat and nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Explain a failed `O_NOFOLLOW` open of `full`: a link (or a non-directory
/// where a directory was needed) becomes a refusal naming it.
fn explain(full: &Path, e: std::io::Error) -> SafeFsError {
    if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
        if let Ok(m) = std::fs::symlink_metadata(full) {
            let ft = m.file_type();
            if ft.is_symlink() {
                return SafeFsError::Symlink {
                    path: full.to_path_buf(),
                };
            }
            return SafeFsError::NotRegular {
                path: full.to_path_buf(),
                kind: kind_of(ft),
            };
        }
        return SafeFsError::Symlink {
            path: full.to_path_buf(),
        };
    }
    SafeFsError::io(full, e)
}

fn check_regular(f: &File, path: &Path) -> Result<(), SafeFsError> {
    let m = f.metadata().map_err(|e| SafeFsError::io(path, e))?;
    if !m.file_type().is_file() {
        return Err(SafeFsError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(m.file_type()),
        });
    }
    Ok(())
}

/// Open `root/rel` for reading: `rel` is relative, without `..`, and no
/// component of it (nor `root`'s last component) may be a link.
pub fn open_in(root: &Path, rel: &Path) -> Result<File, SafeFsError> {
    let full = root.join(rel);
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(SafeFsError::Outside {
                    path: full,
                    reason: "`..` in the path",
                })
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(SafeFsError::Outside {
                    path: full,
                    reason: "an absolute path",
                })
            }
        }
    }
    let Some((last, dirs)) = names.split_last() else {
        return Err(SafeFsError::NotRegular {
            path: full,
            kind: "a directory",
        });
    };
    let root_c = cstr(root, root.as_os_str())?;
    let mut dir = openat(
        None,
        &root_c,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    )
    .map_err(|e| explain(root, e))?;
    let mut walked = root.to_path_buf();
    for d in dirs {
        walked.push(d);
        dir = openat(
            Some(&dir),
            &cstr(&walked, d)?,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .map_err(|e| explain(&walked, e))?;
    }
    let fd = openat(
        Some(&dir),
        &cstr(&full, last)?,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
    )
    .map_err(|e| explain(&full, e))?;
    let f = File::from(fd);
    check_regular(&f, &full)?;
    Ok(f)
}

/// Open one file without following a link at its last component (the
/// caller has checked the directory it is in).
pub fn open_file(path: &Path) -> Result<File, SafeFsError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| explain(path, e))?;
    check_regular(&f, path)?;
    Ok(f)
}

/// Read at most `limit` bytes of `root/rel` (see [`open_in`]).
pub fn read_in(root: &Path, rel: &Path, limit: u64) -> Result<Vec<u8>, SafeFsError> {
    let f = open_in(root, rel)?;
    read_limited(f, &root.join(rel), limit)
}

fn read_limited(f: File, path: &Path, limit: u64) -> Result<Vec<u8>, SafeFsError> {
    let mut buf = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| SafeFsError::io(path, e))?;
    if buf.len() as u64 > limit {
        return Err(SafeFsError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(buf)
}

/// Whether `path` itself (not what it points to) is a symbolic link.
pub fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Copy the regular file `root/rel` to `dest` (see [`open_in`]). `dest` is
/// replaced, never written through: a link there is removed first.
pub fn copy_out(root: &Path, rel: &Path, dest: &Path) -> Result<u64, SafeFsError> {
    let mut from = open_in(root, rel)?;
    let tmp = dest.with_extension("phyfarm-tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| SafeFsError::io(&tmp, e))?;
    let n = std::io::copy(&mut from, &mut to).map_err(|e| SafeFsError::io(&tmp, e))?;
    drop(to);
    std::fs::rename(&tmp, dest).map_err(|e| SafeFsError::io(dest, e))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("build");
        std::fs::create_dir_all(root.join("arch/x86/boot")).unwrap();
        std::fs::write(root.join("arch/x86/boot/bzImage"), b"kernel").unwrap();
        std::fs::write(d.path().join("secret"), b"runner password").unwrap();
        (d, root)
    }

    #[test]
    fn a_regular_file_is_copied() {
        let (d, root) = tree();
        let dest = d.path().join("out-bzImage");
        assert_eq!(
            copy_out(&root, Path::new("arch/x86/boot/bzImage"), &dest).unwrap(),
            6
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"kernel");
    }

    #[test]
    fn a_linked_file_is_refused_and_named() {
        let (d, root) = tree();
        let f = root.join("arch/x86/boot/bzImage");
        std::fs::remove_file(&f).unwrap();
        symlink(d.path().join("secret"), &f).unwrap();
        let dest = d.path().join("out");
        let e = copy_out(&root, Path::new("arch/x86/boot/bzImage"), &dest).unwrap_err();
        assert!(matches!(e, SafeFsError::Symlink { .. }), "{e}");
        assert!(e.to_string().contains("arch/x86/boot/bzImage"), "{e}");
        assert!(e.is_refusal());
        assert!(!dest.exists());
    }

    #[test]
    fn a_linked_directory_is_refused() {
        let (d, root) = tree();
        std::fs::create_dir_all(d.path().join("elsewhere/boot")).unwrap();
        std::fs::write(d.path().join("elsewhere/boot/bzImage"), b"x").unwrap();
        std::fs::remove_dir_all(root.join("arch/x86")).unwrap();
        symlink(d.path().join("elsewhere"), root.join("arch/x86")).unwrap();
        let e = open_in(&root, Path::new("arch/x86/boot/bzImage")).unwrap_err();
        assert!(matches!(e, SafeFsError::Symlink { .. }), "{e}");
        assert!(e.to_string().contains("arch/x86:"), "{e}");
    }

    #[test]
    fn dotdot_absolute_and_non_files_are_refused() {
        let (_d, root) = tree();
        for rel in ["../secret", "/etc/passwd"] {
            let e = open_in(&root, Path::new(rel)).unwrap_err();
            assert!(matches!(e, SafeFsError::Outside { .. }), "{rel}: {e}");
        }
        let e = open_in(&root, Path::new("arch/x86")).unwrap_err();
        assert!(matches!(e, SafeFsError::NotRegular { .. }), "{e}");
    }

    #[test]
    fn a_link_at_the_destination_is_replaced_not_followed() {
        let (d, root) = tree();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let dest = d.path().join("dest");
        symlink(&victim, &dest).unwrap();
        copy_out(&root, Path::new("arch/x86/boot/bzImage"), &dest).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!is_symlink(&dest));
    }

    #[test]
    fn single_files_are_opened_without_following() {
        let (d, _root) = tree();
        let l = d.path().join("link.patch");
        symlink(d.path().join("secret"), &l).unwrap();
        let e = open_file(&l).unwrap_err();
        assert!(matches!(e, SafeFsError::Symlink { .. }), "{e}");
        assert!(!e.to_string().contains("runner password"));
        assert!(open_file(&d.path().join("secret")).is_ok());
        let e = read_in(d.path(), Path::new("secret"), 3).unwrap_err();
        assert!(matches!(e, SafeFsError::TooLarge { .. }), "{e}");
    }
}
