"""Unit tests of the farm plugin's pure parts: KTAP, console splats, KCIDB
classification, check ids and the plan, the results schema, the wire's
fault counters and the --device option. No guest needed; the guest's own
parts are in test_farm_guest.py, the measurements in
test_farm_measurements.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from phyfarm_farm import ktap
from phyfarm_farm.emulator import REALISTIC_AUTONEG, Emulator, with_realistic_autoneg
from phyfarm_farm.errors import (
    CheckFailed,
    GuestTimeout,
    HarnessError,
    KernelFailure,
    SetupError,
)
from phyfarm_farm.guest import find_splats
from phyfarm_farm.results import classify, validate

REPO = Path(__file__).resolve().parents[2]


KTAP = """\
[    1.000000] KTAP version 1
[    1.000001] 1..2
[    1.000002]     KTAP version 1
[    1.000003]     # Subtest: rust_doctests_kernel
[    1.000004]     1..3
[    1.000005]     ok 1 rust_doctest_kernel_alloc_box_rs_0
[    1.000006]     not ok 2 rust_doctest_kernel_net_phy_rs_1
[    1.000007]     ok 3 rust_doctest_kernel_sync_rs_2 # SKIP needs SMP
[    1.000008] not ok 1 rust_doctests_kernel
[    1.000009]     # Subtest: short_suite
[    1.000010]     1..2
[    1.000011]     ok 1 only_case
[    1.000012] ok 2 short_suite
"""


def test_ktap_gives_one_result_per_case_and_checks_plans():
    cases, problems = ktap.parse(KTAP)
    got = [(c.suite, c.name, c.status) for c in cases]
    assert got == [
        ("rust_doctests_kernel", "rust_doctest_kernel_alloc_box_rs_0", "PASS"),
        ("rust_doctests_kernel", "rust_doctest_kernel_net_phy_rs_1", "FAIL"),
        ("rust_doctests_kernel", "rust_doctest_kernel_sync_rs_2", "SKIP"),
        ("short_suite", "only_case", "PASS"),
    ]
    assert problems == ["short_suite: planned 2 cases, saw 1"]


def test_ktap_of_a_real_failing_doctest_names_the_assertion():
    # The guest console of `phyfarm selftest --case doctest-fails` (a real
    # run; fixtures/regenerate.sh refreshes it).
    text = (Path(__file__).parent / "fixtures/kunit-doctest-fails.console").read_text()
    cases, problems = ktap.parse(text)
    assert problems == []
    assert len(cases) > 100
    failed = [c for c in cases if c.status == "FAIL"]
    assert [(c.suite, c.name) for c in failed] == [
        ("rust_doctests_kernel", "rust_doctest_kernel_net_phy_rs_0")
    ]
    lines = failed[0].lines
    assert lines[0].startswith("# rust_doctest_kernel_net_phy_rs_0.location: rust/kernel/")
    assert any("ASSERTION FAILED at rust/kernel/net/phy.rs" in x for x in lines), lines
    assert any("DuplexMode::Unknown.is_full()" in x for x in lines), lines
    assert lines[-1].startswith("not ok ")


CONSOLE = """\
[    2.0] asix 1-1:1.0 eth1: Link is Up - 100Mbps/Full - flow control rx/tx
[    3.0] ------------[ cut here ]------------
[    3.1] WARNING: CPU: 0 PID: 1 at drivers/net/phy/phy.c:1234 phy_state_machine+0x10/0x20
[    3.2] Call Trace:
[    3.3] ---[ end trace 0000000000000000 ]---
[    4.0] refcount_t: underflow; use-after-free.
"""


def test_console_splats_are_found_with_their_excerpt():
    s = find_splats(CONSOLE)
    assert [x.what for x in s] == ["warned", "reported a refcount error"]
    assert s[0].excerpt.startswith("[    3.0] ------------[ cut here ]")
    assert "end trace" in s[0].excerpt
    assert find_splats("[ 1.0] Link is Down\n[ 2.0] WARNING-free line\n") == []


class _Info:
    def __init__(self, exc):
        self.value = exc


@pytest.mark.parametrize(
    "exc,when,status",
    [
        (CheckFailed("x"), "call", "FAIL"),
        (KernelFailure("oopsed", "Oops: 0000"), "setup", "FAIL"),
        (AssertionError("x"), "call", "FAIL"),
        (AssertionError("x"), "setup", "MISS"),
        (GuestTimeout("x"), "call", "ERROR"),
        (SetupError("x"), "setup", "MISS"),
        (KeyError("x"), "call", "ERROR"),
        (RuntimeError("x"), "teardown", "ERROR"),
    ],
)
def test_only_the_code_under_test_can_fail(exc, when, status):
    assert classify(_Info(exc), when) == status


def test_every_farm_check_is_in_the_plan_and_every_planned_check_is_collected():
    """The ids the harness produces and the plan the importer enforces are
    one list: `phyfarm farm plan` against pytest's own collection."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "--list-checks",
        "--variant",
        "rust",
        "--variant",
        "c",
        "-p",
        "no:cacheprovider",
        str(REPO / "pytest-tests" / "farm"),
    ]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    collected = sorted(
        tuple(line.split()[1:]) for line in p.stdout.splitlines() if line.startswith("CHECK ")
    )
    from phyfarm_farm.guest import phyfarm_binary

    argv = [str(phyfarm_binary()), "farm", "plan", "--variants", "rust,c", "--kunit"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    planned = sorted(
        tuple(line.split())
        for line in r.stdout.splitlines()
        if not line.startswith("farm.differential.")
    )
    assert collected == planned
    assert ("farm.link_flap[reset_after_link_loss]", "rust") in collected
    assert ("farm.cable_test[cable-test]", "c") in collected


def test_a_farm_test_without_a_check_id_is_a_usage_error(tmp_path):
    farm = tmp_path / "farm"
    farm.mkdir()
    (farm / "test_x.py").write_text("def test_x(variant):\n    pass\n")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "phyfarm_farm.plugin",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(farm),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO / "harness"), "PHYFARM_FARM_DIR": str(farm)},
    )
    assert p.returncode == 4, p.stdout + p.stderr
    assert "test_x.py::test_x" in p.stderr and "no @pytest.mark.check" in p.stderr, p.stderr


