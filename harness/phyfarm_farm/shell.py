"""`phyfarm repro --shell`: after the check, a shell in its guest, the
adapter still attached, until the developer leaves.

One line at a time: each line runs in the guest as `sh -c LINE` through the
agent (busybox sh; there is no terminal in the guest), with its output and
exit status printed. Lines starting with `:` go to the emulator instead
(`:link down`, `:phy`, ...). Guest output is untrusted: control characters
are shown as `?`.
"""

from __future__ import annotations

import json
import re
from typing import TextIO

from .errors import HarnessError

#: Seconds one command may take before the shell gives up on it.
COMMAND_TIMEOUT = 120.0
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")

HELP = """\
Each line runs in the guest (busybox sh -c, no terminal, {timeout:.0f}s at most).
The emulator's commands:
  :link up|down   plug or unplug the emulated cable
  :phy            the emulated PHY's registers and link state
  :counters       the emulator's counters
  :console [N]    the last N lines of the guest's console (default 40)
  :help           this text
  :quit           leave (the guest and the emulator are stopped); so does end of input
"""


def printable(s: str) -> str:
    return _CONTROL.sub("?", s)


def partner_where(farm) -> str:
    lp = getattr(farm, "link_partner", None)
    if getattr(lp, "where", "") == "host":
        enter = " ".join(lp.wrap(["..."]))
        return f"partner on the host in netns {lp.ns} ({enter})"
    return f"partner {getattr(farm, 'partner_nic', '') or '(none)'} in the guest's netns partner"


def banner(farm) -> str:
    return (
        f"phyfarm shell: {farm.variant} kernel, accelerator {farm.accel}; "
        f"adapter {farm.dut or '(no interface)'}, {partner_where(farm)}\n"
        f"console: {farm.guest.console}\n"
        "`:help` for the emulator's commands, `:quit` or end of input to leave.\n"
    )


def _emulator(farm, words: list[str]) -> str:
    emu = farm.emu
    if emu is None:
        return "no emulator on this device (a forwarded adapter)\n"
    cmd = words[0]
    if cmd == ":link" and len(words) == 2 and words[1] in ("up", "down"):
        emu.link(words[1] == "up")
        return f"link {words[1]}\n"
    if cmd == ":phy" and len(words) == 1:
        return json.dumps(emu.phy().get("phy"), indent=2) + "\n"
    if cmd == ":counters" and len(words) == 1:
        return json.dumps(emu.counters(), indent=2) + "\n"
    return f"unknown command {' '.join(words)!r}: :help lists them\n"


def run_line(farm, line: str, timeout: float = COMMAND_TIMEOUT) -> str:
    """What one line of input prints."""
    words = line.split()
    if not words:
        return ""
    if words[0] == ":help":
        return HELP.format(timeout=timeout)
    if words[0] == ":console":
        n = int(words[1]) if len(words) == 2 and words[1].isdigit() else 40
        return printable("\n".join(farm.guest.console_text().splitlines()[-n:])) + "\n"
    try:
        if words[0].startswith(":"):
            return _emulator(farm, words)
        r = farm.guest.sh(line, timeout=timeout)
    except HarnessError as e:
        return f"error: {printable(str(e))}\n"
    out = printable(r.stdout) + printable(r.stderr)
    if out and not out.endswith("\n"):
        out += "\n"
    if r.timed_out:
        out += f"[timed out after {timeout:.0f}s]\n"
    elif r.exit != 0:
        out += f"[exit {r.exit}]\n"
    return out


def repl(farm, inp: TextIO, out: TextIO, timeout: float = COMMAND_TIMEOUT) -> int:
    """Read lines until `:quit` or end of input; returns how many ran."""
    out.write(banner(farm))
    n = 0
    while True:
        out.write(f"{farm.variant}# ")
        out.flush()
        line = inp.readline()
        if not line:
            out.write("\n")
            break
        line = line.strip()
        if line in (":quit", ":q", "exit"):
            break
        if line:
            out.write(run_line(farm, line, timeout))
            n += 1
    out.flush()
    return n
