"""A guest's serial console, bounded however much the guest prints.

QEMU writes the console into a FIFO (the {console} slot of the machine);
a thread of the harness drains it into the console log the check's
artifacts keep. The log holds the first HEAD_BYTES as they come; past
them only the last TAIL_BYTES are kept, in memory, and appended after a
line saying how much was left out when the guest stops. A kernel that
floods its console (megabytes a second, say while it hangs) then costs
neither the disk nor the time to read its log, and what is kept is what a
developer reads first: the boot and the first reports, and the end.

The thread holds the FIFO open for writing too, so a read never sees an
end of file before QEMU opens it or after QEMU exits; it stops when the
guest is stopped and the FIFO is drained.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

#: The console log keeps this many bytes from the start of the boot ...
HEAD_BYTES = 16 << 20
#: ... and, past them, this many of the most recent.
TAIL_BYTES = 2 << 20
#: Bytes read from the FIFO at a time.
CHUNK = 1 << 16


class Console:
    """The console of one guest: `fifo` for QEMU, `path` for the reader."""

    def __init__(self, path: Path, fifo: Path) -> None:
        self.path = path
        self.fifo = fifo
        self.total = 0
        self._head = 0
        self._tail = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._out = None

    def start(self) -> None:
        """Make the FIFO and start draining it (before QEMU opens it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fifo.unlink(missing_ok=True)
        os.mkfifo(self.fifo, 0o600)
        # O_RDWR: opening does not wait for a writer, and reads never see
        # the end of the file while this reader holds the write side.
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed in stop()
        self._thread = threading.Thread(target=self._drain, name="console", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self._fd is not None
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.2)
            if not ready:
                if self._stop.is_set():
                    return
                continue
            try:
                chunk = os.read(self._fd, CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                return
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        with self._lock:
            self.total += len(chunk)
            room = HEAD_BYTES - self._head
            if room > 0 and self._out is not None:
                self._out.write(chunk[:room])
                self._out.flush()
                self._head += min(room, len(chunk))
                chunk = chunk[room:]
            if chunk:
                self._tail += chunk
                over = len(self._tail) - TAIL_BYTES
                if over > 0:
                    del self._tail[:over]
                    self._dropped += over

    def _rest(self) -> bytes:
        """What follows the log's first HEAD_BYTES (under the lock)."""
        if not self._dropped:
            return bytes(self._tail)
        note = (
            f"\n[phyfarm: the guest printed {self.total} bytes on its console; "
            f"{self._dropped} bytes after the first {self._head} were not kept; "
            f"the last {len(self._tail)} follow]\n"
        )
        return note.encode() + bytes(self._tail)

    def text(self) -> str:
        """The console as kept so far: at most HEAD_BYTES + TAIL_BYTES and a
        line saying what was left out."""
        with self._lock:
            try:
                head = self.path.read_bytes()
            except OSError:
                head = b""
            if self._out is None:  # stopped (or never started): the log is whole
                return head.decode(errors="replace")
            return (head[: self._head] + self._rest()).decode(errors="replace")

    def stop(self) -> None:
        """Drain what QEMU wrote, then write the kept tail to the log (call
        once QEMU is gone). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            if self._out is not None:
                self._out.write(self._rest())
                self._out.close()
                self._out = None
                self._tail = bytearray()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        self.fifo.unlink(missing_ok=True)
