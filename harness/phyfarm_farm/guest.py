"""One QEMU guest booted from the farm initramfs, reached through its agent."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .agent import Agent, CmdResult
from .console import Console
from .errors import AgentError, GuestDied, GuestTimeout, KernelFailure, SetupError
from .procs import Proc

#: Console lines that mean the kernel reported a problem, and what to call it.
SPLATS = [
    (re.compile(r"Kernel panic - not syncing"), "panicked"),
    (re.compile(r"\bBUG: "), "hit a BUG"),
    (re.compile(r"\bOops\b|general protection fault"), "oopsed"),
    (re.compile(r"WARNING: possible (circular|recursive) locking|lockdep"), "reported lockdep"),
    (re.compile(r"refcount_t: "), "reported a refcount error"),
    (re.compile(r"\bWARNING: (CPU: |at )"), "warned"),
    (re.compile(r"UBSAN: |KASAN: "), "reported undefined behaviour"),
    (re.compile(r"rust_kernel: panicked|panicked at "), "hit a Rust panic"),
]


@dataclass
class Splat:
    what: str
    line_no: int
    excerpt: str
    #: The report's own message: for a WARN(cond, fmt, ...), the formatted
    #: line printed between "cut here" and "WARNING:" (else "").
    message: str = ""


def find_splats(text: str) -> list[Splat]:
    """Every kernel problem report in a console log, with ~40 lines of context."""
    lines = text.splitlines()
    out: list[Splat] = []
    skip_until = -1
    for i, line in enumerate(lines):
        if i <= skip_until:
            continue
        for rx, what in SPLATS:
            if rx.search(line):
                start, msg = i, ""
                if i > 0 and "cut here" in lines[i - 1]:
                    start = i - 1
                elif i > 1 and "cut here" in lines[i - 2] and i - 2 > skip_until:
                    start, msg = i - 2, lines[i - 1]
                end = i + 1
                while end < len(lines) and end < i + 60:
                    if "end trace" in lines[end] or "end Kernel panic" in lines[end]:
                        end += 1
                        break
                    end += 1
                excerpt = "\n".join(lines[start:end])
                if "soft lockup" in line:
                    # The looping task's most telling frame, as for a hang.
                    frame = blocked_frame(excerpt)
                    what = f"reported a soft lockup ({frame})" if frame else what
                out.append(Splat(what, i + 1, excerpt, msg))
                skip_until = end - 1
                break
    return out


#: phylib's report of an error a PHY driver returned to its state machine
#: (phy_error_precise: `WARN(1, "%pS: returned: %d\n", func, err)`).
PHYLIB_ERROR = re.compile(r"\] [A-Za-z_][A-Za-z0-9_.]*\+0x[0-9a-f]+/0x[0-9a-f]+: returned: -(\d+)$")


def phylib_error(s: Splat) -> int | None:
    """The errno of phylib's WARN on a PHY driver's error, or None when `s`
    is any other report."""
    m = PHYLIB_ERROR.search(s.message)
    if s.what != "warned" or m is None or " at drivers/net/phy/phy.c:" not in s.excerpt:
        return None
    return int(m.group(1))


#: Words of the frame a hang's evidence names, best first: the PHY drivers,
#: the USB network driver, a PHY driver's callbacks, phylib.
_HANG_FRAMES = ("ax88796b", "asix", "read_status", "phy_")
#: A stack frame as the kernel prints it: ` func+0x1c/0x40` (`? ` unsure),
#: or where the CPU was (`RIP: 0010:func+0x75/0xf3`, a soft lockup's).
_FRAME = re.compile(
    r"^\s*(?:\[[ 0-9.]+\]\s*)?(?:\? |RIP: [0-9a-f]{4}:)?"
    r"([A-Za-z_$][A-Za-z0-9_$.]*)\+0x[0-9a-f]+/0x[0-9a-f]+"
)
#: A task line of sysrq's "Show Blocked State" (and the hung-task report).
_TASK = re.compile(
    r"task:(\S+)\s+state:D|INFO: task (\S+) blocked for more than"
    r"|soft lockup - CPU#\d+ stuck for \d+s! \[(\S+)\]"
)
#: Once a check's guest of one variant stopped answering in a farm run,
#: the other checks of that variant in the same run give each command this
#: long (not --guest-timeout): they still run and record what they see, but
#: a revision whose guests hang does not cost the full limit per check. The
#: farm's retry runs in a folder of its own, where the first hang again gets
#: the full limit.
HUNG_CAP = 15.0
#: Evidence of a hang is cut to this many bytes of kernel log.
HANG_EVIDENCE_BYTES = 8192


def readable_symbol(sym: str) -> str:
    """A Rust v0 symbol (`_RNvXCs..._13ax88796b_rustNtB2_11PhyAX88772A...
    6Driver11read_status`) as a reader wants it: `<ax88796b_rust::PhyAX88772A
    as kernel::net::phy::Driver>::read_status`. The path's identifiers are
    read (each length-prefixed, after a `_`-ended disambiguator or back
    reference); anything else is returned as it is."""
    if not sym.startswith("_R"):
        return sym
    groups: list[list[str]] = []
    i = 0
    while i < len(sym):
        if sym[i] != "_" or i + 1 >= len(sym) or not sym[i + 1].isdigit():
            i += 1
            continue
        i += 1
        chain: list[str] = []
        while i < len(sym) and sym[i].isdigit():
            j = i
            while j < len(sym) and sym[j].isdigit():
                j += 1
            n = int(sym[i:j])
            if n == 0 or j + n > len(sym):
                break
            chain.append(sym[j : j + n])
            i = j + n
        if chain:
            groups.append(chain)
    if not groups:
        return sym
    if len(groups) >= 3 and len(groups[-1]) >= 2:
        impl = "::".join(groups[0] + groups[1])
        trait = "::".join(groups[-1][:-1])
        return f"<{impl} as {trait}>::{groups[-1][-1]}"
    return "::".join(x for g in groups for x in g)


def blocked_frame(log: str) -> str | None:
    """`<task> in <frame>`: the most telling frame of the blocked tasks'
    stacks in a kernel log (sysrq `w`): the first frame that names a PHY or
    USB network driver, else a PHY callback, else phylib; None without one."""
    task = None
    found: dict[int, str] = {}
    for line in log.splitlines():
        t = _TASK.search(line)
        if t:
            task = t.group(1) or t.group(2) or t.group(3)
            continue
        f = _FRAME.match(line)
        if f is None or task is None:
            continue
        for rank, word in enumerate(_HANG_FRAMES):
            if word in f.group(1) and rank not in found:
                found[rank] = f"{task} in {readable_symbol(f.group(1))}"
    return found[min(found)] if found else None


def hang_evidence(agent: Agent | None, console: str = "") -> str:
    """What a kernel developer asks for when a guest stops answering: the
    blocked tasks' stacks (sysrq `w`, through the agent, which answers other
    requests while one is stuck) from the kernel log, its most telling frame
    first. When the agent cannot run it, the console's own reports stand in:
    the hung-task detector's ("INFO: task ... blocked for more than 10
    seconds", with its stack) or a soft lockup's. Bounded: one 5 s request,
    HANG_EVIDENCE_BYTES of log."""
    log, why = "", ""
    if agent is None:
        why = "no agent"
    else:
        # Three snapshots 0.3 s apart: a task that sleeps for each MDIO read
        # (the PHY state machine's worker in a polling loop) is blocked in
        # most of them, running in some.
        script = (
            "if [ -w /proc/sysrq-trigger ]; then for i in 1 2 3; do "
            "echo w > /proc/sysrq-trigger; sleep 0.3; done; "
            "else echo 'no /proc/sysrq-trigger (CONFIG_MAGIC_SYSRQ)'; fi; dmesg"
        )
        try:
            log = agent.run(["sh", "-c", script], timeout=5, max_output=1 << 20).stdout
        except (AgentError, GuestTimeout) as e:
            why = f"the agent could not run sysrq either ({e})"
    at = log.find("Show Blocked State")
    if at < 0:
        # No sysrq report: the kernel's own, from the console (the last one).
        console = console[-(4 << 20) :]
        at = max(console.rfind("INFO: task "), console.rfind("BUG: soft lockup"))
        if at >= 0:
            log = console[console.rfind("\n", 0, at) + 1 :]
            at = 0
    if not log:
        return f"no blocked-task report: {why}"
    report = log[at:] if at >= 0 else log[-HANG_EVIDENCE_BYTES:]
    frame = blocked_frame(report)
    tail = report[:HANG_EVIDENCE_BYTES]
    head = f"blocked in {frame}" if frame else "blocked tasks: none named a driver frame"
    return f"{head}\n{tail}"


@dataclass(frozen=True)
class QemuUser:
    """The user QEMU drops to when the harness runs as root (phyfarm decides
    it: `phyfarm guest machine --json`, "qemu_user")."""

    name: str
    uid: int
    gid: int


def share_with_qemu(sockdir: Path, gid: int, sockets: list[Path]) -> None:
    """Let QEMU, once it has dropped root, reach the sockets it connects or
    sends to after the drop (connect and sendto need write permission on a
    socket): `sockdir` and those sockets get QEMU's group `gid`, nothing else
    (the emulator's control socket stays root's)."""
    os.chown(sockdir, -1, gid)
    os.chmod(sockdir, (os.stat(sockdir).st_mode & 0o7777) | stat.S_IXGRP)
    for p in sockets:
        if p.parent != sockdir:
            continue
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            os.chown(p, -1, gid, follow_symlinks=False)
            os.chmod(p, (st.st_mode & 0o7777) | stat.S_IRGRP | stat.S_IWGRP)


def peer_sockets(cfg: GuestConfig) -> list[Path]:
    """The unix sockets QEMU connects or sends to: usbredir and the remote
    ends of its dgram netdevs."""
    out: list[Path] = []
    if cfg.usb is not None and cfg.usb[0] == "unix":
        out.append(Path(cfg.usb[1]))
    if cfg.wire is not None and not cfg.usb_net:
        out.append(Path(cfg.wire[1]))
    return out


def host_tsc_khz() -> int | None:
    """The host CPU's clock in kHz from /proc/cpuinfo (its TSC rate on a VM or
    a fixed-frequency CPU), or None.

    A TCG guest's TSC ticks at the host's rate, but the guest kernel calibrates
    it against the PIT, which fails on a loaded host; it then keeps time with
    jiffies, losing ticks. `tsc_early_khz=` skips that calibration.
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return round(float(line.split(":", 1)[1]) * 1000)
    except (OSError, ValueError):
        pass
    return None


