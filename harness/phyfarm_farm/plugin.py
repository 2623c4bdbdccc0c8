"""pytest plugin of the phyfarm test farm.

Options (group "phyfarm farm"): --artifacts/--kernel, --variant, --accel,
--device, --guest-timeout, --flaps, --results-dir, --guest-image,
--emulator, --kunit-kernel, --list-checks. Fixtures: `farm` boots one guest
with one emulated adapter for one test and always tears both down;
`farm_env` holds what a worker shares (kernels, guest image, emulator,
accelerator); `measure` records a measurement with its unit. Every farm test
gets a KCIDB status (PASS/FAIL/ERROR/MISS/SKIP) in <results-dir>/results.json,
its console, emulator log and wire pcap (headers: the first PCAP_SNAPLEN
bytes of each frame) in <results-dir>/logs/<test>/.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from . import procs, shell
from .emulator import Emulator
from .errors import CheckFailed, HarnessError, KernelFailure, MissingKernel, SetupError
from .exporter import Exporter
from .farm import Farm
from .guest import (
    HUNG_CAP,
    Guest,
    GuestConfig,
    cache_dir,
    host_tsc_khz,
    phyfarm_binary,
    qemu_user,
    share_with_qemu,
    use_machine,
)
from .partner import HostPartner, host_partner_unavailable, sweep_stale_namespaces
from .results import Collector, check_id, classify, message

REPO = Path(__file__).resolve().parents[2]
#: The prefix of a skip reason for a check that does not apply (SKIP); any
#: other skip is missing infrastructure (MISS).
NOT_APPLICABLE = "not applicable:"
VARIANTS = ("rust", "c")
# Bytes of each frame the wire pcap keeps: Ethernet, IP and TCP headers with
# options. Whole frames made a throughput check's capture 250 MB a run.
PCAP_SNAPLEN = 128
#: The product's checks. PHYFARM_FARM_DIR points elsewhere only for the
#: harness's own tests.
FARM_DIR = Path(os.environ.get("PHYFARM_FARM_DIR") or REPO / "pytest-tests" / "farm")


# -- options and markers -----------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("phyfarm farm", "phyfarm test farm (pytest-tests/farm)")
    g.addoption(
        "--artifacts",
        metavar="DIR",
        help="a `phyfarm build` output: DIR/bzImage + metadata.json, or DIR/<variant>/bzImage "
        "[default: <cache>/out/<variant>, built with `phyfarm build` if missing]",
    )
    g.addoption("--kernel", metavar="PATH", help="one kernel image instead of --artifacts")
    g.addoption(
        "--variant",
        choices=VARIANTS,
        action="append",
        help="only this variant (repeatable) [default: every variant found]",
    )
    g.addoption("--accel", choices=("auto", "kvm", "tcg"), default="auto", help="accelerator")
    g.addoption(
        "--device",
        default="emulated",
        metavar="emulated|forwarded-gadget|forwarded:HOST:PORT",
        help="the adapter: ax88772-emu over usbredir; ax88772-emu as a USB gadget in an "
        "exporter guest, exported by the real usbredirect; or a real one forwarded by "
        "usbredirect",
    )
    g.addoption(
        "--exporter-kernel",
        metavar="PATH",
        help="with --device forwarded-gadget: the exporter guest's kernel "
        "[default: <cache>/out/exporter/bzImage, built from qemu-farm/guest/exporter.config]",
    )
    g.addoption(
        "--guest-timeout",
        type=float,
        default=120.0,
        metavar="SECS",
        help="longest a guest may take for one step (boot, a command) before ERROR",
    )
    g.addoption(
        "--list-checks",
        action="store_true",
        help="with --collect-only: print `CHECK <id> <variant>` for every collected farm check",
    )
    g.addoption("--flaps", type=int, default=20, metavar="N", help="link flaps per flap check")
    g.addoption(
        "--results-dir", metavar="DIR", help="results.json and logs [default: beside --junitxml]"
    )
    g.addoption("--guest-image", metavar="PATH", help="a prebuilt `phyfarm guest image`")
    g.addoption(
        "--guest-plan",
        metavar="FILE",
        help="the guest plan `phyfarm test` resolved (kernels, emulator, image, accelerator, "
        "machine) [default: asked from `phyfarm guest plan` with these options]",
    )
    g.addoption("--emulator", metavar="PATH", help="the ax88772-emu binary [default: built]")
    g.addoption(
        "--emulator-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra ax88772-emu argument for every check (repeatable), before the "
        "check's own, e.g. --emulator-arg=--partner-modes=10full,10half",
    )
    g.addoption(
        "--partner",
        choices=("auto", "host", "guest"),
        default="auto",
        help="where the link partner runs: the host's stack in a network namespace on the "
        "emulator's wire (needs root), or a virtio NIC of the guest; auto: the host's "
        "with --device emulated where it can run",
    )
    g.addoption(
        "--shell",
        action="store_true",
        help="after each check, a shell in its guest (adapter attached) on this terminal, "
        "until :quit or end of input (`phyfarm repro --shell`; needs -s)",
    )
    g.addoption(
        "--kunit-kernel",
        metavar="PATH",
        help="kernel built with -K CONFIG_RUST_KERNEL_DOCTESTS=y -K CONFIG_KUNIT_DEFAULT_ENABLED=y "
        "[default: <cache>/out/rust-kunit/bzImage]",
    )


MARKERS = [
    "check(id): the check id this test reports (farm.<name>); parameters other than the "
    "variant are appended as [value]",
    "farm: a check that boots a guest with the AX88772A (set on every test in pytest-tests/farm)",
    "needs_ctl: needs the emulator's control socket (SKIP with a forwarded adapter)",
    "emulator(*args): extra ax88772-emu arguments for this test's emulator",
    "no_network: boot without bringing the interfaces up",
    "single_variant: run once, on the first variant, not per variant",
    "expect_counters(*names): emulator error counters this check provokes on purpose "
    "(see WIRE_FAULTS)",
]

#: The emulator's counters of what a driver that works never causes on a
#: clean wire (none moved in any check of a passing run of both variants):
#: TX frames with a malformed header or oversized (tx_errors), frames sent
#: while the MAC's duplex disagrees with the partner's (duplex_collisions),
#: data sent through an isolated PHY (isolated_dropped), RX frames the
#: driver's bulk IN request was too small for (rx_too_big_for_request),
#: transfers on an endpoint the driver left halted (halted_stalls), and
#: vendor requests the chip does not have (control_stalls beyond the ones
#: injected). Read on the host after each check: whatever the guest says,
#: a check whose wire saw one of them FAILs, naming it.
WIRE_FAULTS = (
    "tx_errors",
    "duplex_collisions",
    "isolated_dropped",
    "rx_too_big_for_request",
    "halted_stalls",
    "control_stalls",
)


def wire_faults(counters: dict, allowed: set[str]) -> dict[str, int]:
    """The WIRE_FAULTS counters of a `counters` reply that moved and are
    not `allowed`; control_stalls counts only beyond mdio_faults_injected."""
    c = counters.get("counters")
    if not isinstance(c, dict):
        return {}

    def n(key: str) -> int:
        v = c.get(key, 0)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    out = {k: n(k) for k in WIRE_FAULTS if k not in allowed}
    if "control_stalls" in out:
        out["control_stalls"] = max(0, out["control_stalls"] - n("mdio_faults_injected"))
    return {k: v for k, v in out.items() if v > 0}


def check_device(dev: str) -> None:
    """--device: emulated, forwarded-gadget or forwarded:HOST:PORT."""
    if dev in ("emulated", GADGET):
        return
    host, _, port = dev.removeprefix("forwarded:").rpartition(":")
    if dev.startswith("forwarded:") and host and port.isdigit() and 0 < int(port) < 65536:
        return
    raise pytest.UsageError(f"--device {dev!r}: expected emulated, {GADGET} or forwarded:HOST:PORT")


def pytest_configure(config: pytest.Config) -> None:
    for m in MARKERS:
        config.addinivalue_line("markers", m)
    check_device(config.getoption("--device"))
    # A run started from a background script inherits SIGINT as ignored; the
    # harness relies on Ctrl-C (SIGINT) ending the run and its guests, so it
    # sets that handling itself instead of trusting what it inherited.
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    procs.install_sigterm_handler()
    config._phyfarm_results_dir = _results_dir(config)  # type: ignore[attr-defined]
    if not hasattr(config, "workerinput"):
        config._phyfarm_collector = Collector(  # type: ignore[attr-defined]
            config._phyfarm_results_dir,  # type: ignore[attr-defined]
            {
                "host": platform.node(),
                "python": platform.python_version(),
                "pytest": pytest.__version__,
            },
        )
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "phyfarm-xdist")


class _XdistHooks:
    @pytest.hookimpl
    def pytest_configure_node(self, node) -> None:
        node.workerinput["phyfarm_results_dir"] = str(node.config._phyfarm_results_dir)


def _results_dir(config: pytest.Config) -> Path:
    wi = getattr(config, "workerinput", None)
    if wi and "phyfarm_results_dir" in wi:
        return Path(wi["phyfarm_results_dir"])
    if config.getoption("--results-dir"):
        return Path(config.getoption("--results-dir")).resolve()
    junit = config.getoption("xmlpath", None)
    if junit:
        return Path(junit).resolve().parent
    return cache_dir() / "runs" / time.strftime("farm-%Y%m%dT%H%M%S")


def selected_variants(config: pytest.Config) -> list[str]:
    """The variants a run covers, without building anything: the guest plan's
    kernels when `phyfarm test` handed one over, else what `phyfarm guest
    variants` says of this run's options."""
    cached = getattr(config, "_phyfarm_variants", None)
    if cached is not None:
        return cached
    given = config.getoption("--guest-plan")
    if given:
        try:
            vs = list(json.loads(Path(given).read_text())["variants"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise pytest.UsageError(f"--guest-plan {given}: {e!r}") from e
    else:
        argv = [str(_phyfarm()), "guest", "variants"]
        for opt in ("--kernel", "--artifacts"):
            if config.getoption(opt):
                argv += [opt, config.getoption(opt)]
        for v in config.getoption("--variant") or []:
            argv += ["--variant", v]
        try:
            vs = _run(argv, "phyfarm guest variants", timeout=120).split()
        except SetupError as e:
            raise pytest.UsageError(str(e)) from e
    config._phyfarm_variants = vs  # type: ignore[attr-defined]
    return vs


def _phyfarm() -> Path:
    """The phyfarm binary, built when it is missing."""
    phyfarm = phyfarm_binary()
    with _locked("cargo"):
        if not phyfarm.is_file():
            _cargo_build(["-p", "phyfarm"], "phyfarm")
    return phyfarm


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bad = []
    for item in items:
        if FARM_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.farm)
            try:
                item._phyfarm_check = check_id(item)  # type: ignore[attr-defined]
            except ValueError as e:
                bad.append(f"{item.nodeid}: {e}")
    if bad:
        raise pytest.UsageError("farm checks without a valid check id:\n" + "\n".join(bad))
    dev = config.getoption("--device")
    if dev.startswith("forwarded:"):
        # The checks still run and report: what the harness cannot do with
        # this device is MISS (missing infrastructure), never a pass.
        skip = pytest.mark.skip(reason=f"needs the emulator's control socket; --device {dev}")
        for item in items:
            if item.get_closest_marker("needs_ctl"):
                item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("--list-checks"):
        for item in session.items:
            check = getattr(item, "_phyfarm_check", None)
            if check is not None:
                print(f"CHECK {check[0]} {check[1] or '-'}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests that parametrize `variant` themselves keep their own values.
    own = any(
        m.args and m.args[0] == "variant" for m in metafunc.definition.iter_markers("parametrize")
    )
    if "variant" in metafunc.fixturenames and not own:
        vs = selected_variants(metafunc.config)
        if metafunc.definition.get_closest_marker("single_variant"):
            vs = vs[:1]
        metafunc.parametrize("variant", vs)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"phyfarm farm: variants {', '.join(selected_variants(config))}; "
        f"accel {config.getoption('--accel')}; device {config.getoption('--device')}; "
        f"results {config._phyfarm_results_dir}"  # type: ignore[attr-defined]
    ]


# -- statuses ------------------------------------------------------------------
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


# -- shared set-up (one per xdist worker) ---------------------------------------
@contextlib.contextmanager
def _locked(name: str):
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(argv: list[str], what: str, timeout: float = 3600) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"{what}: {e}") from e
    if p.returncode != 0:
        raise SetupError(f"{what} failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-3000:]}")
    return p.stdout


