"""What each farm check reports: its KCIDB status (PASS/FAIL/ERROR/MISS/SKIP),
a kernel splat failing it, the --shell turn before teardown, its
measurements (`measure`), and results.json with the summary at the end."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from . import procs, shell
from .errors import HarnessError, KernelFailure
from .farm import Farm
from .results import Collector, classify, message

#: The prefix of a skip reason for a check that does not apply (SKIP); any
#: other skip is missing infrastructure (MISS).
NOT_APPLICABLE = "not applicable:"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A kernel splat on the console during a check fails that check."""
    farm: Farm | None = getattr(item, "_phyfarm_farm", None)
    try:
        result = yield
    except HarnessError as e:
        if farm is not None:
            s = farm.guest.splats()
            if s:
                raise KernelFailure(s[0].what, s[0].excerpt, str(farm.guest.console)) from e
        raise
    if farm is not None:
        s = farm.guest.splats()
        if s:
            raise KernelFailure(s[0].what, s[0].excerpt, str(farm.guest.console))
    return result


def _emulator_broke(farm: Farm, excinfo) -> str | None:
    """Why a failed check saw the farm break rather than the driver: the
    emulator died on its own (killed, crashed, or gone while QEMU still
    ran), whatever the check asserted after that. An emulator that ended
    cleanly because QEMU had exited (a kernel panic ends QEMU) broke
    nothing, and a kernel report is the kernel's whatever else died."""
    if excinfo is not None and isinstance(excinfo.value, KernelFailure):
        return None
    dead = farm.emu.dead() if farm.emu is not None else None
    if dead is None:
        return None
    code = farm.emu.proc.returncode() if farm.emu.proc is not None else None
    if code == 0 and farm.guest.dead() is not None:
        return None
    return f"the emulator died during the check: {dead}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    rep = outcome.get_result()
    if not item.get_closest_marker("farm"):
        return
    if rep.skipped:
        msg = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        msg = msg.removeprefix("Skipped: ")
        # Only a check that does not apply may SKIP; one that could not run
        # for want of infrastructure (no QEMU, no KUnit kernel, no control
        # socket) is MISS, which keeps the verdict waiting.
        if msg.startswith(NOT_APPLICABLE):
            status = "SKIP"
        else:
            status, msg = "MISS", f"MISS: {msg}"
    elif rep.failed:
        status = classify(call.excinfo, rep.when)
        msg = f"{status} in {rep.when}: {message(call.excinfo)}"
        farm = getattr(item, "_phyfarm_farm", None)
        broken = farm.exporter.failure() if farm is not None and farm.exporter else None
        if broken is None and farm is not None and farm.emu is not None:
            broken = _emulator_broke(farm, call.excinfo)
        if broken is not None:
            # The exporter side or the emulator broke under the check: not
            # the driver's fault.
            status = "ERROR"
            msg = f"ERROR in {rep.when}: {broken}\nthe check saw: {message(call.excinfo)}"
        if farm is not None:
            msg += f"\nconsole: {farm.guest.console}"
    else:
        status, msg = "PASS", ""
    cid, variant = item._phyfarm_check  # type: ignore[attr-defined]
    rep.phyfarm = {"status": status, "message": msg, "id": cid, "variant": variant}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """--shell: the developer's turn in the guest, before it is torn down."""
    farm: Farm | None = getattr(item, "_phyfarm_farm", None)
    if farm is not None and item.config.getoption("--shell"):
        capman = item.config.pluginmanager.getplugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            shell.repl(farm, sys.stdin, sys.stdout)
    return (yield)


def pytest_runtest_logreport(report) -> None:
    collector = getattr(_config(), "_phyfarm_collector", None)
    if collector is not None:
        collector.add(report)


_CONFIG: list[pytest.Config] = []


def _config() -> pytest.Config | None:
    return _CONFIG[0] if _CONFIG else None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    procs.kill_all()
    collector: Collector | None = getattr(session.config, "_phyfarm_collector", None)
    if collector is None or not collector.tests:
        return
    env_file = collector.results_dir / "environment.json"
    with contextlib.suppress(OSError, ValueError):
        collector.environment.update(json.loads(env_file.read_text()))
    doc = collector.write()
    session.config._phyfarm_doc = doc  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    doc = getattr(config, "_phyfarm_doc", None)
    if not doc:
        return
    tr = terminalreporter
    tr.section("phyfarm farm results")
    # A KUnit case that passed is counted, not listed: a kernel has a hundred.
    cases = [t for t in doc["tests"] if t["status"] == "PASS" and t["id"].startswith("farm.kunit.")]
    for t in doc["tests"]:
        if t in cases:
            continue
        ms = ", ".join(f"{m['name']}={m['value']:.3g} {m['unit']}" for m in t["measurements"][:4])
        first = (t["message"].splitlines() or [""])[0][:120]
        tr.write_line(
            f"{t['status']:5} {t['id']:45} {t['variant'] or '-':4} {t['duration']:6.1f}s  "
            f"{ms if t['status'] == 'PASS' else first}"
        )
    if cases:
        tr.write_line(f"({len(cases)} KUnit cases passed, not listed)")
    tr.write_line(f"counts: {doc['counts']}; results: {config._phyfarm_results_dir}/results.json")


@pytest.fixture
def measure(request: pytest.FixtureRequest):
    """measure(name, value, unit, samples=None): a measurement of this check,
    kept in results.json; `samples` are the repeated readings `value`
    summarises (the verdict's statistics use them)."""

    def record(name: str, value: float, unit: str, samples: list[float] | None = None) -> None:
        m = {"name": name, "value": float(value), "unit": unit}
        if samples:
            m["samples"] = [float(x) for x in samples]
        request.node.user_properties.append(("measurement", json.dumps(m)))

    return record
