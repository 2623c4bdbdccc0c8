"""Unit tests of the farm plugin's pure parts: KTAP, console splats, KCIDB
classification, check ids, the rust/c differential and QEMU command lines.
No guest needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from phyfarm_farm import ktap
from phyfarm_farm.errors import CheckFailed, GuestTimeout, KernelFailure, SetupError
from phyfarm_farm.guest import GuestConfig, find_splats, qemu_argv, reconnect_option
from phyfarm_farm.results import check_id, classify, differential

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


def test_check_ids_split_the_variant_from_other_parameters():
    assert check_id("farm/test_throughput.py::test_throughput[rust]") == (
        "farm.throughput.throughput",
        "rust",
    )
    assert check_id("farm/test_link_flap.py::test_link_flap[c-plain]") == (
        "farm.link_flap.link_flap[plain]",
        "c",
    )


def rec(variant, status, tcp):
    return {
        "id": "farm.throughput.throughput",
        "variant": variant,
        "status": status,
        "measurements": [{"name": "tcp_tx", "value": tcp, "unit": "Mbit/s"}],
    }


def test_differential_flags_outcome_and_rate_beyond_the_band():
    same = differential([rec("rust", "PASS", 80), rec("c", "PASS", 90)], 0.25)
    assert [d["status"] for d in same] == ["PASS"]
    slow = differential([rec("rust", "PASS", 40), rec("c", "PASS", 90)], 0.25)
    assert slow[0]["status"] == "FAIL" and "tcp_tx" in slow[0]["message"]
    odd = differential([rec("rust", "FAIL", 80), rec("c", "PASS", 80)], 0.25)
    assert "outcome differs: rust FAIL, c PASS" in odd[0]["message"]
    assert differential([rec("rust", "PASS", 80)], 0.25) == []


def test_qemu_reconnect_option_by_version():
    assert reconnect_option((7, 2)) == "reconnect=1"
    assert reconnect_option((9, 2)) == "reconnect-ms=1000"


def test_qemu_usb_net_is_wired_back_to_back_with_the_partner_nic(tmp_path):
    a, b = tmp_path / "usbnet.sock", tmp_path / "partner.sock"
    cfg = GuestConfig(
        kernel=Path("bzImage"), initrd=Path("i"), accel="tcg", usb_net=(a, b), wire=(b, a)
    )
    argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
    joined = " ".join(argv)
    assert argv.count("qemu-xhci,id=xhci") == 1
    assert "usb-net,netdev=u0,bus=xhci.0" in argv and "virtio-net-pci,netdev=n0" in argv
    assert f"id=u0,local.type=unix,local.path={a},remote.type=unix,remote.path={b}" in joined
    assert f"id=n0,local.type=unix,local.path={b},remote.type=unix,remote.path={a}" in joined
    assert "usb-redir" not in joined


def test_tcg_guests_can_be_told_their_tsc_rate(tmp_path):
    def append(**kw) -> str:
        cfg = GuestConfig(kernel=Path("bzImage"), initrd=Path("i"), **kw)
        argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
        return argv[argv.index("-append") + 1]

    assert append(accel="tcg", tsc_khz=2596126).endswith(" tsc_early_khz=2596126")
    assert "tsc_early_khz" not in append(accel="kvm", tsc_khz=2596126)
    assert "tsc_early_khz" not in append(accel="tcg")
