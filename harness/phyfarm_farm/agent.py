"""Host side of phyfarm-agent: JSON lines over QEMU's virtio-serial chardev socket."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import AgentError, GuestTimeout

#: Extra time the host waits for a reply beyond the command's own timeout.
SLACK = 10.0

#: Longest line the host accepts from the guest agent. The agent caps a
#: command's output (the checks ask at most 8 MiB per stream); a longer line
#: is a misbehaving guest, and the connection is dropped rather than
#: buffered without limit.
MAX_LINE = 64 * 1024 * 1024


@dataclass
class CmdResult:
    argv: list[str]
    exit: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    raw: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit == 0

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv)}  -> exit {self.exit} in {self.seconds:.2f}s"
            f"{' (timed out)' if self.timed_out else ''}\n"
            f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"
        )


class Pending:
    def __init__(self, request: dict) -> None:
        self.request = request
        self.event = threading.Event()
        self.reply: dict | None = None
        self.sent = time.monotonic()
        self.answered: float | None = None


class Agent:
    """Client of one guest's agent. `dead()` tells why the guest is gone, if it is."""

    def __init__(self, sock_path: Path, dead: Callable[[], str | None]) -> None:
        self.sock_path = sock_path
        self.dead = dead
        self.sock: socket.socket | None = None
        self.hello: dict | None = None
        self.ready_at: float | None = None
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._pending: dict[int, Pending] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        #: Why the host dropped the connection, if it did.
        self.broken: str | None = None

    def connect(self, deadline: float) -> None:
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(self.sock_path))
                self.sock = s
                break
            except OSError:
                s.close()
            why = self.dead()
            if why:
                raise AgentError(f"cannot reach the guest agent: {why}")
            if time.monotonic() > deadline:
                raise GuestTimeout(f"QEMU never opened the agent socket {self.sock_path}")
            time.sleep(0.02)
        threading.Thread(target=self._reader, daemon=True, name="agent-reader").start()

    def _reader(self) -> None:
        buf = b""
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            too_long = False
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if len(line) > MAX_LINE:
                    too_long = True
                    break
                self._dispatch(line)
            if too_long or len(buf) > MAX_LINE:
                self.broken = (
                    f"the guest agent sent a line longer than {MAX_LINE} bytes; "
                    "the host dropped the connection"
                )
                self.close()
                break
        self._closed.set()
        with self._lock:
            for p in self._pending.values():
                p.event.set()

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if msg.get("ready"):
            self.hello = msg
            self.ready_at = time.monotonic()
            self._ready.set()
            return
        with self._lock:
            p = self._pending.pop(msg.get("id"), None)
        if p is not None:
            p.reply = msg
            p.answered = time.monotonic()
            p.event.set()

    def wait_ready(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            why = self.dead()
            if why:
                raise AgentError(f"the guest went away before its agent was ready: {why}")
            if self._closed.is_set():
                raise AgentError("the agent socket closed before the agent was ready")
            if time.monotonic() > end:
                raise GuestTimeout(
                    f"the guest agent was not ready within {timeout:.0f}s (--guest-timeout)"
                )
        assert self.hello is not None
        return self.hello

    def submit(self, request: dict) -> Pending:
        rid = next(self._ids)
        request = {"id": rid, **request}
        p = Pending(request)
        with self._lock:
            self._pending[rid] = p
        line = (json.dumps(request) + "\n").encode()
        try:
            with self._wlock:
                assert self.sock is not None
                self.sock.sendall(line)
        except OSError as e:
            raise AgentError(f"cannot send to the guest agent: {e}; {self.dead() or ''}") from e
        p.sent = time.monotonic()
        return p

    def result(self, p: Pending, timeout: float) -> dict:
        end = p.sent + timeout + SLACK
        while not p.event.wait(0.05):
            if self.dead():
                break
            if time.monotonic() > end:
                raise GuestTimeout(
                    f"the guest agent did not answer {describe(p.request)} within "
                    f"{timeout + SLACK:.0f}s (--guest-timeout {timeout:.0f}s + {SLACK:.0f}s)"
                )
        if p.reply is None:
            why = self.broken or self.dead() or "agent connection closed"
            raise AgentError(f"no reply to {describe(p.request)}: {why}")
        if "error" in p.reply:
            raise AgentError(f"the agent rejected {describe(p.request)}: {p.reply['error']}")
        return p.reply

    def run(
        self, argv: list[str], timeout: float = 30, stdin: str | None = None, max_output=None
    ) -> CmdResult:
        req: dict = {"argv": argv, "timeout": timeout}
        if stdin is not None:
            req["stdin"] = stdin
        if max_output is not None:
            req["max_output"] = max_output
        r = self.result(self.submit(req), timeout)
        return CmdResult(
            argv=argv,
            exit=r["exit"],
            stdout=r.get("stdout", ""),
            stderr=r.get("stderr", ""),
            seconds=r.get("seconds", 0.0),
            timed_out=r.get("timed_out", False),
            raw=r,
        )

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass


def describe(request: dict) -> str:
    if "argv" in request:
        return "`" + " ".join(request["argv"])[:200] + "`"
    return json.dumps(request)[:200]