@dataclass
class FarmEnv:
    config: pytest.Config
    results_dir: Path
    phyfarm: Path
    emulator: Path | None
    guest_image: Path
    accel: str
    accel_reason: str
    device: str
    timeout: float
    kernels: dict = field(default_factory=dict)
    #: The exporter guest's kernel (forwarded-gadget), else None.
    exporter: Path | None = None
    #: Where the link partner runs: "host" (HostPartner) or "guest".
    partner: str = "guest"
    partner_reason: str = ""

    def kernel(self, variant: str) -> Path:
        if variant not in self.kernels:
            raise MissingKernel(f"no {variant} kernel in the guest plan")
        return self.kernels[variant]

    def exporter_kernel(self) -> Path:
        if self.exporter is None:
            raise MissingKernel("no exporter kernel in the guest plan")
        return self.exporter


#: --device value of the forwarded-gadget path.
GADGET = "forwarded-gadget"


def _cargo_build(args: list[str], what: str) -> None:
    env = dict(os.environ)
    env.setdefault("CARGO_BUILD_JOBS", "1")
    try:
        p = subprocess.run(
            ["cargo", "build", "--quiet", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"cannot build {what}: {e}") from e
    if p.returncode != 0:
        raise SetupError(f"cannot build {what}:\n{p.stderr[-3000:]}")


def guest_plan(cfg: pytest.Config, phyfarm: Path) -> dict:
    """What the guests need, resolved by phyfarm: the file `phyfarm test`
    wrote, or `phyfarm guest plan` asked with this run's options (it builds
    what is missing: the cache's kernels, the emulator, the guest image)."""
    given = cfg.getoption("--guest-plan")
    if given:
        try:
            return json.loads(Path(given).read_text())
        except (OSError, ValueError) as e:
            raise SetupError(f"--guest-plan {given}: {e}") from e
    argv = [str(phyfarm), "guest", "plan", "--accel", cfg.getoption("--accel"), "--json"]
    if cfg.getoption("--kernel"):
        argv += ["--kernel", cfg.getoption("--kernel")]
    elif cfg.getoption("--artifacts"):
        argv += ["--artifacts", cfg.getoption("--artifacts")]
    else:
        argv += ["--default-kernels"]
    for v in selected_variants(cfg):
        argv += ["--variant", v]
    if cfg.getoption("--guest-image") is not None:
        argv += ["--image", cfg.getoption("--guest-image")]
    # The device decides what phyfarm builds (the emulator, the exporter
    # kernel); what is given here is used instead.
    argv += ["--device", cfg.getoption("--device")]
    for opt in ("--emulator", "--exporter-kernel"):
        if cfg.getoption(opt):
            argv += [opt, cfg.getoption(opt)]
    with _locked("guest-plan"):
        return json.loads(_run(argv, "phyfarm guest plan", timeout=3600))


@pytest.fixture(scope="session")
def farm_env(request: pytest.FixtureRequest) -> FarmEnv:
    cfg = request.config
    if shutil.which("qemu-system-x86_64") is None:
        raise SetupError("qemu-system-x86_64 is not installed (bash containers/host-setup.sh)")
    phyfarm = _phyfarm()
    # phyfarm resolves the guests once: the kernels, the emulator, the image,
    # KVM or TCG (probed with a short boot of the first kernel), and the QEMU
    # machine for it. The harness only runs checks.
    plan = guest_plan(cfg, phyfarm)
    emu = Path(plan["emulator"]) if plan.get("emulator") else None
    if cfg.getoption("--device") in ("emulated", GADGET) and emu is None:
        raise SetupError("the guest plan has no emulator for --device " + cfg.getoption("--device"))
    results_dir: Path = cfg._phyfarm_results_dir  # type: ignore[attr-defined]
    env = FarmEnv(
        config=cfg,
        results_dir=results_dir,
        phyfarm=phyfarm,
        emulator=emu,
        guest_image=Path(plan["guest_image"]),
        accel=plan["accel"],
        accel_reason=plan["accel_reason"],
        device=cfg.getoption("--device"),
        timeout=cfg.getoption("--guest-timeout"),
        kernels={v: Path(k) for v, k in (plan.get("kernels") or {}).items()},
        exporter=Path(plan["exporter_kernel"]) if plan.get("exporter_kernel") else None,
    )
    env.partner, env.partner_reason = choose_partner(cfg.getoption("--partner"), env.device)
    if env.partner == "host":
        sweep_stale_namespaces()
    use_machine(env.accel, plan["machine"])
    results_dir.mkdir(parents=True, exist_ok=True)
    qv = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True)
    envdoc = {
        "accel": env.accel,
        "accel_reason": env.accel_reason,
        "partner": env.partner,
        "partner_reason": env.partner_reason,
        "qemu": qv.stdout.splitlines()[0] if qv.stdout else "",
        "guest_image": str(env.guest_image),
        "device": env.device,
        "emulator": str(emu) if emu else None,
        "flaps": cfg.getoption("--flaps"),
        "guest_timeout": env.timeout,
        "command": " ".join(sys.argv),
    }
    tmp = results_dir / f".environment.{os.getpid()}"
    tmp.write_text(json.dumps(envdoc, indent=2))
    tmp.replace(results_dir / "environment.json")
    return env


