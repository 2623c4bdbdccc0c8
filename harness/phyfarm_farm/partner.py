"""The link partner: the far end of the adapter's wire, where iperf3's
server runs and the pings are answered.

On the emulated path the partner is the host's own network stack in a
network namespace of its own (HostPartner): ax88772-emu runs in that
namespace and its wire is a tap there (`--wire tap:`), which holds the
partner's address and nothing else. What the partner says (iperf3's
receiver record for DUT->partner, its replies) then comes from the trusted
side: a guest kernel can make its own tools say anything, not the host's.
Run as root, the namespace is a named one (`ip netns`) and the partner's
programs run as nobody; run as any other user, it is a network namespace
inside a user namespace of that user (`unshare -Urn`, entered with
`nsenter`), which lives as long as the check and needs no privilege
(PHYFARM_PARTNER_NS=netns|user chooses). Elsewhere (a forwarded adapter,
the gadget path, QEMU's usb-net, no user namespaces) the partner is a
virtio NIC of the guest moved into a namespace of the guest
(GuestPartner), and the environment records that it was."""

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


#: How the host-side partner's namespace is made: "netns" (a named network
#: namespace, root only) or "user" (a network namespace in a user namespace
#: of the running user, no privilege needed).
NS_METHODS = ("netns", "user")
_userns_probe: list[str | None] = []


def namespace_method() -> str:
    """PHYFARM_PARTNER_NS, else "netns" as root and "user" otherwise."""
    given = os.environ.get("PHYFARM_PARTNER_NS", "")
    if given:
        if given not in NS_METHODS:
            raise SetupError(f"PHYFARM_PARTNER_NS={given!r}: expected netns or user")
        return given
    return "netns" if os.geteuid() == 0 else "user"


def _userns_unavailable() -> str | None:
    """Why this user cannot make a network namespace of its own (probed
    once: `unshare -Urn true`)."""
    if not _userns_probe:
        try:
            r = subprocess.run(
                ["unshare", "-Urn", "true"], capture_output=True, text=True, timeout=20
            )
            why = None if r.returncode == 0 else r.stderr.strip() or f"exit {r.returncode}"
        except (OSError, subprocess.SubprocessError) as e:
            why = str(e)
        _userns_probe.append(None if why is None else f"unshare -Urn: {why}")
    return _userns_probe[0]


def host_partner_unavailable() -> str | None:
    """Why the host-side partner cannot run here, or None when it can."""
    if namespace_method() == "netns" and os.geteuid() != 0:
        return "PHYFARM_PARTNER_NS=netns: not root (named namespaces need CAP_SYS_ADMIN)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun"
    if not os.access(IP, os.X_OK):
        return f"no {IP} (iproute2)"
    if namespace_method() == "user":
        return _userns_unavailable()
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


def _namespaces_of(pid: int | str) -> tuple[str, str]:
    return tuple(os.readlink(f"/proc/{pid}/ns/{k}") for k in ("user", "net"))  # type: ignore[return-value]


class HostPartner:
    """A network namespace of the host with the emulator's tap at PARTNER_IP."""

    where = "host"

    def __init__(self, logdir: Path, method: str | None = None) -> None:
        global _count
        _count += 1
        self.method = method or namespace_method()
        self.ns = f"{NS_PREFIX}{os.getpid()}-{_count}"
        self.logdir = logdir
        self.procs: list[Proc] = []
        self.created = False
        #: The process whose user and network namespaces the partner is
        #: ("user" method): they end with it.
        self.holder: Proc | None = None

    def _ip(self, *args: str, netns: bool = True) -> None:
        if self.method == "user":
            argv = self.wrap([IP, *args])
        else:
            argv = [IP, *(["-n", self.ns] if netns else []), *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise SetupError(f"host partner: {' '.join(argv)}: {r.stderr.strip()}")

    def _hold(self) -> None:
        """A user namespace of this user with a network namespace in it,
        held by a process that does nothing and dies with the harness."""
        self.holder = Proc(
            "netns", ["unshare", "-Urn", "sleep", "infinity"], self.logdir / "partner-netns.log"
        )
        own = _namespaces_of("self")
        end = time.monotonic() + 10
        # Until unshare has run, the holder is in this process's namespaces:
        # nothing may enter it before it has left them.
        while True:
            with contextlib.suppress(OSError):
                theirs = _namespaces_of(self.holder.pid)
                if theirs[0] != own[0] and theirs[1] != own[1]:
                    break
            if not self.holder.alive() or time.monotonic() > end:
                self.holder.stop()
                raise SetupError(f"host partner: unshare -Urn: {self.holder.tail(5)}")
            time.sleep(0.02)
        self.ns = f"user:{self.holder.pid}"

    def create(self) -> None:
        """The namespace, its loopback and the tap (down until configure())."""
        if self.method == "user":
            self._hold()
        else:
            self._ip("netns", "add", self.ns, netns=False)
            _live.add(self.ns)
        self.created = True
        # No IPv6 (router and neighbour solicitations would share the wire
        # with what the checks count), set before the tap exists; unprivileged
        # ICMP sockets for the pings of the partner's user (nobody, or this
        # user's own, root inside its namespace). In this namespace only.
        group = "65534 65534" if self.method == "netns" else "0 0"
        sysctls = [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            f"net.ipv4.ping_group_range={group}",
        ]
        r = self.run(["sysctl", "-qw", *sysctls], timeout=10)
        if r.exit != 0:
            raise SetupError(f"host partner: sysctl in {self.ns}: {r.describe()}")
        self._ip("link", "set", "lo", "up")
        self._ip("tuntap", "add", "dev", TAP, "mode", "tap")

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the partner's namespace."""
        if self.method == "user":
            assert self.holder is not None, "the partner's namespace is not made yet"
            target = f"--target={self.holder.pid}"
            return ["nsenter", target, "--user", "--net", "--preserve-credentials", *argv]
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
        """A long-running partner program, stopped with the partner: as
        nobody when the harness is root; else as this (unprivileged) user,
        the only one its user namespace maps."""
        drop = NOBODY if self.method == "netns" else []
        p = Proc(name, self.wrap([*drop, *argv]), self.logdir / f"partner-{name}.log")
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
        if self.created and self.holder is not None:
            self.holder.stop()
        elif self.created:
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
