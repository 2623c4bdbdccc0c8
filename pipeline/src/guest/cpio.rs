//! A minimal writer for the cpio "newc" format the kernel unpacks as an
//! initramfs. Written in-process so guest images are reproducible byte for
//! byte and need no cpio binary.

use std::io::{self, Write};

/// One entry of the archive.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
    CharDev {
        path: String,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

fn pad4(w: &mut impl Write, len: usize) -> io::Result<()> {
    let pad = (4 - len % 4) % 4;
    w.write_all(&[0u8; 3][..pad])
}

#[allow(clippy::too_many_arguments)]
fn header(
    w: &mut impl Write,
    ino: u32,
    mode: u32,
    nlink: u32,
    size: usize,
    rdev: (u32, u32),
    name: &str,
) -> io::Result<()> {
    let namesize = name.len() + 1;
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        u32::try_from(size).map_err(|_| io::Error::other("cpio entry over 4 GiB"))?,
        0,
        0,
        rdev.0,
        rdev.1,
        namesize as u32,
        0,
    ];
    let mut h = String::from("070701");
    for f in fields {
        h.push_str(&format!("{f:08x}"));
    }
    w.write_all(h.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    pad4(w, 110 + namesize)
}

/// Write `entries` as a newc archive (with its trailer) to `w`.
pub fn write(w: &mut impl Write, entries: &[Entry]) -> io::Result<()> {
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match e {
            Entry::Dir { path, mode } => header(w, ino, 0o040000 | mode, 2, 0, (0, 0), path)?,
            Entry::File { path, mode, data } => {
                header(w, ino, 0o100000 | mode, 1, data.len(), (0, 0), path)?;
                w.write_all(data)?;
                pad4(w, data.len())?;
            }
            Entry::Symlink { path, target } => {
                header(w, ino, 0o120777, 1, target.len(), (0, 0), path)?;
                w.write_all(target.as_bytes())?;
                pad4(w, target.len())?;
            }
            Entry::CharDev {
                path,
                mode,
                major,
                minor,
            } => header(w, ino, 0o020000 | mode, 1, 0, (*major, *minor), path)?,
        }
    }
    header(w, 0, 0, 1, 0, (0, 0), "TRAILER!!!")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parse a newc archive back into (name, mode, data) triples.
    fn parse(mut b: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut off = 0usize;
        loop {
            assert_eq!(&b[..6], b"070701", "bad magic at {off}");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16)
                    .unwrap() as usize
            };
            let (mode, size, namesize) = (field(1), field(6), field(11));
            let name = std::str::from_utf8(&b[110..110 + namesize - 1])
                .unwrap()
                .to_string();
            let hdr = (110 + namesize).div_ceil(4) * 4;
            let data = b[hdr..hdr + size].to_vec();
            let total = hdr + size.div_ceil(4) * 4;
            b = &b[total..];
            off += total;
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return out;
            }
            out.push((name, mode as u32, data));
        }
    }

    #[test]
    fn round_trip_all_kinds() {
        let entries = [
            Entry::Dir {
                path: "bin".into(),
                mode: 0o755,
            },
            Entry::File {
                path: "init".into(),
                mode: 0o755,
                data: b"#!/bin/sh\n".to_vec(),
            },
            Entry::File {
                path: "odd".into(),
                mode: 0o644,
                data: vec![1, 2, 3, 4, 5],
            },
            Entry::Symlink {
                path: "bin/sh".into(),
                target: "busybox".into(),
            },
            Entry::CharDev {
                path: "dev/console".into(),
                mode: 0o600,
                major: 5,
                minor: 1,
            },
        ];
        let mut buf = Vec::new();
        write(&mut buf, &entries).unwrap();
        assert_eq!(buf.len() % 4, 0);
        let got = parse(&buf);
        assert_eq!(got.len(), 5);
        assert_eq!(
            got[1],
            ("init".to_string(), 0o100755, b"#!/bin/sh\n".to_vec())
        );
        assert_eq!(got[2].2, vec![1, 2, 3, 4, 5]);
        assert_eq!(
            got[3],
            ("bin/sh".to_string(), 0o120777, b"busybox".to_vec())
        );
        assert_eq!(got[4].1, 0o020600);
    }
}