def choose_partner(option: str, device: str) -> tuple[str, str]:
    """("host" or "guest", why) for --partner on --device."""
    if device != "emulated":
        if option == "host":
            raise SetupError(f"--partner host needs --device emulated, not {device}")
        return "guest", f"--device {device}: the wire does not pass through ax88772-emu's host side"
    if option == "guest":
        return "guest", "--partner guest"
    why = host_partner_unavailable()
    if why is not None:
        if option == "host":
            raise SetupError(f"--partner host cannot run here: {why}")
        return "guest", f"the host-side partner cannot run here: {why}"
    return "host", "the host's stack in a network namespace on the emulator's tap"


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


def _safe(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-\[\]]+", "_", nodeid.replace("::", "__"))[-150:]


@dataclass
class BootSpec:
    """What a test may change about its guest before it boots."""

    kernel: Path | None = None
    append: str = ""
    emulator_args: list[str] = field(default_factory=list)
    network: bool = True
    usb: bool = True


def boot_farm(request: pytest.FixtureRequest, env: FarmEnv, variant: str, spec: BootSpec):
    """Start the emulator and QEMU; returns (farm, cleanup). Cleanup always runs."""
    item = request.node
    logdir = env.results_dir / "logs" / _safe(item.nodeid)
    if logdir.exists():
        shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir(parents=True)
    sockdir = Path(tempfile.mkdtemp(prefix="phyfarm-", dir="/tmp"))
    started: list = []
    emu: Emulator | None = None
    guest: Guest | None = None
    exporter: Exporter | None = None
    partner: HostPartner | None = None

    def cleanup() -> None:
        if emu is not None:
            with contextlib.suppress(Exception):
                snap = {"phy": emu.phy().get("phy"), "counters": emu.counters()}
                (logdir / "emulator-final.json").write_text(json.dumps(snap, indent=2))
            with contextlib.suppress(Exception):
                emu.ctl("pcap", action="stop")
        if guest is not None:
            guest.stop()
        if exporter is not None:
            exporter.stop()
        if emu is not None:
            emu.stop()
        if partner is not None:
            partner.destroy()
        shutil.rmtree(sockdir, ignore_errors=True)

    request.addfinalizer(cleanup)
    item.user_properties.append(("logs", json.dumps(str(logdir))))
    item.user_properties.append(("accel", json.dumps(env.accel)))
    kernel = spec.kernel or env.kernel(variant)
    emulator_args = list(request.config.getoption("--emulator-arg")) + spec.emulator_args
    usb = wire = None
    if env.device in ("emulated", GADGET) and spec.usb:
        # The model, served to the guest directly or through the exporter.
        assert env.emulator is not None
        if env.partner == "host" and env.device == "emulated":
            partner = HostPartner(logdir)
            partner.create()
        emu = Emulator(env.emulator, sockdir, logdir, emulator_args, partner=partner)
        emu.start(timeout=30)
        started.append({"name": "ax88772-emu", "pid": emu.proc.pid, "argv": emu.argv})
        if partner is not None:
            started[-1]["netns"] = partner.ns
            partner.configure()
        emu.ctl("pcap", action="start", path=str(logdir / "wire.pcap"), snaplen=PCAP_SNAPLEN)
    if emu is not None and env.device == "emulated":
        usb = ("unix", emu.usb_sock)
        # No partner NIC in the guest when the partner is the host's.
        wire = None if partner is not None else (emu.partner_wire, emu.emu_wire)
    elif emu is not None and env.device == GADGET:
        exporter = Exporter(env.exporter_kernel(), env.guest_image, env.accel, logdir, emu.usb_sock)
        user = qemu_user()
        if user is not None:
            share_with_qemu(sockdir, user.gid, [emu.usb_sock])
        try:
            exporter.start(timeout=min(env.timeout, 120))
        finally:
            if exporter.proc is not None:
                started.append(
                    {"name": "qemu-exporter", "pid": exporter.proc.pid, "argv": exporter.argv}
                )
        item.user_properties.append(
            (
                "measurement",
                json.dumps(
                    {"name": "exporter_ready", "value": exporter.ready_seconds, "unit": "s"}
                ),
            )
        )
        usb = ("unix", exporter.usb_sock)
        wire = (emu.partner_wire, emu.emu_wire)
    elif env.device.startswith("forwarded:"):
        _, host, port = env.device.split(":", 2)
        usb = ("tcp", host, port)
        wire = (sockdir / "partner.sock", sockdir / "nobody.sock")
    cfg = GuestConfig(
        kernel=kernel,
        initrd=env.guest_image,
        accel=env.accel,
        timeout=env.timeout,
        append=spec.append,
        usb=usb,
        wire=wire,
        # Under TCG the guest's TSC calibration fails on a loaded host and
        # its clock loses ticks; tell it the rate instead.
        tsc_khz=host_tsc_khz() if env.accel == "tcg" else None,
    )
    guest = Guest(cfg, sockdir, logdir)
    hung = env.results_dir / f"hung-{_safe(variant)}"
    guest.on_hang = lambda evidence: _mark_hung(hung, item.nodeid, evidence)
    if hung.is_file():
        first = hung.read_text(errors="replace").splitlines()[0][:200]
        guest.command_cap = (
            HUNG_CAP,
            f"each command capped at {HUNG_CAP:.0f}s: {first} stopped answering earlier",
        )
    farm = Farm(guest=guest, emu=emu, variant=variant, accel=env.accel, link_partner=partner)
    farm.exporter = exporter
    item._phyfarm_farm = farm
    try:
        guest.start()
    finally:
        if guest.proc is not None:
            started.append({"name": "qemu", "pid": guest.proc.pid, "argv": guest.argv})
        (logdir / "procs.json").write_text(json.dumps(started, indent=2))
    item.user_properties.append(
        (
            "measurement",
            json.dumps({"name": "boot_to_agent_ready", "value": guest.boot_seconds, "unit": "s"}),
        )
    )
    if spec.usb and env.device != "none":
        farm.find_interfaces(timeout=min(env.timeout, 60))
    if spec.network and spec.usb:
        t = farm.setup_network(carrier_timeout=min(env.timeout, 30))
        item.user_properties.append(
            ("measurement", json.dumps({"name": "ifup_to_carrier", "value": t, "unit": "s"}))
        )
    return farm


