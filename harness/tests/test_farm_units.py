"""Unit tests of the farm plugin's pure parts: KTAP, console splats, KCIDB
classification, check ids, the rust/c differential and QEMU command lines.
No guest needed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from phyfarm_farm import ktap
from phyfarm_farm.errors import (
    AgentError,
    CheckFailed,
    GuestTimeout,
    HarnessError,
    KernelFailure,
    SetupError,
)
from phyfarm_farm.guest import (
    GuestConfig,
    find_splats,
    machine_argv,
    machine_template,
    qemu_argv,
)
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


def test_qemu_reconnect_option_is_phyfarms():
    """The reconnecting chardev is spelled as phyfarm says for this QEMU
    (the version rule is tested in pipeline/src/guest/boot/tests.rs)."""
    from phyfarm_farm import guest

    d = guest.machine("tcg")
    assert d["chardev_reconnect"] in ("reconnect=1", "reconnect-ms=1000"), d
    assert guest.chardev_reconnect() == d["chardev_reconnect"]
    cfg = GuestConfig(kernel=Path("k"), initrd=Path("i"), accel="tcg", usb=("unix", "/s/u"))
    argv = qemu_argv(cfg, Path("/c"), Path("/a"))
    assert f"socket,id=ur0,path=/s/u,{d['chardev_reconnect']}" in argv


def test_qemu_usb_net_is_wired_back_to_back_with_the_partner_nic(tmp_path):
    cfg = GuestConfig(kernel=Path("bzImage"), initrd=Path("i"), accel="tcg", usb_net=True)
    argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
    joined = " ".join(argv)
    assert argv.count("qemu-xhci,id=xhci") == 1
    assert "usb-net,netdev=u0,bus=xhci.0" in argv and "virtio-net-pci,netdev=n0" in argv
    # One hub inside QEMU joins the two: no socket QEMU must reach as its user.
    assert "hubport,id=u0,hubid=0" in argv and "hubport,id=n0,hubid=0" in argv
    assert "dgram" not in joined and "usb-redir" not in joined
    from phyfarm_farm.guest import peer_sockets

    assert peer_sockets(cfg) == []


def test_the_farm_guest_is_the_machine_phyfarm_defines(tmp_path):
    """The machine comes from `phyfarm guest machine` (the one `phyfarm boot`
    runs); the harness only fills its slots, each once, never re-reading a
    value for slots."""
    tcg = machine_template("tcg")
    assert tcg[:3] == ("qemu-system-x86_64", "-accel", "tcg"), tcg
    for slot in ("{kernel}", "{initrd}", "{memory}", "{append}"):
        assert tcg.count(slot) == 1, (slot, tcg)
    assert "file,id=con,path={console}" in tcg
    assert machine_template("kvm")[:5] == ("qemu-system-x86_64", "-accel", "kvm", "-cpu", "host")
    append = "console=ttyS0 {console} {kernel}"
    argv = machine_argv(Path("/k/bzImage"), Path("/i.cpio"), "tcg", 384, append, tmp_path / "c")
    assert argv[argv.index("-kernel") + 1] == "/k/bzImage"
    assert argv[argv.index("-initrd") + 1] == "/i.cpio"
    assert argv[argv.index("-m") + 1] == "384"
    assert argv[argv.index("-append") + 1] == append
    assert f"file,id=con,path={tmp_path / 'c'}" in argv
    assert len(argv) == len(tcg)
    # The whole guest: the machine first, then the farm's devices.
    cfg = GuestConfig(kernel=Path("/k/bzImage"), initrd=Path("/i.cpio"), accel="tcg", memory_mb=384)
    full = qemu_argv(cfg, tmp_path / "c", tmp_path / "agent.sock")
    assert full[: tcg.index("-append")] == argv[: tcg.index("-append")]
    # Its kernel command line is phyfarm's for that accelerator (no TSC rate given).
    from phyfarm_farm import guest

    cmdline = full[full.index("-append") + 1]
    assert cmdline == guest.machine("tcg")["kernel_args"], cmdline
    assert "noapictimer" in cmdline.split() and "tsc_early_khz" not in cmdline


def test_the_guest_plan_resolves_image_accelerator_and_machine_once(tmp_path):
    """`phyfarm guest plan`, as the plugin's farm_env calls it: a requested
    accelerator is taken as is, a given image is kept, and the machine is the
    one of `phyfarm guest machine`. Bad input is exit 2 with the option named."""
    from phyfarm_farm.guest import phyfarm_binary

    image = tmp_path / "farm.cpio"
    image.write_bytes(b"070701")
    argv = [str(phyfarm_binary()), "guest", "plan", "--accel", "tcg", "--image", str(image)]
    p = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["guest_image"] == str(image)
    assert (plan["accel"], plan["accel_reason"]) == ("tcg", "requested")
    assert tuple(plan["machine"]["argv"]) == machine_template("tcg")
    assert (plan["kernels"], plan["variants"], plan["emulator"]) == ({}, [], None), (
        "nothing asked, nothing resolved"
    )
    art = tmp_path / "out"
    (art / "c").mkdir(parents=True)
    (art / "c" / "bzImage").write_bytes(b"k")
    p = subprocess.run(
        [*argv, "--artifacts", str(art), "--emulator", "/bin/true", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    plan2 = json.loads(p.stdout)
    assert plan2["kernels"] == {"c": str(art / "c" / "bzImage")}
    assert plan2["variants"] == ["c"]
    assert plan2["emulator"] == "/bin/true"
    # What the guests run, by content: `phyfarm repro` checks these.
    assert plan2["sha256"][str(art / "c" / "bzImage")] == hashlib.sha256(b"k").hexdigest()
    assert plan2["sha256"][str(image)] == hashlib.sha256(b"070701").hexdigest()
    assert (
        plan2["sha256"]["/bin/true"] == hashlib.sha256(Path("/bin/true").read_bytes()).hexdigest()
    )
    assert plan2["exporter_kernel"] is None, "no forwarded-gadget path asked for"
    p = subprocess.run(
        [*argv, "--exporter-kernel", str(art / "c" / "bzImage"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["exporter_kernel"] == str(art / "c" / "bzImage")
    # A forwarded adapter needs neither the emulator nor an exporter guest.
    p = subprocess.run(
        [*argv, "--device", "forwarded:127.0.0.1:4000", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    fwd = json.loads(p.stdout)
    assert (fwd["emulator"], fwd["exporter_kernel"]) == (None, None)
    assert plan["machine"]["confinement"] == list(
        machine_template("tcg")[-len(plan["machine"]["confinement"]) :]
    )
    for bad, says in (
        (["--accel", "auto", "--image", str(image)], "--accel auto needs --kernel"),
        (["--accel", "tcg", "--image", str(tmp_path / "none")], "--image"),
        (["--accel", "quick"], "--accel"),
        (
            ["--accel", "tcg", "--image", str(image), "--artifacts", str(tmp_path / "no")],
            "--artifacts",
        ),
        (
            ["--accel", "tcg", "--image", str(image), "--emulator", str(tmp_path / "no")],
            "--emulator",
        ),
        (["--kernel", str(image), "--artifacts", str(tmp_path)], "--artifacts"),
        (
            ["--accel", "tcg", "--image", str(image), "--exporter-kernel", str(tmp_path / "no")],
            "--exporter-kernel",
        ),
        (["--exporter-kernel", str(image), "--build-exporter-kernel"], "--exporter-kernel"),
        (["--accel", "tcg", "--image", str(image), "--device", "usb0"], "--device"),
    ):
        p = subprocess.run(
            [str(phyfarm_binary()), "guest", "plan", *bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2, (bad, p.stderr)
        assert says in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)


def test_the_variants_of_a_run_are_phyfarms(tmp_path):
    """The plugin parametrizes its checks with what `phyfarm guest variants`
    says: a kernel's variant is the one --variant names, else its
    metadata.json's, else rust; --artifacts covers the variants it holds.
    Nothing is built; a folder with no kernel is exit 2, named."""
    from phyfarm_farm.guest import phyfarm_binary

    def variants(*args: str) -> list[str]:
        p = subprocess.run(
            [str(phyfarm_binary()), "guest", "variants", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert variants() == ["rust", "c"]
    assert variants("--variant", "c") == ["c"]
    art = tmp_path / "series"
    (art / "c").mkdir(parents=True)
    (art / "c" / "bzImage").write_bytes(b"k")
    assert variants("--artifacts", str(art)) == ["c"]
    (art / "rust").mkdir()
    (art / "rust" / "bzImage").write_bytes(b"k")
    assert variants("--artifacts", str(art)) == ["rust", "c"]
    assert variants("--artifacts", str(art), "--variant", "rust") == ["rust"]
    one = tmp_path / "one"
    one.mkdir()
    (one / "bzImage").write_bytes(b"k")
    assert variants("--kernel", str(one / "bzImage")) == ["rust"]
    (one / "metadata.json").write_text('{"variant": "c"}')
    assert variants("--kernel", str(one / "bzImage")) == ["c"]
    assert variants("--artifacts", str(one)) == ["c"]
    assert variants("--kernel", str(one / "bzImage"), "--variant", "rust") == ["rust"]
    p = subprocess.run(
        [str(phyfarm_binary()), "guest", "variants", "--artifacts", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--artifacts" in p.stderr and "Traceback" not in p.stderr


def test_tcg_guests_can_be_told_their_tsc_rate(tmp_path):
    def append(**kw) -> str:
        cfg = GuestConfig(kernel=Path("bzImage"), initrd=Path("i"), **kw)
        argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
        return argv[argv.index("-append") + 1]

    assert append(accel="tcg", tsc_khz=2596126).endswith(" tsc_early_khz=2596126")
    assert "tsc_early_khz" not in append(accel="kvm", tsc_khz=2596126)
    assert "tsc_early_khz" not in append(accel="tcg")


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


def test_the_exporter_names_the_side_that_failed(tmp_path):
    from phyfarm_farm.exporter import Exporter, ExporterFailed

    assert issubclass(ExporterFailed, HarnessError)
    e = Exporter(Path("bzImage"), Path("farm.cpio"), "tcg", tmp_path, tmp_path / "usb.sock")
    argv = " ".join(e.argv)
    assert "phyfarm.role=exporter" in argv
    # The model's stream and usbredirect's reach the host on virtio-serial
    # ports: no network in the exporter.
    assert f"socket,id=model,path={tmp_path / 'usb.sock'}," in argv
    assert "virtserialport,chardev=model,name=org.phyfarm.model" in argv
    assert f"socket,id=redir,path={e.usb_sock},server=on,wait=off" in argv
    assert "virtserialport,chardev=redir,name=org.phyfarm.usbredir" in argv
    assert "-netdev" not in e.argv
    assert e.failure() is None
    cases = [
        (
            "ax88772-gadget: E: cannot connect to the model at 10.0.2.2:1: refused\n",
            "ax88772-gadget failed",
        ),
        (
            "phyfarm-exporter: ready\nphyfarm-exporter: usbredirect exited with 1\n",
            "usbredirect exited",
        ),
        (
            "phyfarm-exporter: failed: the gadget was not enumerated within 60 s\n",
            "failed to set up",
        ),
    ]
    for text, what in cases:
        e.console.write_text("[    0.1] boot\n" + text)
        why = e.failure()
        assert why is not None and why.startswith("exporter: ") and what in why, why
        assert str(e.console) in why
    e.console.write_text("phyfarm-exporter: ready\nax88772-gadget: I: gadget bound\n")
    assert e.failure() is None


def test_goodput_is_the_receivers_steady_window():
    """Farm.tcp_goodput's arithmetic: intervals starting in the first second
    and a closing partial one are left out, the mean weighs intervals by
    their length, and guest-time rates become host time."""
    from phyfarm_farm.farm import steady_goodput

    def iv(start: float, seconds: float, mbit: float) -> dict:
        b = mbit * 1e6 / 8 * seconds
        return {
            "sum": {"start": start, "seconds": seconds, "bytes": b, "bits_per_second": mbit * 1e6}
        }

    intervals = [iv(0.0, 1.0, 60.0), iv(1.0, 1.0, 90.0), iv(2.0, 2.0, 96.0), iv(4.0, 0.2, 300.0)]
    g = steady_goodput(intervals, clock=0.5)
    assert g.samples == [45.0, 48.0]
    assert g.seconds == 3.0
    assert abs(g.mbps - (90.0 + 2 * 96.0) / 3 * 0.5) < 1e-9
    assert steady_goodput(intervals, clock=1.0, skip=0.0).samples == [60.0, 90.0, 96.0]
    with pytest.raises(AgentError, match="no interval past its first 5s"):
        steady_goodput(intervals, clock=1.0, skip=5.0)


SYSRQ_W = """\
[   42.123456] sysrq: Show Blocked State
[   42.123500] task:ethtool         state:D stack:0     pid:90    tgid:90    ppid:1
[   42.123510] Call Trace:
[   42.123520]  <TASK>
[   42.123530]  __schedule+0x2b0/0x6d0
[   42.123540]  __mutex_lock.constprop.0+0x2f1/0x6a0
[   42.123550]  phy_ethtool_get_link_ksettings+0x20/0x80
[   42.123560]  </TASK>
[   42.123600] task:kworker/0:2     state:D stack:0     pid:25    tgid:25    ppid:2
[   42.123610] Workqueue: events_power_efficient phy_state_machine
[   42.123620] Call Trace:
[   42.123630]  <TASK>
[   42.123800]  __schedule+0x2b0/0x6d0
[   42.124100]  usb_start_wait_urb+0x83/0x150
[   42.124300]  asix_read_cmd+0x4d/0x90
[   42.124400]  asix_mdio_read+0x6b/0xf0
[   42.124600]  mdiobus_read+0x30/0x50
{rust_frame}+0x55/0x160
[   42.124900]  phy_state_machine+0x5b/0x2b0
[   42.125000]  </TASK>
""".format(
    # As a real 6.12 guest printed it (the selftest case read-status-hangs).
    rust_frame="[   42.124700]  _RNvXCs2EhZZi11KpL_13ax88796b_rustNtB2_11PhyAX88772A"
    "NtNtNtCsb5MLIFMWygY_6kernel3net3phy6Driver11read_status"
)


def test_a_hangs_evidence_names_the_driver_frame_a_blocked_task_waits_in():
    from phyfarm_farm.guest import blocked_frame

    got = blocked_frame(SYSRQ_W)
    want = "<ax88796b_rust::PhyAX88772A as kernel::net::phy::Driver>::read_status"
    assert got == f"kworker/0:2 in {want}", got
    # Without a driver frame, phylib's own is the next best; without
    # any task line, nothing is named.
    phylib_only = SYSRQ_W.split("[   42.123600]")[0]
    assert blocked_frame(phylib_only) == "ethtool in phy_ethtool_get_link_ksettings"
    assert blocked_frame("[ 1.0] nothing blocked\n") is None


def test_after_a_hang_the_variants_other_checks_give_each_command_the_cap(tmp_path):
    from phyfarm_farm.guest import HUNG_CAP, Guest, GuestConfig
    from phyfarm_farm.plugin import _mark_hung

    cfg = GuestConfig(kernel=tmp_path / "k", initrd=tmp_path / "i", accel="tcg", timeout=40)
    g = Guest(cfg, tmp_path / "s", tmp_path / "logs")
    assert g.limit(None) == 40 and g.limit(5) == 5 and g.limit(100) == 40
    g.command_cap = (HUNG_CAP, "capped: x hung earlier")
    assert g.limit(None) == HUNG_CAP and g.limit(5) == 5
    # The first hang of a run is the one remembered.
    marker = tmp_path / "hung-rust"
    _mark_hung(marker, "test_link_flap[rust-plain]", "blocked in kworker/0:2 in read_status")
    _mark_hung(marker, "test_probe[rust]", "later")
    assert marker.read_text().splitlines()[0] == "test_link_flap[rust-plain]"


class _WireEmu:
    """An emulator whose counters advance by `per_run` between two reads."""

    def __init__(self, per_run: int) -> None:
        self.reads = 0
        self.per_run = per_run

    def counters(self) -> dict:
        import threading

        # Only the reads around the run advance it (the wire sampler's
        # thread reads what is there).
        if threading.current_thread() is threading.main_thread():
            self.reads += 1
        n = self.per_run * (self.reads // 2)
        # The shape of ax88772-emu's reply (ctl.rs), nested as it is.
        return {"ok": True, "at_us": 0, "counters": {"tx_bytes": n, "rx_bytes": n}}


class _IperfGuest:
    """A guest whose iperf3 receiver says it got `bytes_per_second` for 8 s."""

    def __init__(self, bytes_per_second: float) -> None:
        self.bps = bytes_per_second

    def read(self, path: str) -> str:
        return "100.0 90.0"

    def run(self, argv, timeout=None, **kw):
        from phyfarm_farm.agent import CmdResult

        one = {"seconds": 1.0, "bytes": self.bps, "bits_per_second": self.bps * 8}
        intervals = [{"sum": {"start": float(i), **one}} for i in range(8)]
        doc = {"intervals": intervals, "end": {"sum_sent": {"retransmits": 0}}}
        doc["server_output_json"] = {"intervals": intervals}
        return CmdResult(argv=argv, exit=0, stdout=json.dumps(doc), stderr="", seconds=0.1)


def test_the_receivers_bytes_are_checked_against_the_emulators_wire_count():
    from phyfarm_farm.farm import Farm

    # 11.5 MB a second claimed for 8 s; the wire carried 96 MB (frames
    # with headers): consistent. The same claim over a wire that carried
    # 10 MB is a guest whose figures cannot be true.
    ok = Farm(guest=_IperfGuest(11.5e6), emu=_WireEmu(96_000_000), variant="rust", accel="tcg")
    g = ok.tcp_goodput(seconds=8, reverse=False, skip=2.0)
    assert g.wire_bytes == 96_000_000 and g.claimed_bytes == 92e6
    lying = Farm(guest=_IperfGuest(11.5e6), emu=_WireEmu(10_000_000), variant="rust", accel="tcg")
    g = lying.tcp_goodput(seconds=8, reverse=True, skip=2.0)
    assert g.wire_bytes == 10_000_000 and g.claimed_bytes > g.wire_bytes


class _LoggedHostPartner:
    """A HostPartner whose iperf3 server log already holds `docs` (written
    as iperf3 -s -J writes them) and then a partial one."""

    def __new__(cls, tmp_path, docs):
        from phyfarm_farm.partner import HostPartner

        p = HostPartner(tmp_path)
        log = tmp_path / "partner-iperf3.log"
        log.write_text("".join(json.dumps(d, indent=2) + "\n" for d in docs) + '{\n  "start": {')

        class _Logged:
            name = "iperf3"
            log_path = log

        p.procs.append(_Logged())
        return p


def test_the_host_partners_records_are_its_own_output_whole_documents_only(tmp_path):
    docs = [{"intervals": [1]}, {"intervals": [2]}]
    p = _LoggedHostPartner(tmp_path, docs)
    assert p.records("iperf3") == docs, "the partial third document is not one yet"
    assert p.records("nobody") == []


def test_with_the_host_as_partner_dut_to_partner_is_judged_on_the_hosts_record(
    tmp_path, monkeypatch
):
    """The guest's iperf3 client passes the server's record on
    (--get-server-output); with the host as partner the record read is the
    host server's own output: a guest that forges the copy changes nothing."""
    from phyfarm_farm.farm import Farm

    one = {"seconds": 1.0, "bytes": 1e6, "bits_per_second": 8e6}
    host_doc = {"intervals": [{"sum": {"start": float(i), **one}} for i in range(8)]}
    partner = _LoggedHostPartner(tmp_path, [{"intervals": []}, host_doc])
    # The guest says 11.5 MB a second; the host's server counted 1 MB.
    farm = Farm(
        guest=_IperfGuest(11.5e6),
        emu=None,
        variant="rust",
        accel="tcg",
        link_partner=partner,
    )
    farm.host_server_records = lambda: 1  # the test before this one
    g = farm.tcp_goodput(seconds=8, reverse=False, skip=2.0)
    assert g.claimed_bytes == 8e6, g  # not the 92 MB of the guest's copy
    # No new record from the host: ERROR, never the guest's copy.
    farm.host_server_records = lambda: 2
    import phyfarm_farm.farm as farm_module
    import pytest as _pytest
    from phyfarm_farm.errors import AgentError

    monkeypatch.setattr(farm_module, "HOST_RECORD_WAIT", 0.1)
    with _pytest.raises(AgentError, match="host-side server"):
        farm.tcp_goodput(seconds=8, reverse=False, skip=2.0)


