"""The exporter guest of the forwarded-gadget path.

A second QEMU guest, booted from the farm initramfs with a kernel that has
dummy_hcd, configfs gadgets and FunctionFS (`make exporter-kernel`). Its
init (qemu-farm/guest/farm-init.sh, phyfarm.role=exporter) turns the
emulator into a USB gadget with `ax88772-gadget` (the model's usbredir
stream reaches it on the virtio-serial port org.phyfarm.model), lets its own
USB host stack enumerate it, and exports it with Debian's `usbredirect --as
127.0.0.1:4000`. ax88772-gadget relays that to the port org.phyfarm.usbredir,
a unix socket on the host: the farm guest's QEMU connects there as it would
to usbredirect serving a physical adapter on a runner. No network: a
user-mode network costs the exporter most of its CPU under TCG.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .errors import HarnessError
from .guest import devices, machine, machine_argv
from .procs import Proc

READY = "phyfarm-exporter: ready"
#: Console lines that mean the exporter side broke, and what to call it.
FAILURES = [
    (re.compile(r"phyfarm-exporter: failed: (.*)"), "the exporter guest failed to set up"),
    (re.compile(r"phyfarm-exporter: usbredirect exited(.*)"), "usbredirect exited"),
    (re.compile(r"ax88772-gadget: E: (.*)"), "ax88772-gadget failed"),
    (re.compile(r"Kernel panic - not syncing(.*)"), "the exporter kernel panicked"),
]


class ExporterFailed(HarnessError):
    """The exporter side (its guest, ax88772-gadget or usbredirect) failed."""


def exporter_argv(
    kernel: Path, initrd: Path, accel: str, console: Path, model_sock: Path, redir_sock: Path
) -> list[str]:
    # phyfarm's kernel command line for this machine, as every guest has
    # it (`phyfarm guest machine`), then the exporter's role for the init.
    append = f"{machine(accel)['kernel_args']} phyfarm.role=exporter"
    return [
        *machine_argv(kernel, initrd, accel, 256, append, console),
        *devices(accel, "exporter", model_sock=model_sock, redir_sock=redir_sock),
    ]


class Exporter:
    def __init__(
        self, kernel: Path, initrd: Path, accel: str, logdir: Path, model_sock: Path
    ) -> None:
        self.console = logdir / "exporter-console.log"
        self.logdir = logdir
        #: Where the farm guest's QEMU connects its usb-redir chardev.
        self.usb_sock = model_sock.parent / "usbredir.sock"
        self.argv = exporter_argv(kernel, initrd, accel, self.console, model_sock, self.usb_sock)
        self.proc: Proc | None = None
        self.ready_seconds: float | None = None

    def start(self, timeout: float) -> None:
        (self.logdir / "exporter-qemu.cmd").write_text(" ".join(self.argv) + "\n")
        t0 = time.monotonic()
        self.proc = Proc("qemu-exporter", self.argv, self.logdir / "exporter-qemu.log")
        while True:
            text = self.console_text()
            if READY in text:
                self.ready_seconds = time.monotonic() - t0
                return
            why = self.failure()
            if why is not None:
                raise ExporterFailed(why)
            if time.monotonic() - t0 > timeout:
                raise ExporterFailed(
                    f"the exporter guest was not ready within {timeout:.0f}s "
                    f"(console: {self.console}):\n{self.tail()}"
                )
            time.sleep(0.05)

    def console_text(self) -> str:
        try:
            return self.console.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.console_text().splitlines()[-n:])

    def failure(self) -> str | None:
        """Why the exporter side is broken, naming that side, or None."""
        text = self.console_text()
        for rx, what in FAILURES:
            m = rx.search(text)
            if m:
                return (
                    f"exporter: {what}{': ' + m.group(1).strip() if m.group(1).strip() else ''} "
                    f"(console: {self.console}):\n{self.tail()}"
                )
        if self.proc is not None and not self.proc.alive():
            return (
                f"exporter: its QEMU exited with {self.proc.returncode()}: {self.proc.tail(5)} "
                f"(console: {self.console}):\n{self.tail()}"
            )
        return None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace=1.0)