@dataclass
class GuestConfig:
    kernel: Path
    initrd: Path
    accel: str
    memory_mb: int = 256
    timeout: float = 120.0
    append: str = ""
    #: ("unix", path) for the emulator, ("tcp", host, port) for usbredirect, or None.
    usb: tuple | None = None
    #: (qemu local, emulator) dgram socket paths for the partner NIC, or None.
    wire: tuple[Path, Path] | None = None
    #: QEMU's own usb-net (CDC-ECM) adapter on xHCI, wired to the partner NIC
    #: inside QEMU (`wire` is then unused): the benchmarks' reference.
    usb_net: bool = False
    #: Under TCG, the guest's TSC rate in kHz (`tsc_early_khz=`), or None to
    #: let the guest calibrate it (see host_tsc_khz).
    tsc_khz: int | None = None


def cache_dir() -> Path:
    """phyfarm's cache (PHYFARM_CACHE, else $XDG_CACHE_HOME/phyfarm or
    ~/.cache/phyfarm), as the CLI resolves it."""
    if os.environ.get("PHYFARM_CACHE"):
        return Path(os.environ["PHYFARM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phyfarm"


def phyfarm_binary() -> Path:
    """The phyfarm CLI the harness asks (PHYFARM_BIN, else the workspace's
    debug build, which the plugin builds before any guest starts)."""
    repo = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("PHYFARM_BIN", repo / "target/debug/phyfarm"))


#: The machines this process has, by accelerator (see machine).
_MACHINES: dict[str, dict] = {}


def use_machine(accel: str, description: dict) -> None:
    """Keep the machine `phyfarm guest plan` resolved for every guest of this
    process."""
    _MACHINES[accel] = description


def machine(accel: str) -> dict:
    """The QEMU machine every phyfarm guest is, as phyfarm defines it for
    `phyfarm boot` too (pipeline/src/guest/machine.rs): "argv", the template
    with the slots {kernel}, {initrd}, {memory}, {append} and {console}
    left to fill (confinement included), and what phyfarm decided with it:
    "qemu_user" (or null), "qemu_version", "chardev_reconnect". The plugin
    has it from `phyfarm guest plan`; otherwise it is asked for once."""
    if accel not in _MACHINES:
        use_machine(accel, _ask_machine(accel))
    return _MACHINES[accel]


def _ask_machine(accel: str) -> dict:
    """`phyfarm guest machine --accel ACCEL --json`, as this phyfarm says it."""
    binary = phyfarm_binary()
    argv = [str(binary), "guest", "machine", "--accel", accel, "--json"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(
            f"cannot run {binary} (build it with `cargo build -p phyfarm`): {e}"
        ) from e
    if out.returncode != 0:
        raise SetupError(f"`{' '.join(argv)}` failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def _any_machine() -> dict:
    """A machine description, for what does not depend on the accelerator."""
    return next(iter(_MACHINES.values()), None) or machine("tcg")


def machine_template(accel: str) -> tuple[str, ...]:
    return tuple(machine(accel)["argv"])


def qemu_user() -> QemuUser | None:
    """The user QEMU runs the untrusted kernel as, or None when the harness is
    not root (QEMU is unprivileged already) or the user is missing (phyfarm
    warned)."""
    u = _any_machine().get("qemu_user")
    return QemuUser(u["name"], int(u["uid"]), int(u["gid"])) if u else None


def qemu_version() -> tuple[int, int]:
    major, minor = _any_machine()["qemu_version"]
    return int(major), int(minor)


def chardev_reconnect() -> str:
    """How a reconnecting `-chardev socket` client is spelled for this QEMU."""
    return str(_any_machine()["chardev_reconnect"])


_SLOT = re.compile(r"\{(kernel|initrd|memory|append|console)\}")


def machine_argv(
    kernel: Path, initrd: Path, accel: str, memory_mb: int, append: str, console: Path
) -> list[str]:
    """The machine of `machine_template`, filled for one guest. Each slot is
    replaced once, and a value is never searched for slots itself."""
    values = {
        "kernel": str(kernel),
        "initrd": str(initrd),
        "memory": str(memory_mb),
        "append": append,
        "console": str(console),
    }
    return [_SLOT.sub(lambda m: values[m.group(1)], a) for a in machine_template(accel)]


#: A slot of a device template (the machine's "device_slots" name them).
_DEVICE_SLOT = re.compile(r"\{([a-z_]+)\}")


def devices(accel: str, name: str, **values: object) -> list[str]:
    """The devices `name` of the machine's role devices
    (`guest::machine::device_templates`), filled with `values`: each slot
    replaced once, and a value never searched for slots itself. A plan
    written before it carried devices gets today's `phyfarm guest machine`'s."""
    m = machine(accel)
    if not m.get("devices"):
        m["devices"] = _ask_machine(accel)["devices"]
    templates = m["devices"]
    if name not in templates:
        raise SetupError(f"phyfarm's guest machine has no devices named {name!r}")
    filled = {k: str(v) for k, v in values.items()}

    def fill(m: re.Match) -> str:
        if m.group(1) not in filled:
            raise SetupError(f"devices {name!r}: no value for {{{m.group(1)}}}")
        return filled[m.group(1)]

    return [_DEVICE_SLOT.sub(fill, a) for a in templates[name]]


def qemu_argv(cfg: GuestConfig, console: Path, agent_sock: Path) -> list[str]:
    # phyfarm's kernel command line for this machine (`phyfarm guest
    # machine` says why each option is there), then this guest's own.
    append = f"{machine(cfg.accel)['kernel_args']} {cfg.append}".strip()
    if cfg.tsc_khz and cfg.accel == "tcg":
        append += f" tsc_early_khz={cfg.tsc_khz}"
    a = cfg.accel
    v = [
        *machine_argv(cfg.kernel, cfg.initrd, a, cfg.memory_mb, append, console),
        *devices(a, "agent", agent_sock=agent_sock),
    ]
    if cfg.usb is not None or cfg.usb_net:
        v += devices(a, "xhci")
    if cfg.usb is not None:
        if cfg.usb[0] == "unix":
            v += devices(a, "usb_redir_unix", usb_path=cfg.usb[1])
        else:
            v += devices(a, "usb_redir_tcp", usb_host=cfg.usb[1], usb_port=cfg.usb[2])
    if cfg.usb_net:
        # QEMU's usb-net and the partner NIC, back to back on a hub inside
        # this QEMU: no socket for QEMU to reach after it dropped root.
        v += devices(a, "usb_net_pair")
    elif cfg.wire is not None:
        v += devices(a, "partner_nic", wire_local=cfg.wire[0], wire_remote=cfg.wire[1])
    return v


class Guest:
    def __init__(self, cfg: GuestConfig, sockdir: Path, logdir: Path) -> None:
        self.cfg = cfg
        self.console = logdir / "console.log"
        #: QEMU writes the console into a FIFO; what is kept of it (bounded)
        #: is in `console`.
        self._console = Console(self.console, sockdir / "console.fifo")
        self.agent_sock = sockdir / "agent.sock"
        self.logdir = logdir
        self.argv = qemu_argv(cfg, self._console.fifo, self.agent_sock)
        self.proc: Proc | None = None
        self.agent: Agent | None = None
        self.boot_seconds: float | None = None
        self.started: float | None = None
        #: Predicates over a Splat: reports a check provokes on purpose and
        #: judges itself (phylib's WARN on an injected MDIO error). Every
        #: other report still fails the check.
        self.expected_splats: list[Callable[[Splat], bool]] = []
        #: Whether a hang's evidence was collected (once per guest).
        self._hang_told = False
        #: Called with the evidence when this guest stops answering (the
        #: plugin marks the variant as hanging for the rest of the run).
        self.on_hang: Callable[[str], None] | None = None
        #: A shorter limit for every command, and why (set once another
        #: check of the same variant hung in this run: see HUNG_CAP).
        self.command_cap: tuple[float, str] | None = None

    # -- life cycle ----------------------------------------------------------
    def start(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        (self.logdir / "qemu.cmd").write_text(" ".join(self.argv) + "\n")
        user = qemu_user()
        if user is not None:
            share_with_qemu(self.agent_sock.parent, user.gid, peer_sockets(self.cfg))
        self.started = time.monotonic()
        self._console.start()
        self.proc = Proc("qemu", self.argv, self.logdir / "qemu.log")
        self.agent = Agent(self.agent_sock, self.dead)
        try:
            self.agent.connect(time.monotonic() + 30)
            hello = self.agent.wait_ready(self.cfg.timeout)
        except (AgentError, GuestTimeout) as e:
            raise self._explain(e) from e
        assert self.agent.ready_at is not None
        self.boot_seconds = self.agent.ready_at - self.started
        self.hello = hello

    def dead(self) -> str | None:
        if self.proc is None or self.proc.alive():
            return None
        return f"QEMU exited with {self.proc.returncode()}: {self.proc.tail(5)}".strip()

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.close()
        if self.proc is not None:
            self.proc.stop(grace=1.0)
        self._console.stop()

    # -- console -------------------------------------------------------------
    def console_text(self) -> str:
        """The console as kept (see console.py: bounded)."""
        return self._console.text()

    def splats(self) -> list[Splat]:
        """The console's problem reports, less those the check expects."""
        return [
            s
            for s in find_splats(self.console_text())
            if not any(ok(s) for ok in self.expected_splats)
        ]

    def _explain(self, e: Exception) -> Exception:
        """A harness error while the kernel reported a problem is the kernel's
        fault. A guest that stopped answering says where its tasks block."""
        s = self.splats()
        if s:
            return KernelFailure(s[0].what, s[0].excerpt, str(self.console))
        if isinstance(e, GuestTimeout) and self.dead() is None and not self._hang_told:
            self._hang_told = True
            evidence = hang_evidence(self.agent, self.console_text())
            if self.on_hang is not None:
                self.on_hang(evidence)
            cap = f" ({self.command_cap[1]})" if self.command_cap else ""
            return GuestTimeout(f"{e}{cap}\n{evidence}")
        if isinstance(e, GuestTimeout) or self.dead() is None:
            return e
        return GuestDied(f"{e} (console: {self.console})")

    # -- commands ------------------------------------------------------------
    def limit(self, timeout: float | None) -> float:
        """A command's time limit: asked, at most the guest timeout, at most
        the cap a hang earlier in the run set."""
        t = min(timeout or self.cfg.timeout, self.cfg.timeout)
        return min(t, self.command_cap[0]) if self.command_cap else t

    def run(self, argv: list[str], timeout: float | None = None, **kw) -> CmdResult:
        assert self.agent is not None
        t = self.limit(timeout)
        try:
            return self.agent.run(argv, timeout=t, **kw)
        except (AgentError, GuestTimeout) as e:
            raise self._explain(e) from e

    def sh(self, script: str, timeout: float | None = None) -> CmdResult:
        return self.run(["sh", "-c", script], timeout=timeout)

    def check(self, argv: list[str], timeout: float | None = None) -> CmdResult:
        """Run; a non-zero exit here is the harness's problem (setup commands)."""
        r = self.run(argv, timeout=timeout)
        if r.exit != 0:
            raise AgentError(f"guest setup command failed: {r.describe()}")
        return r

    def submit(self, request: dict):
        assert self.agent is not None
        try:
            return self.agent.submit(request)
        except (AgentError, GuestTimeout) as e:
            raise self._explain(e) from e

    def result(self, pending, timeout: float) -> dict:
        assert self.agent is not None
        try:
            return self.agent.result(pending, self.limit(timeout))
        except (AgentError, GuestTimeout) as e:
            raise self._explain(e) from e

    def wait_files(
        self,
        conditions: list[dict],
        timeout: float = 10.0,
        read: list[str] | None = None,
        interval_ms: int = 5,
    ) -> dict:
        req = {
            "wait": {
                "all": conditions,
                "timeout": timeout,
                "interval_ms": interval_ms,
                "read": read or [],
            }
        }
        return self.result(self.submit(req), timeout)

    def read(self, path: str) -> str:
        r = self.run(["cat", path], timeout=10)
        return r.stdout.strip() if r.exit == 0 else ""