class _Cmd:
    def __init__(self, stdout="", stderr="", exit=0, timed_out=False):
        self.stdout, self.stderr, self.exit, self.timed_out = stdout, stderr, exit, timed_out


class _Guest:
    console = Path("/logs/console.log")

    def __init__(self):
        self.ran = []

    def sh(self, line, timeout=None):
        self.ran.append((line, timeout))
        if line == "hang":
            return _Cmd(timed_out=True, exit=-1)
        if line == "gone":
            raise HarnessError("no reply to `sh`: agent connection closed")
        return _Cmd(stdout="eth1 \x1b[31mUP\n", exit=0 if line != "false" else 1)

    def console_text(self):
        return "\n".join(f"line {i}" for i in range(100))


class _Emu:
    def __init__(self):
        self.links = []

    def link(self, up):
        self.links.append(up)

    def phy(self):
        return {"phy": {"link": False}}

    def counters(self):
        return {"rx_frames": 3}


def test_the_repro_shell_runs_lines_in_the_guest_and_colon_commands_on_the_emulator():
    """`phyfarm repro --shell`: a line runs in the guest, `:` commands go to
    the emulator, guest output is shown without its control characters, a
    command that hangs or a guest that went away is said, not raised."""
    from phyfarm_farm import shell

    class F:
        variant, accel, dut, partner = "rust", "tcg", "eth1", "eth0"
        guest, emu = _Guest(), _Emu()

    f = F()
    inp = io.StringIO(
        "ip link\n\n:link down\n:link sideways\nfalse\nhang\ngone\n"
        ":console 2\n:counters\n:quit\nnever\n"
    )
    out = io.StringIO()
    assert shell.repl(f, inp, out, timeout=5) == 8
    text = out.getvalue()
    assert text.startswith("phyfarm shell: rust kernel, accelerator tcg; adapter eth1"), text
    assert "eth1 ?[31mUP\n" in text and "\x1b" not in text
    assert f.emu.links == [False] and "link down\n" in text
    assert "unknown command ':link sideways'" in text
    assert "[exit 1]" in text and "[timed out after 5s]" in text
    assert "error: no reply to `sh`: agent connection closed" in text
    assert "line 98\nline 99\n" in text and '"rx_frames": 3' in text
    assert [line for line, _ in f.guest.ran] == ["ip link", "false", "hang", "gone"], (
        "never after :quit"
    )
    assert shell.repl(f, io.StringIO(""), io.StringIO()) == 0, "end of input leaves"


