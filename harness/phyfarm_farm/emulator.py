"""ax88772-emu as a child process, and its JSON-line control socket."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from .errors import EmulatorDied, GuestTimeout, HarnessError, SetupError
from .partner import TAP
from .procs import Proc

#: Autonegotiation as the farm's emulated PHY takes it unless a check or
#: `--emulator-arg` says otherwise: 1.5 s plus a draw in [0, 1.5 s] from the
#: emulator's seed, so 1.5-3 s as a 100BASE-TX PHY against a real partner
#: (802.3's link_fail_inhibit and the base pages). The link is down
#: meanwhile, after a cable event and after every BMCR.ANRESTART, which is
#: where a driver that reads the status during autonegotiation goes wrong.
REALISTIC_AUTONEG = ("--autoneg-ms", "1500", "--autoneg-jitter-ms", "1500")


def with_realistic_autoneg(extra: list[str]) -> list[str]:
    """`extra` after the farm's autonegotiation timing, unless `extra` sets
    the timing itself (`--autoneg-ms 0` gives the instant model)."""
    named = {a.split("=", 1)[0] for a in extra}
    if named & {"--autoneg-ms", "--autoneg-jitter-ms"}:
        return list(extra)
    return [*REALISTIC_AUTONEG, *extra]


class Emulator:
    """One emulated AX88772A: usbredir on `usb_sock`; the wire on dgram
    sockets to the guest's partner NIC or, with a `partner` (HostPartner),
    the tap of the host-side partner's namespace, which the emulator then
    runs in."""

    def __init__(
        self, binary: Path, sockdir: Path, logdir: Path, extra: list[str], partner=None
    ) -> None:
        self.binary = binary
        self.usb_sock = sockdir / "usb.sock"
        self.emu_wire = sockdir / "emu.sock"
        self.partner_wire = sockdir / "partner.sock"
        self.ctl_path = sockdir / "ctl.sock"
        self.ready_file = sockdir / "emu-ready.json"
        self.log = logdir / "emulator.log"
        self.partner = partner
        wire = (
            f"tap:{TAP}"
            if partner is not None
            else f"dgram:unix:{self.emu_wire},unix:{self.partner_wire}"
        )
        #: The emulator's own arguments (what a reproducer repeats); it is
        #: started inside the partner's namespace when there is one.
        self.argv = [
            str(binary),
            "--listen",
            f"unix:{self.usb_sock}",
            "--wire",
            wire,
            "--ctl",
            str(self.ctl_path),
            "--capture-dir",
            str(logdir),
            "--ready-file",
            str(self.ready_file),
            "--on-disconnect",
            "exit",
            *with_realistic_autoneg(extra),
        ]
        self.proc: Proc | None = None
        self._sock: socket.socket | None = None
        self._rfile = None
        self._lock = threading.Lock()

    def start(self, timeout: float) -> None:
        if not self.binary.is_file():
            raise SetupError(f"no emulator binary {self.binary}: cargo build -p ax88772 --release")
        (self.log.parent).mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as f:
            f.write("# " + " ".join(self.argv) + "\n")
        argv = self.partner.wrap(self.argv) if self.partner is not None else self.argv
        self.proc = Proc("ax88772-emu", argv, self.log)
        end = time.monotonic() + timeout
        while not self.ready_file.exists():
            if not self.proc.alive():
                raise SetupError(
                    f"ax88772-emu exited with {self.proc.returncode()} before it was ready:\n"
                    + self.proc.tail()
                )
            if time.monotonic() > end:
                raise GuestTimeout(f"ax88772-emu was not ready within {timeout:.0f}s")
            time.sleep(0.01)

    def dead(self) -> str | None:
        if self.proc is not None and not self.proc.alive():
            return f"ax88772-emu exited with {self.proc.returncode()}: {self.proc.tail(5)}"
        return None

    def ctl(self, cmd: str, **args) -> dict:
        """One control request; an emulator that is gone or refuses is a harness ERROR."""
        req = json.dumps({"cmd": cmd, **args}) + "\n"
        with self._lock:
            try:
                if self._sock is None:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(10)
                    s.connect(str(self.ctl_path))
                    self._sock = s
                    self._rfile = s.makefile("rb")
                self._sock.sendall(req.encode())
                line = self._rfile.readline()
            except OSError as e:
                self._drop()
                raise EmulatorDied(
                    f"control socket {cmd}: {e}; {self.dead() or 'emulator alive'}"
                ) from e
            if not line:
                self._drop()
                raise EmulatorDied(f"control socket closed on {cmd}: {self.dead() or ''}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise HarnessError(f"emulator refused {req.strip()}: {reply.get('error')}")
        return reply

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None

    def link(self, up: bool) -> dict:
        return self.ctl("link", up=up)

    def phy(self) -> dict:
        return self.ctl("phy")

    def counters(self, reset: bool = False) -> dict:
        return self.ctl("counters", reset=reset) if reset else self.ctl("counters")

    def describe(self) -> dict:
        return self.ctl("describe")

    def stop(self) -> int | None:
        self._drop()
        if self.proc is not None:
            return self.proc.stop()
        return None
