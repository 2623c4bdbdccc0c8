//! Transfers from QEMU: control requests on endpoint 0 (with injected MDIO
//! faults), the bulk IN and OUT queues (their depths, completions), cancels.

use usbredir::{BulkPacket, ControlPacket, Message, SmallDataPacket, Status};

use super::{Device, OutHead, BULK_IN_MAX, OUT_WAIT_BYTES_HIGH, OUT_WAIT_HIGH, OUT_WAIT_MAX};
use crate::descriptors::{EP_BULK_IN, EP_BULK_OUT, EP_INTERRUPT};
use crate::ep0::Ep0;
use crate::mac::{cmd, Effects, Reply, Setup};
use crate::nic::RxData;
use crate::pending::Refused;
use crate::{log_i, log_t, log_w};

impl Device {
    /// Outstanding bulk IN requests.
    pub fn pending_bulk_in(&self) -> usize {
        self.bulk_in.len()
    }

    /// Bulk OUT transfers not yet completed (waiting or on their way).
    pub fn pending_bulk_out(&self) -> usize {
        self.out_wait.len() + usize::from(self.out_head.is_some()) + self.out_done.len()
    }

    /// Bytes of bulk OUT data held: waiting transfers and the one being
    /// parsed.
    pub fn held_out_bytes(&self) -> usize {
        self.out_wait_bytes + self.out_head.as_ref().map_or(0, |h| h.data.len())
    }

    /// Frames queued towards the wire.
    pub fn tx_queued(&self) -> usize {
        self.nic.tx_queued()
    }

    /// Whether the device takes more packets from QEMU now; the event loop
    /// stops reading while it does not.
    pub fn usb_room(&self) -> bool {
        self.out_waiting() < OUT_WAIT_HIGH && self.held_out_bytes() < OUT_WAIT_BYTES_HIGH
    }

    /// Bulk OUTs not yet wholly parsed (waiting, and the one being parsed).
    fn out_waiting(&self) -> usize {
        self.out_wait.len() + usize::from(self.out_head.is_some())
    }