def test_a_flooded_console_keeps_its_head_and_tail_and_says_what_it_left_out(tmp_path, monkeypatch):
    """A guest printing far more than the log keeps: the log holds the first
    HEAD_BYTES and the last TAIL_BYTES with a line between them saying how
    much was left out, on disk and as the harness reads it, and what a
    writer put in the FIFO after the reader started is all accounted for."""
    from phyfarm_farm import console as con

    monkeypatch.setattr(con, "HEAD_BYTES", 4096)
    monkeypatch.setattr(con, "TAIL_BYTES", 1024)
    c = con.Console(tmp_path / "logs" / "console.log", tmp_path / "console.fifo")
    c.start()
    lines = [f"[{i:8d}] line {i}\n".encode() for i in range(20000)]
    flood = b"".join(lines)
    # The writer is another process, as QEMU is: it opens the FIFO by name.
    subprocess.run(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"]
        + [str(c.fifo)],
        input=flood,
        check=True,
    )
    # The writer is gone; what it left in the FIFO is read by the thread.
    deadline = time.monotonic() + 10
    while c.total < len(flood) and time.monotonic() < deadline:
        time.sleep(0.01)
    live = c.text()
    c.stop()
    on_disk = c.path.read_bytes()
    assert c.total == len(flood)
    assert on_disk.startswith(flood[:4096]) and on_disk.endswith(flood[-1024:])
    dropped = len(flood) - 4096 - 1024
    note = f"{len(flood)} bytes on its console; {dropped} bytes after the first 4096 were not kept"
    assert note in on_disk.decode(), on_disk[4096:4400]
    assert len(on_disk) < 4096 + 1024 + 200
    assert c.text() == on_disk.decode(errors="replace")
    # Read while the guest runs, the console is the same bounded text.
    assert live == on_disk.decode(errors="replace")
    assert not c.fifo.exists(), "the FIFO outlived the guest"


