//! QEMU's usbredir connection and the wire as the event loop drives
//! them: connecting, opening and closing the connection, reading and
//! decoding packets for the device, encoding and writing what it produced,
//! and passing frames between the device and the wire.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use usbredir::{Codec, Role};

use super::{OnDisconnect, Server, ServerError, UsbRole, HELLO_VERSION, USB_OUT_HIGH};
use crate::device::OUR_CAPS;
use crate::net::Conn;
use crate::{log_e, log_i, log_t, log_w};

impl Server {
    pub(super) fn open_transport(&mut self, c: Conn, now: Instant) {
        if let Err(e) = c.set_nonblocking() {
            log_w!("usb: set_nonblocking: {e}");
        }
        self.conn = Some(c);
        self.ever_connected = true;
        self.codec = Codec::new(Role::Host, OUR_CAPS);
        self.dev.transport_opened(now);
        self.usb_out.clear();
        if let Err(e) = self.codec.encode_hello(HELLO_VERSION, &mut self.usb_out) {
            log_e!("usb: hello: {e}");
        }
        log_i!("usb: connected; hello sent (caps {:#x})", OUR_CAPS.0);
    }

    pub(super) fn close_transport(&mut self, why: &str, now: Instant) {
        if self.conn.take().is_none() {
            return;
        }
        log_i!("usb: connection closed ({why})");
        self.dev.transport_closed(now);
        self.usb_out.clear();
        match self.on_disconnect {
            OnDisconnect::Exit => self.finished = true,
            OnDisconnect::Wait => {
                self.next_connect = now + Duration::from_millis(200);
                log_i!("usb: waiting for QEMU again");
            }
        }
    }

    pub(super) fn try_connect(&mut self, now: Instant) -> Result<(), ServerError> {
        let UsbRole::Connect(a) = &self.role else {
            return Ok(());
        };
        if self.conn.is_some() || now < self.next_connect {
            return Ok(());
        }
        match Conn::connect(a) {
            Ok(c) => self.open_transport(c, now),
            Err(e) => {
                if !self.ever_connected && now.duration_since(self.started) > self.connect_timeout {
                    return Err(ServerError::ConnectTimeout {
                        addr: a.to_string(),
                        timeout: self.connect_timeout,
                    });
                }
                log_t!("usb: connect {a}: {e}");
                self.next_connect = now + Duration::from_millis(200);
            }
        }
        Ok(())
    }

    /// Whether the loop reads from QEMU: its output is below the
    /// high-water mark and the device has room for more transfers.
    pub(super) fn takes_usb_input(&self) -> bool {
        self.usb_out.len() < USB_OUT_HIGH && self.dev.usb_room()
    }

    /// Bytes waiting to be written to QEMU.
    pub fn usb_backlog(&self) -> usize {
        self.usb_out.len()
    }

    pub(super) fn read_usb(&mut self) {
        let mut buf = [0u8; 65536];
        for _ in 0..16 {
            if !self.takes_usb_input() {
                return;
            }
            let Some(c) = &mut self.conn else { return };
            match c.read(&mut buf) {
                Ok(0) => return self.close_transport("end of stream", self.now()),
                Ok(n) => {
                    self.codec.feed(&buf[..n]);
                    self.decode();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.close_transport(&e.to_string(), self.now()),
            }
        }
    }

    /// Hand every complete packet to the device, each at its own time.
    pub(super) fn decode(&mut self) {
        while self.conn.is_some() && self.takes_usb_input() {
            let Some(r) = self.codec.next_packet() else {
                break;
            };
            let now = self.now();
            match r {
                Ok(p) => self.dev.handle(now, p),
                Err(e) => {
                    self.dev.usbredir_error();
                    log_w!("usbredir: {e}");
                    if e.is_fatal() {
                        self.close_transport("protocol error", now);
                        return;
                    }
                }
            }
            self.flush_device(now);
        }
    }

    pub(super) fn read_wire(&mut self) {
        for _ in 0..256 {
            if !self.dev.partner_may_send() {
                break;
            }
            match self.wire.recv() {
                Ok(Some(f)) => {
                    let now = self.now();
                    self.dev.wire_frame(now, f);
                }
                Ok(None) => break,
                Err(e) => {
                    log_w!("wire: {e}");
                    break;
                }
            }
        }
    }

    /// Encode what the device produced and push frames to the wire.
    pub(super) fn flush_device(&mut self, now: Instant) {
        for p in self.dev.take_usb() {
            if self.conn.is_none() {
                continue;
            }
            log_t!("usb: -> {} id {:#x}", p.msg.name(), p.id);
            if let Err(e) = self.codec.encode(&p, &mut self.usb_out) {
                log_e!("usb: cannot encode {}: {e}", p.msg.name());
            }
        }
        for f in self.dev.take_wire() {
            self.wire.send(&f);
        }
        self.write_usb(now);
    }

    pub(super) fn write_usb(&mut self, now: Instant) {
        let mut done = 0;
        let mut failure = None;
        if let Some(c) = &mut self.conn {
            while done < self.usb_out.len() {
                match c.write(&self.usb_out[done..]) {
                    Ok(0) => {
                        failure = Some("write returned 0".to_string());
                        break;
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        self.usb_out.drain(..done.min(self.usb_out.len()));
        if let Some(why) = failure {
            self.close_transport(&why, now);
        }
    }
}