    pub(super) fn cancel(&mut self, id: u64) {
        if self.bulk_in.cancel(id) {
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_IN));
        } else if self.out_head.as_ref().is_some_and(|h| h.id == id) {
            // Frames already queued from it still leave; the rest of its
            // data never reaches the chip.
            self.out_head = None;
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_OUT));
        } else if let Some(data) = self.out_wait.remove(id) {
            self.out_wait_bytes -= data.len();
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_OUT));
        } else if self.out_done.cancel(id) {
            self.stats.counters.bulk_cancelled += 1;
            self.send(id, cancelled(EP_BULK_OUT));
        } else {
            log_t!("usb: cancel of unknown id {id:#x} (already completed)");
        }
    }

    pub(super) fn control(&mut self, id: u64, cp: ControlPacket) {
        self.stats.counters.control_requests += 1;
        let mdio = match (cp.requesttype, cp.request) {
            (0xc0, cmd::READ_MII_REG) => Some(false),
            (0x40, cmd::WRITE_MII_REG) => Some(true),
            _ => None,
        };
        if let Some(write) = mdio {
            if cp.index <= 31 && self.mdio_faults.fires(write, cp.index as u8) {
                self.stats.counters.mdio_faults_injected += 1;
                self.stats.counters.control_stalls += 1;
                log_i!(
                    "mdio: injected {} fault on register {:#04x}",
                    if write { "write" } else { "read" },
                    cp.index
                );
                let m = ControlPacket {
                    data: Vec::new(),
                    length: 0,
                    status: Status::STALL,
                    ..cp
                };
                self.send(id, Message::ControlPacket(m));
                return;
            }
        }
        let s = Setup {
            requesttype: cp.requesttype,
            request: cp.request,
            value: cp.value,
            index: cp.index,
            length: cp.length,
        };
        let mut effects = Effects::default();
        let halted_before = self.usb.halted;
        let reply = Ep0 {
            variant: self.cfg.variant,
            serial: &self.serial,
            usb: &mut self.usb,
            mac: &mut self.nic.mac,
            phy: &mut self.nic.phy,
            effects: &mut effects,
        }
        .handle(&s, &cp.data);
        self.nic.apply(effects);
        let base = ControlPacket {
            data: Vec::new(),
            length: 0,
            status: Status::SUCCESS,
            ..cp
        };
        let reply = match reply {
            Reply::Data(d) => ControlPacket {
                length: d.len() as u16,
                data: d,
                ..base
            },
            Reply::Done(n) => ControlPacket { length: n, ..base },
            Reply::Stall => {
                self.stats.counters.control_stalls += 1;
                ControlPacket {
                    status: Status::STALL,
                    ..base
                }
            }
        };
        self.send(id, Message::ControlPacket(reply));
        self.halts_changed(halted_before);
    }

    /// Endpoints halted or cleared since `before` (a `UsbState::halted`):
    /// transfers already waiting on a newly halted endpoint end with STALL,
    /// in order, as the chip would answer their next token; a halted
    /// interrupt endpoint says so once and reports nothing more until
    /// cleared, then reports the link again.
    pub(super) fn halts_changed(&mut self, before: u32) {
        let bit = |ep| 1u32 << usbredir::ep_index(ep);
        let now = self.usb.halted;
        let set = now & !before;
        if set & bit(EP_BULK_IN) != 0 {
            for (id, _) in self.bulk_in.drain() {
                self.stats.counters.halted_stalls += 1;
                self.send(id, stall(EP_BULK_IN));
            }
        }
        if set & bit(EP_BULK_OUT) != 0 {
            // Transfers the chip took in already complete; those still
            // waiting for room were never accepted.
            for (id, _) in self.out_wait.drain() {
                self.stats.counters.halted_stalls += 1;
                self.send(id, stall(EP_BULK_OUT));
            }
            self.out_wait_bytes = 0;
        }
        if set & bit(EP_INTERRUPT) != 0 && self.int_receiving {
            self.stats.counters.halted_stalls += 1;
            let m = SmallDataPacket {
                endpoint: EP_INTERRUPT,
                status: Status::STALL,
                ..Default::default()
            };
            let id = self.int_id;
            self.int_id += 1;
            self.send(id, Message::InterruptPacket(m));
        }
        if before & !now & bit(EP_INTERRUPT) != 0 {
            self.reported_link = None;
        }
    }

    pub(super) fn bulk(&mut self, id: u64, bp: BulkPacket, configured: bool) {
        let ok_ep = bp.endpoint == EP_BULK_IN || bp.endpoint == EP_BULK_OUT;
        if !configured || !ok_ep {
            log_w!(
                "usb: bulk_packet ep {:#04x} len {} refused (configuration {})",
                bp.endpoint,
                bp.length,
                self.usb.configuration
            );
            let m = BulkPacket {
                endpoint: bp.endpoint,
                status: Status::STALL,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
            return;
        }
        if self.usb.is_halted(bp.endpoint) {
            log_t!(
                "usb: bulk_packet ep {:#04x} id {id:#x}: endpoint halted, STALL",
                bp.endpoint
            );
            self.stats.counters.halted_stalls += 1;
            self.send(id, stall(bp.endpoint));
            return;
        }
        let pushed = if bp.endpoint == EP_BULK_IN {
            self.bulk_in.push(id, bp.length)
        } else {
            let n = bp.data.len();
            let elsewhere =
                self.out_done.contains(id) || self.out_head.as_ref().is_some_and(|h| h.id == id);
            let r = if elsewhere {
                Err(Refused::DuplicateId)
            } else if self.out_waiting() >= OUT_WAIT_MAX {
                Err(Refused::Full)
            } else {
                self.out_wait.push(id, bp.data)
            };
            if r.is_ok() {
                self.out_wait_bytes += n;
            }
            r
        };
        if let Err(why) = pushed {
            self.stats.counters.bulk_refused += 1;
            let status = match why {
                Refused::Full => {
                    log_w!(
                        "usb: bulk_packet ep {:#04x} id {id:#x} refused: {} transfers already pending",
                        bp.endpoint,
                        if bp.endpoint == EP_BULK_IN { BULK_IN_MAX } else { OUT_WAIT_MAX }
                    );
                    Status::IOERROR
                }
                Refused::DuplicateId => {
                    log_w!(
                        "usb: bulk_packet ep {:#04x} id {id:#x} refused: that id is already pending",
                        bp.endpoint
                    );
                    Status::INVAL
                }
            };
            let m = BulkPacket {
                endpoint: bp.endpoint,
                status,
                ..Default::default()
            };
            self.send(id, Message::BulkPacket(m));
            return;
        }
        if bp.endpoint == EP_BULK_OUT {
            self.admit_outs();
        }
    }

    /// Take waiting bulk OUTs in, frame by frame while the TX queue has
    /// room; each completes once its last frame has left. Returns whether
    /// anything was taken.
    pub(super) fn admit_outs(&mut self) -> bool {
        let mut any = false;
        loop {
            if self.out_head.is_none() {
                if self.out_done.is_full() {
                    break;
                }
                let Some((id, data)) = self.out_wait.pop_front() else {
                    break;
                };
                self.out_wait_bytes -= data.len();
                self.stats.counters.bulk_out_transfers += 1;
                let ready = self.nic.now();
                self.out_head = Some(OutHead {
                    id,
                    data,
                    pos: 0,
                    ready,
                });
            }
            let Some(h) = &mut self.out_head else { break };
            let (n, ready) = self.nic.bulk_out_some(&h.data[h.pos..], &mut self.stats);
            h.pos += n;
            h.ready = h.ready.max(ready);
            any |= n > 0;
            if h.pos < h.data.len() {
                break;
            }
            if let Some(h) = self.out_head.take() {
                let pushed = self.out_done.push(h.id, (h.data.len() as u32, h.ready));
                debug_assert!(pushed.is_ok(), "ids are unique across the OUT queues");
            }
            any = true;
        }
        any
    }

    /// Answer bulk IN requests, oldest first, while frames are ready.
    pub(super) fn fill_bulk_in(&mut self) {
        while let Some((id, &len)) = self.bulk_in.front() {
            let Some(rx) = self.nic.take_rx(len, &mut self.stats) else {
                break;
            };
            self.bulk_in.pop_front();
            let m = match rx {
                RxData::Records(data) => {
                    self.stats.counters.bulk_in_transfers += 1;
                    BulkPacket {
                        endpoint: EP_BULK_IN,
                        length: data.len() as u32,
                        data,
                        ..Default::default()
                    }
                }
                RxData::Babble => BulkPacket {
                    endpoint: EP_BULK_IN,
                    status: Status::BABBLE,
                    ..Default::default()
                },
            };
            self.send(id, Message::BulkPacket(m));
        }
    }
}

fn stall(endpoint: u8) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint,
        status: Status::STALL,
        ..Default::default()
    })
}

pub(super) fn cancelled(endpoint: u8) -> Message {
    Message::BulkPacket(BulkPacket {
        endpoint,
        status: Status::CANCELLED,
        ..Default::default()
    })
}