def _mark_hung(marker: Path, nodeid: str, evidence: str) -> None:
    """Remember, for the rest of this farm run, that a guest of this variant
    stopped answering (the first one named; see guest.HUNG_CAP)."""
    if not marker.exists():
        with contextlib.suppress(OSError):
            marker.write_text(f"{nodeid}\n{evidence[:2000]}\n")


@pytest.fixture
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def farm(request: pytest.FixtureRequest, farm_env: FarmEnv, variant: str):
    """One guest of `variant` with one adapter, for this test only."""
    spec = BootSpec()
    for m in request.node.iter_markers("emulator"):
        spec.emulator_args += list(m.args)
    if request.node.get_closest_marker("no_network"):
        spec.network = False
    farm = boot_farm(request, farm_env, variant, spec)
    yield farm
    # Before boot_farm's clean-up stops the emulator (finalizers run last
    # first): the wire's own record of the check.
    if farm.emu is None or farm.emu.dead():
        return
    allowed = {a for m in request.node.iter_markers("expect_counters") for a in m.args}
    bad = wire_faults(farm.emu.counters(), allowed)
    if bad:
        seen = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise CheckFailed(
            f"the wire saw what a working driver never causes: {seen} "
            f"(ax88772-emu's counters; emulator-final.json in the check's logs)"
        )


@pytest.fixture
def flaps(request: pytest.FixtureRequest) -> int:
    return max(1, request.config.getoption("--flaps"))