SCHEMA_EXAMPLES = REPO / "pipeline" / "schema" / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in SCHEMA_EXAMPLES.glob("*.json")))
def test_the_schema_accepts_and_refuses_the_same_examples_as_the_reader(name):
    # The Rust reader's test (contract::tests) reads the same files.
    doc = json.loads((SCHEMA_EXAMPLES / name).read_text())
    if name == "good.json":
        validate(doc)
    else:
        with pytest.raises(HarnessError, match="does not match farm-results.schema.json"):
            validate(doc)


def test_the_wires_fault_counters_fail_a_check_unless_it_provokes_them():
    from phyfarm_farm.plugin import WIRE_FAULTS, wire_faults

    clean = {"ok": True, "counters": {k: 0 for k in WIRE_FAULTS} | {"tx_frames": 900}}
    assert wire_faults(clean, set()) == {}
    bad = {"ok": True, "counters": {"duplex_collisions": 12, "tx_errors": 1, "rx_overflow": 3}}
    # rx_overflow is a slow guest, not a broken driver: never named.
    assert wire_faults(bad, set()) == {"duplex_collisions": 12, "tx_errors": 1}
    assert wire_faults(bad, {"duplex_collisions"}) == {"tx_errors": 1}
    # An overflow PAUSE would have prevented, had the driver set TFC, is named.
    bad["counters"]["rx_overflow_tfc_off"] = 2
    assert wire_faults(bad, {"duplex_collisions", "tx_errors"}) == {"rx_overflow_tfc_off": 2}
    # The STALLs the MDIO fault injection asked for are not the driver's.
    stalls = {"counters": {"control_stalls": 4, "mdio_faults_injected": 4}}
    assert wire_faults(stalls, set()) == {}
    stalls["counters"]["control_stalls"] = 5
    assert wire_faults(stalls, set()) == {"control_stalls": 1}
    # A reply of the wrong shape (a hostile or broken emulator) names nothing.
    assert wire_faults({"counters": [1]}, set()) == {}
    assert wire_faults({"counters": {"tx_errors": True}}, set()) == {}


# -- the forwarded-gadget path ----------------------------------------------


@pytest.mark.parametrize("dev", ["emulated", "forwarded-gadget", "forwarded:127.0.0.1:4000"])
def test_good_devices_are_taken(dev):
    from phyfarm_farm.plugin import check_device

    check_device(dev)


@pytest.mark.parametrize("dev", ["gadget", "forwarded:", "forwarded:host", "forwarded:h:0", ""])
def test_a_bad_device_is_a_usage_error_naming_it(dev):
    from phyfarm_farm.plugin import check_device

    with pytest.raises(pytest.UsageError, match="forwarded-gadget"):
        check_device(dev)


def test_the_farm_autonegotiates_in_1_5_to_3_seconds_unless_told_otherwise():
    assert with_realistic_autoneg(["--quiet"]) == [*REALISTIC_AUTONEG, "--quiet"]
    assert REALISTIC_AUTONEG == ("--autoneg-ms", "1500", "--autoneg-jitter-ms", "1500")
    for own in (["--autoneg-ms=0"], ["--autoneg-ms", "0"], ["--autoneg-jitter-ms", "5"]):
        assert with_realistic_autoneg(own) == own, own
    emu = Emulator(Path("/nonexistent/ax88772-emu"), Path("/tmp/s"), Path("/tmp/l"), [])
    i = emu.argv.index("--autoneg-ms")
    assert emu.argv[i : i + 4] == list(REALISTIC_AUTONEG), emu.argv
