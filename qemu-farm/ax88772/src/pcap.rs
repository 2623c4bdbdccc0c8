//! Classic pcap capture of the wire (LINKTYPE_ETHERNET).
//!
//! Records are stamped on the event loop and written by a thread of their
//! own through a bounded queue, so a slow or stuck file (a full disk, a
//! FIFO nobody reads) never blocks the device: records that find the
//! queue full are counted as dropped instead.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Records waiting for the writer thread.
pub const QUEUE: usize = 4096;
/// The longest snapshot length: every frame whole.
pub const SNAPLEN_MAX: u32 = 65535;
/// How long stopping a capture waits for the writer to finish.
const FINISH_WAIT: Duration = Duration::from_secs(2);

pub struct Pcap {
    path: PathBuf,
    tx: Option<SyncSender<Vec<u8>>>,
    done: Receiver<io::Result<u64>>,
    /// Records handed to the writer.
    pub frames: u64,
    /// Records dropped because the writer fell behind.
    pub dropped: u64,
    /// Bytes kept of each frame (the pcap header's snaplen).
    snaplen: u32,
}

fn header(snaplen: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(24);
    h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&4u16.to_le_bytes());
    h.extend_from_slice(&0i32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&snaplen.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h
}

fn writer(file: File, rx: Receiver<Vec<u8>>, snaplen: u32) -> io::Result<u64> {
    let mut out = BufWriter::new(file);
    out.write_all(&header(snaplen))?;
    let mut n = 0;
    while let Ok(rec) = rx.recv() {
        out.write_all(&rec)?;
        n += 1;
    }
    out.flush()?;
    Ok(n)
}

impl Pcap {
    pub fn create(path: &Path) -> io::Result<Pcap> {
        Pcap::new(File::create(path)?, path, SNAPLEN_MAX)
    }

    /// Write a capture to an already opened file (`path` names it),
    /// keeping the first `snaplen` bytes of each frame (1..=[`SNAPLEN_MAX`]).
    pub fn new(file: File, path: &Path, snaplen: u32) -> io::Result<Pcap> {
        let snaplen = snaplen.clamp(1, SNAPLEN_MAX);
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("pcap".into())
            .spawn(move || {
                let _ = done_tx.send(writer(file, rx, snaplen));
            })?;
        Ok(Pcap {
            path: path.to_path_buf(),
            tx: Some(tx),
            done,
            frames: 0,
            dropped: 0,
            snaplen,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue one frame. Never blocks; an error means the writer stopped
    /// (the file could not be written).
    pub fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let kept = &frame[..frame.len().min(self.snaplen as usize)];
        let mut rec = Vec::with_capacity(16 + kept.len());
        rec.extend_from_slice(&(t.as_secs() as u32).to_le_bytes());
        rec.extend_from_slice(&t.subsec_micros().to_le_bytes());
        rec.extend_from_slice(&(kept.len() as u32).to_le_bytes());
        rec.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        rec.extend_from_slice(kept);
        let Some(tx) = &self.tx else {
            return Err(io::Error::other("capture finished"));
        };
        match tx.try_send(rec) {
            Ok(()) => {
                self.frames += 1;
                Ok(())
            }
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err(match self.done.try_recv() {
                Ok(Err(e)) => e,
                _ => io::Error::other("the capture writer stopped"),
            }),
        }
    }

    /// Stop; returns the number of records written. Waits at most two
    /// seconds for the writer (a stuck file is left to it).
    pub fn finish(self) -> io::Result<u64> {
        self.finish_within(FINISH_WAIT)
    }

    fn finish_within(mut self, wait: Duration) -> io::Result<u64> {
        self.tx = None;
        match self.done.recv_timeout(wait) {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: the capture writer is stuck", self.path.display()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ax-pcap-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_header_and_records() {
        let dir = dir("ok");
        let path = dir.join("t.pcap");
        let mut p = Pcap::create(&path).unwrap();
        p.write(&[1, 2, 3]).unwrap();
        assert_eq!(p.finish().unwrap(), 1);
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(&b[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&b[16..20], &[0xff, 0xff, 0, 0], "every frame whole");
        assert_eq!(&b[20..24], &[1, 0, 0, 0]);
        assert_eq!(&b[32..36], &[3, 0, 0, 0]);
        assert_eq!(&b[40..], &[1, 2, 3]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_snapshot_length_keeps_the_head_of_each_frame_and_its_length() {
        let dir = dir("snap");
        let path = dir.join("t.pcap");
        let mut p = Pcap::new(File::create(&path).unwrap(), &path, 4).unwrap();
        p.write(&[1, 2, 3, 4, 5, 6]).unwrap();
        p.write(&[7, 8]).unwrap();
        assert_eq!(p.finish().unwrap(), 2);
        let b = std::fs::read(&path).unwrap();
        assert_eq!(&b[16..20], &[4, 0, 0, 0], "snaplen in the header");
        let (first, second) = (&b[24..24 + 16 + 4], &b[24 + 16 + 4..]);
        assert_eq!(&first[8..16], &[4, 0, 0, 0, 6, 0, 0, 0], "kept 4 of 6");
        assert_eq!(&first[16..], &[1, 2, 3, 4]);
        assert_eq!(&second[8..16], &[2, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&second[16..], &[7, 8]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_is_reported_with_its_cause() {
        let path = Path::new("/dev/full");
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let mut p = Pcap::new(f, path, SNAPLEN_MAX).unwrap();
        // Records are accepted until the writer's buffer reaches the file
        // and the write fails; from then on the caller learns why.
        let mut cause = None;
        let mut stopped = 0;
        for _ in 0..100_000 {
            match p.write(&[0u8; 1514]) {
                // Queued, or dropped while the writer is not keeping up.
                Ok(()) if p.dropped == 0 => {}
                Ok(()) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) if e.raw_os_error().is_some() => {
                    cause = Some(e);
                    break;
                }
                // The writer stopped, and its result is still on the way.
                Err(_) if stopped < 5_000 => {
                    stopped += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("the cause never came: {e}"),
            }
        }
        let e = cause.expect("the write error reached the caller");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    }

    #[test]
    fn a_file_nobody_drains_never_blocks_the_caller() {
        let dir = dir("fifo");
        let fifo = dir.join("f");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Read-write, so opening does not wait for a reader; nobody reads.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        let mut p = Pcap::new(f, &fifo, SNAPLEN_MAX).unwrap();
        for _ in 0..3 * QUEUE {
            p.write(&[0u8; 1514]).unwrap();
        }
        assert!(p.dropped > 0, "the queue filled and records were counted");
        assert_eq!(p.frames + p.dropped, 3 * QUEUE as u64);
        let e = p.finish_within(Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