def test_a_quiet_console_is_kept_whole(tmp_path):
    from phyfarm_farm.console import Console

    c = Console(tmp_path / "console.log", tmp_path / "console.fifo")
    c.start()
    with open(c.fifo, "wb") as w:
        w.write(b"[    0.000000] Linux version 6.12\n")
    c.stop()
    c.stop()  # twice: nothing more happens
    assert c.path.read_text() == "[    0.000000] Linux version 6.12\n"


def test_a_soft_lockup_names_the_function_the_cpu_is_stuck_in():
    """A driver that spins with the PHY lock held stops the guest's only CPU:
    no agent answers, and the kernel's soft-lockup report (a real one, from
    the selftest case read-status-spins) is the evidence. Its RIP line is
    where the CPU is, so it names the driver's function, not a caller."""
    from phyfarm_farm.guest import find_splats, hang_evidence

    text = (Path(__file__).parent / "fixtures/soft-lockup.console").read_text()
    want = "kworker/0:2:21 in <ax88796b_rust::PhyAX88772A as kernel::net::phy::Driver>::read_status"
    (s,) = find_splats("[   27.0] before\n" + text)
    assert s.what == f"reported a soft lockup ({want})", s.what
    assert "Call Trace:" in s.excerpt
    # Without an agent, the console's report stands in for sysrq's.
    ev = hang_evidence(None, "[   27.0] before\n" + text)
    assert ev.startswith(f"blocked in {want}\n"), ev[:300]
    assert hang_evidence(None, "[ 1.0] quiet\n") == "no blocked-task report: no agent"


