"""The link partner: the far end of the adapter's wire, where iperf3's
server runs and the pings are answered.

On the emulated path, run as root, the partner is the host's own network
stack in a network namespace of its own (HostPartner): ax88772-emu runs in
that namespace and its wire is a tap there (`--wire tap:`), which holds the
partner's address and nothing else. What the partner says (iperf3's
receiver record for DUT->partner, its replies) then comes from the trusted
side: a guest kernel can make its own tools say anything, not the host's.
Elsewhere (a forwarded adapter, the gadget path, QEMU's usb-net, no root)
the partner is a virtio NIC of the guest moved into a namespace of the
guest (GuestPartner), and the environment records that it was."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

from .agent import CmdResult
from .errors import HarnessError, SetupError
from .procs import Proc

IP = "/usr/bin/ip"  # iproute2; busybox's sh would run its own `ip` applet
NETNS = "partner"
DUT_IP = "10.77.0.1"
PARTNER_IP = "10.77.0.2"
#: The emulator's wire in the host-side partner's namespace.
TAP = "pfwire0"
#: Host-side partner namespaces: phyfarm-<pid of the pytest process>-<n>.
NS_PREFIX = "phyfarm-"
_NS_NAME = re.compile(r"^phyfarm-(\d+)-\d+$")
#: The programs that answer the guest (iperf3's servers, pings) run as
#: nobody: what a hostile guest sends them reaches no root process but the
#: host kernel's stack and ax88772-emu.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"]
_count = 0
#: Namespaces made and not yet deleted: deleted at exit too, when an
#: interrupt ended the run before a check's clean-up (a SIGKILLed run's are
#: swept by the next one, sweep_stale_namespaces).
_live: set[str] = set()


def _netns_del(name: str) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([IP, "netns", "del", name], capture_output=True, timeout=20)
    _live.discard(name)


def _delete_live() -> None:
    for ns in list(_live):
        _netns_del(ns)


atexit.register(_delete_live)


def host_partner_unavailable() -> str | None:
    """Why the host-side partner cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "not root: network namespaces and taps need CAP_NET_ADMIN"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    if not os.access(IP, os.X_OK):
        return f"no {IP} (iproute2)"
    return None


def sweep_stale_namespaces() -> list[str]:
    """Delete partner namespaces whose pytest process is gone (one killed
    with SIGKILL cannot delete its own); returns their names."""
    gone = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/run/netns"):
            m = _NS_NAME.match(name)
            if m and not Path(f"/proc/{m.group(1)}").exists():
                _netns_del(name)
                gone.append(name)
    return gone


class HostPartner:
    """A network namespace of the host with the emulator's tap at PARTNER_IP."""

    where = "host"

    def __init__(self, logdir: Path) -> None:
        global _count
        _count += 1
        self.ns = f"{NS_PREFIX}{os.getpid()}-{_count}"
        self.logdir = logdir
        self.procs: list[Proc] = []
        self.created = False

    def _ip(self, *args: str, netns: bool = True) -> None:
        argv = [IP, *(["-n", self.ns] if netns else []), *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise SetupError(f"host partner: {' '.join(argv)}: {r.stderr.strip()}")

    def create(self) -> None:
        """The namespace, its loopback and the tap (down until configure())."""
        self._ip("netns", "add", self.ns, netns=False)
        self.created = True
        _live.add(self.ns)
        # No IPv6 (router and neighbour solicitations would share the wire
        # with what the checks count), set before the tap exists; unprivileged
        # ICMP sockets for nobody's pings. Both in this namespace only.
        sysctls = [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.ping_group_range=65534 65534",
        ]
        r = self.run(["sysctl", "-qw", *sysctls], timeout=10)
        if r.exit != 0:
            raise SetupError(f"host partner: sysctl in {self.ns}: {r.describe()}")
        self._ip("link", "set", "lo", "up")
        self._ip("tuntap", "add", "dev", TAP, "mode", "tap")

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the partner's namespace."""
        return [IP, "netns", "exec", self.ns, *argv]

    def configure(self) -> None:
        """The partner's address, and the tap up (after the emulator attached)."""
        self._ip("addr", "add", f"{PARTNER_IP}/24", "dev", TAP)
        self._ip("link", "set", TAP, "up")

    def run(self, argv: list[str], timeout: float = 30) -> CmdResult:
        t = time.monotonic()
        try:
            r = subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            return CmdResult(argv, -1, out, "", time.monotonic() - t, timed_out=True)
        return CmdResult(argv, r.returncode, r.stdout, r.stderr, time.monotonic() - t)

    def start(self, name: str, argv: list[str]) -> Proc:
        """A long-running partner program, as nobody, stopped with the partner."""
        p = Proc(name, self.wrap([*NOBODY, *argv]), self.logdir / f"partner-{name}.log")
        self.procs.append(p)
        return p

    def serve(self, name: str, argv: list[str]) -> None:
        """A server (iperf3 -s) for the rest of the check."""
        p = self.start(name, argv)
        time.sleep(0.05)
        if not p.alive():
            raise HarnessError(f"partner {name} exited at once: {p.tail(5)}")

    def records(self, name: str) -> list[dict]:
        """The JSON documents a partner program `name` printed so far (iperf3
        -s -J prints one per test when it ends), oldest first; a document
        still being written is not one yet."""
        proc = next((p for p in self.procs if p.name == name), None)
        if proc is None:
            return []
        try:
            text = proc.log_path.read_text(errors="replace")
        except OSError:
            return []
        out, i, dec = [], 0, json.JSONDecoder()
        while (j := text.find("{", i)) >= 0:
            try:
                doc, i = dec.raw_decode(text, j)
            except ValueError:
                break
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def submit(self, argv: list[str], timeout: float) -> tuple[Proc, float]:
        name = f"{Path(argv[0]).name}-{len(self.procs)}"
        return self.start(name, ["timeout", str(int(timeout)), *argv]), timeout

    def result(self, pending: tuple[Proc, float], timeout: float) -> dict:
        proc, _ = pending
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=timeout)
        code = proc.stop()
        return {"exit": code, "stdout": proc.log_path.read_text(errors="replace")}

    def destroy(self) -> None:
        for p in self.procs:
            p.stop()
        if self.created:
            _netns_del(self.ns)
            self.created = False


class GuestPartner:
    """The guest's virtio NIC in the guest's namespace `partner`."""

    where = "guest"

    def __init__(self, guest) -> None:
        self.guest = guest

    def wrap(self, argv: list[str]) -> list[str]:
        return [IP, "netns", "exec", NETNS, *argv]

    def run(self, argv: list[str], timeout: float = 30) -> CmdResult:
        return self.guest.run(self.wrap(argv), timeout=timeout)

    def serve(self, name: str, argv: list[str]) -> None:
        """A server (iperf3 -s), as a daemon of the guest."""
        r = self.run([*argv, "-D"], timeout=20)
        if r.exit != 0:
            raise HarnessError(f"partner {argv[0]} did not start: {r.describe()}")

    def submit(self, argv: list[str], timeout: float):
        return self.guest.submit({"argv": self.wrap(argv), "timeout": timeout})

    def result(self, pending, timeout: float) -> dict:
        return self.guest.result(pending, timeout)

    def destroy(self) -> None:
        pass
