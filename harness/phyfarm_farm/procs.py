"""Child processes that never outlive the run.

Every QEMU and emulator runs in its own process group (so a kill reaches its
children) with PR_SET_PDEATHSIG=SIGKILL (so it dies with the pytest process
that started it, even when that one is SIGKILLed), and is registered for an
atexit sweep (Ctrl-C, SIGTERM, normal exit).

A child that changes its user afterwards (QEMU dropping root with -runas)
loses PR_SET_PDEATHSIG: the kernel clears it on a credential change. For
those, a watchdog process in its own session holds the read end of a pipe
from this process and kills the groups it was told about when the pipe
closes, which happens however this process ends, SIGKILL included.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_live: set[Proc] = set()
_lock = threading.Lock()

_WATCHDOG = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    word, _, pgid = line.strip().partition(" ")
    if pgid.isdigit():
        (groups.add if word == "watch" else groups.discard)(int(pgid))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
_watchdog: subprocess.Popen | None = None


def _watch(word: str, pgid: int) -> None:
    """Tell the watchdog to kill (`watch`) or forget (`done`) a group."""
    global _watchdog
    with _lock:
        if _watchdog is None or _watchdog.poll() is not None:
            if word != "watch":
                return
            _watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
            )
        try:
            assert _watchdog.stdin is not None
            _watchdog.stdin.write(f"{word} {pgid}\n")
            _watchdog.stdin.flush()
        except (BrokenPipeError, OSError):
            pass


def _child_setup(parent: int) -> None:
    os.setsid()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Proc:
    """One child process with its log file."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        parent = os.getpid()
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=lambda: _child_setup(parent),  # noqa: PLW1509
        )
        with _lock:
            _live.add(self)
        _watch("watch", self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def stop(self, grace: float = 2.0) -> int | None:
        """SIGTERM the group, then SIGKILL what is left; returns the exit code."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        with _lock:
            _live.discard(self)
        _watch("done", self.popen.pid)
        if not self._log.closed:
            self._log.close()
        return self.popen.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def live() -> list[Proc]:
    with _lock:
        return list(_live)


def kill_all() -> None:
    """Kill every child still registered (atexit, signals)."""
    for p in live():
        _signal_group(p.pid, signal.SIGKILL)
        try:
            p.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        with _lock:
            _live.discard(p)
        _watch("done", p.pid)


atexit.register(kill_all)


def install_sigterm_handler() -> None:
    """SIGTERM (e.g. from CI cancelling a job) ends the run like Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):

        def on_term(signum, frame):
            kill_all()
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, on_term)