def _flow_reads(rate_bps: float, begin: float, end: float, stall=(0.0, 0.0)):
    """The emulator's byte count read every 0.2 s: iperf3's control bytes at
    0.1 s, a bulk flow of `rate_bps` wire bits a second from `begin` to
    `end` (paused over `stall`), 200 closing bytes at 9.0 s."""
    reads, n, t = [], 0, 0.0
    for i in range(50):
        t1 = i * 0.2
        for a in (x / 100 for x in range(int(t * 100), int(t1 * 100))):
            if begin <= a < end and not stall[0] <= a < stall[1]:
                n += rate_bps / 8 / 100
        if t <= 0.1 < t1 or (i == 0 and t1 >= 0.1):
            n += 300
        if t <= 9.0 < t1:
            n += 200
        reads.append((100.0 + t1, int(n)))
        t = t1
    return reads


def test_the_wire_count_gives_one_steady_sample_a_host_second():
    from phyfarm_farm.farm import wire_rates

    # 95 Mbit/s of payload from 0.5 s to 8.5 s: the flow is taken from the
    # read before its first bulk growth (0.4 s), its first 2 s left out,
    # and it ends at the read before its last bulk one (8.4 s): six whole
    # seconds of 95 Mbit/s each.
    reads = _flow_reads(95e6, 0.5, 8.5)
    got = wire_rates(reads, seconds=8.0, skip=2.0)
    assert len(got) == 6, got
    for x in got:
        assert abs(x - 95.0) < 0.5, got
    # Neither the control bytes nor the closing ones make a flow.
    assert wire_rates([(0.0, 0), (0.2, 300), (0.4, 300), (9.0, 500)], 8.0, 2.0) == []
    # A flow that stops for half a second shows it in that second only.
    stalled = wire_rates(_flow_reads(95e6, 0.5, 8.5, stall=(4.5, 5.0)), 8.0, 2.0)
    low = [x for x in stalled if x < 80]
    assert len(low) in (1, 2) and min(low) < 60, stalled
    # `seconds` bounds the flow: a longer one gives no more samples.
    assert len(wire_rates(_flow_reads(95e6, 0.5, 9.8), seconds=8.0, skip=2.0)) == 6


