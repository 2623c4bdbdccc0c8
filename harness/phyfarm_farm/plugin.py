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

This module holds the options, markers and collection; beside it:
`farm_env` (what a worker shares, the guest plan), `boot` (one guest with
its adapter per check, the wire's verdict after it) and `statuses` (each
check's status and measurements, results.json). pytest loads only this
module, by name: it registers the others' hooks and fixtures through it.
"""

from __future__ import annotations

import os
import platform
import signal
import time
from pathlib import Path

import pytest

from . import procs
from .boot import (
    PCAP_SNAPLEN,
    WIRE_FAULTS,
    BootSpec,
    _mark_hung,
    boot_farm,
    farm,
    flaps,
    variant,
    wire_faults,
)
from .farm_env import GADGET, REPO, farm_env, selected_variants
from .guest import cache_dir
from .results import Collector, check_id
from .statuses import (
    NOT_APPLICABLE,
    measure,
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
)

#: What pytest registers from this module besides its own hooks (the hooks
#: and fixtures of the modules beside it) and what other code imports from
#: it.
__all__ = [
    "NOT_APPLICABLE",
    "PCAP_SNAPLEN",
    "WIRE_FAULTS",
    "BootSpec",
    "_mark_hung",
    "boot_farm",
    "cache_dir",
    "farm",
    "farm_env",
    "flaps",
    "measure",
    "pytest_runtest_call",
    "pytest_runtest_logreport",
    "pytest_runtest_makereport",
    "pytest_runtest_teardown",
    "pytest_sessionfinish",
    "pytest_sessionstart",
    "pytest_terminal_summary",
    "variant",
    "wire_faults",
]

VARIANTS = ("rust", "c")
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
    "partner_ns(method): how this test's host-side partner namespace is made, netns or "
    "user (default: PHYFARM_PARTNER_NS, else netns as root and user otherwise)",
]


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
