//! Classic pcap capture of the wire (LINKTYPE_ETHERNET).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Pcap {
    path: PathBuf,
    out: BufWriter<File>,
    pub frames: u64,
}

impl Pcap {
    pub fn create(path: &Path) -> io::Result<Pcap> {
        Pcap::new(File::create(path)?, path)
    }

    /// Write a capture to an already opened file (`path` names it).
    pub fn new(file: File, path: &Path) -> io::Result<Pcap> {
        let mut out = BufWriter::new(file);
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        out.write_all(&h)?;
        Ok(Pcap {
            path: path.to_path_buf(),
            out,
            frames: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(t.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&t.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)?;
        self.frames += 1;
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<u64> {
        self.out.flush()?;
        Ok(self.frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_header_and_records() {
        let dir = std::env::temp_dir().join(format!("ax-pcap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcap");
        let mut p = Pcap::create(&path).unwrap();
        p.write(&[1, 2, 3]).unwrap();
        assert_eq!(p.finish().unwrap(), 1);
        let b = std::fs::read(&path).unwrap();
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(&b[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&b[20..24], &[1, 0, 0, 0]);
        assert_eq!(&b[40..], &[1, 2, 3]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