def test_with_an_emulator_the_throughput_samples_are_the_wires():
    import threading

    from phyfarm_farm.farm import Farm

    class Emu:
        """While iperf3 runs, frames grow 11.875 MB a second (95 Mbit/s) and
        new TCP payload 11.4 MB (91.2 Mbit/s: the rest was retransmitted)."""

        def __init__(self):
            self.running = threading.Event()
            self.t, self.last = 0.0, None

        def counters(self):
            now = time.monotonic()
            if self.running.is_set() and self.last is not None:
                self.t += now - self.last
            self.last = now
            frames, new = int(self.t * 11.875e6), int(self.t * 11.4e6)
            c = {"tx_bytes": frames, "rx_bytes": frames}
            c |= {"tx_tcp_new_bytes": new, "rx_tcp_new_bytes": new}
            again = int(self.t * 0.2e6)
            c |= {"tx_tcp_again_bytes": again, "rx_tcp_again_bytes": again}
            return {"ok": True, "at_us": int(now * 1e6), "counters": c}

    class SlowIperf(_IperfGuest):
        def read(self, path: str) -> str:
            return f"{time.monotonic():.3f} 0.0"  # the guest's clock runs

        def run(self, argv, timeout=None, **kw):
            if "iperf3" in argv[0]:
                emu.running.set()
                time.sleep(3.6)
                emu.running.clear()
            return super().run(argv, timeout, **kw)

    emu = Emu()
    # The receiver claims 92 Mbit/s; the samples the verdict gets are the
    # emulator's new payload, second by second (91.2), not its frames (95)
    # and not the receiver's intervals. The receiver's record is still read
    # and checked against the frames.
    farm = Farm(guest=SlowIperf(11.5e6), emu=emu, variant="rust", accel="tcg")
    g = farm.tcp_goodput(seconds=8, reverse=False, skip=1.0)
    assert g.sampled == "wire" and 1 <= len(g.samples) <= 3, g.samples
    assert all(abs(x - 91.2) < 1.0 for x in g.samples), g.samples
    assert g.claimed_bytes == 92e6 and g.wire_bytes > 0
    # What the wire carried for the first time and again, counted around
    # the run; the emulator's own RX drops only matter toward the guest.
    assert abs(g.wire_new_bytes - 3.6 * 11.4e6) < 0.3 * 11.4e6, g.wire_new_bytes
    assert abs(g.wire_again_bytes - 3.6 * 0.2e6) < 0.3 * 0.2e6, g.wire_again_bytes
    assert g.wire_dropped_frames is None


def test_payload_sent_again_beyond_the_emulators_own_drops_is_lost_in_the_dut():
    from phyfarm_farm.farm import Goodput, lost_after_the_wire

    def g(new, again, dropped):
        return Goodput(
            mbps=90.0, samples=[], clock=1.0, seconds=8.0, wire_new_bytes=new,
            wire_again_bytes=again, wire_dropped_frames=dropped,
        )  # fmt: skip

    # Nothing sent again, or a trickle: a healthy receiver.
    assert lost_after_the_wire(g(90_000_000, 0, 0)) is None
    assert lost_after_the_wire(g(90_000_000, 400_000, 0)) is None
    # 4.6 % sent again with no drop of the emulator's: lost in the DUT.
    why = lost_after_the_wire(g(89_520_000, 4_100_000, 0))
    assert why and "4.10 MB of the 89.52 MB payload again (4.6%)" in why, why
    assert "lost after the wire" in why
    # The same, explained by frames the emulator dropped itself: not the DUT.
    assert lost_after_the_wire(g(89_520_000, 4_100_000, 3000)) is None
    # Without the counters (no emulator, or DUT -> partner) nothing is said.
    assert lost_after_the_wire(g(90_000_000, 4_100_000, None)) is None
    assert lost_after_the_wire(g(None, None, 0)) is None


def test_the_wires_fault_counters_fail_a_check_unless_it_provokes_them():
    from phyfarm_farm.plugin import WIRE_FAULTS, wire_faults

    clean = {"ok": True, "counters": {k: 0 for k in WIRE_FAULTS} | {"tx_frames": 900}}
    assert wire_faults(clean, set()) == {}
    bad = {"ok": True, "counters": {"duplex_collisions": 12, "tx_errors": 1, "rx_overflow": 3}}
    # rx_overflow is a slow guest, not a broken driver: never named.
    assert wire_faults(bad, set()) == {"duplex_collisions": 12, "tx_errors": 1}
    assert wire_faults(bad, {"duplex_collisions"}) == {"tx_errors": 1}
    # The STALLs the MDIO fault injection asked for are not the driver's.
    stalls = {"counters": {"control_stalls": 4, "mdio_faults_injected": 4}}
    assert wire_faults(stalls, set()) == {}
    stalls["counters"]["control_stalls"] = 5
    assert wire_faults(stalls, set()) == {"control_stalls": 1}
    # A reply of the wrong shape (a hostile or broken emulator) names nothing.
    assert wire_faults({"counters": [1]}, set()) == {}
    assert wire_faults({"counters": {"tx_errors": True}}, set()) == {}
