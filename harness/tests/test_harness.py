"""The harness itself: no QEMU or emulator outlives an interrupted run
(Ctrl-C, or the pytest process killed outright), however the run was started
(from a terminal, or from a background script that leaves SIGINT ignored),
and a guest that hangs is an ERROR naming the timeout, not a FAIL.

These are the project's own tests of the harness (`make test`); the product's
checks are in pytest-tests/farm (`phyfarm test`, `phyfarm run`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SLEEPER = """
import time
def test_sleeps(farm, variant):
    print("GUEST-UP", flush=True)
    time.sleep(600)
"""


def alive(pid: int, argv0: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return cmd == argv0


def run_and_interrupt(tmp_path: Path, config, sig: int, started: str) -> list[dict]:
    test = tmp_path / "test_sleeper.py"
    test.write_text(SLEEPER)
    results = tmp_path / "results"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        str(test),
        "-p",
        "phyfarm_farm.plugin",
        "--results-dir",
        str(results),
        "--accel",
        config.getoption("--accel"),
        "-s",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
    ]
    for opt in ("--kernel", "--artifacts", "--guest-image", "--emulator"):
        if config.getoption(opt):
            argv += [opt, str(config.getoption(opt))]
    v = config.getoption("--variant")
    if v:
        argv += ["--variant", v[0]]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    # A terminal leaves SIGINT at its default; `cmd &` in a script, cron and
    # CI runners start it ignored. Set it here either way: what this test
    # itself inherited must not decide which case runs.
    disposition = signal.SIG_IGN if started == "background" else signal.SIG_DFL

    def as_started() -> None:
        signal.signal(signal.SIGINT, disposition)

    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        preexec_fn=as_started,  # noqa: PLW1509 - no threads run that need the GIL here
    )
    out = b""
    deadline = time.monotonic() + 300
    procs_file = None
    while time.monotonic() < deadline:
        found = list(results.glob("logs/*/procs.json"))
        if found and b"GUEST-UP" in out:
            procs_file = found[0]
            break
        if p.poll() is not None:
            break
        line = p.stdout.readline()
        out += line
    if procs_file is None:
        p.kill()
        pytest.fail(f"the sleeper never booted its guest:\n{out.decode()[-3000:]}")
    started = json.loads(procs_file.read_text())
    assert {s["name"] for s in started} == {"qemu", "ax88772-emu"}, started
    assert all(alive(s["pid"], s["argv"][0]) for s in started), "children not running"
    os.kill(p.pid, sig)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        for s in started:
            if alive(s["pid"], s["argv"][0]):
                os.kill(s["pid"], signal.SIGKILL)
        pytest.fail(f"pytest did not stop within 60 s of {signal.Signals(sig).name}")
    time.sleep(0.5)
    left = [s for s in started if alive(s["pid"], s["argv"][0])]
    # The host-side partner's namespace goes with the run, unless the run
    # was SIGKILLed (the next run sweeps it then).
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mine = [line.split()[0] for line in spaces.splitlines() if f"phyfarm-{p.pid}-" in line]
    if mine and sig != signal.SIGKILL:
        left.append({"name": "netns", "argv": mine})
    return left


@pytest.mark.single_variant
@pytest.mark.parametrize(
    ("how", "started"),
    [("SIGINT", "terminal"), ("SIGINT", "background"), ("SIGKILL", "terminal")],
)
def test_no_process_outlives_an_interrupted_run(farm_env, variant, tmp_path, request, how, started):
    left = run_and_interrupt(tmp_path, request.config, getattr(signal, how), started)
    assert not left, f"still running after {how} to pytest started from a {started}: {left}"


@pytest.mark.single_variant
def test_a_hung_guest_is_an_error_naming_the_timeout(farm_env, variant, request, monkeypatch):
    from phyfarm_farm import agent
    from phyfarm_farm.errors import GuestTimeout
    from phyfarm_farm.plugin import BootSpec, boot_farm
    from phyfarm_farm.results import classify

    farm = boot_farm(request, farm_env, variant, BootSpec(network=False, usb=False))
    monkeypatch.setattr(agent, "SLACK", 1.0)
    os.kill(farm.guest.proc.pid, signal.SIGSTOP)  # the guest freezes: nobody answers
    try:
        with pytest.raises(GuestTimeout) as e:
            farm.guest.run(["true"], timeout=2)
    finally:
        os.kill(farm.guest.proc.pid, signal.SIGCONT)
    assert "within 3s (--guest-timeout 2s" in str(e.value), str(e.value)
    assert classify(e, "call") == "ERROR"
    farm.guest.stop()
    assert not farm.guest.proc.alive(), "the hung guest was not killed"


@pytest.mark.single_variant
def test_a_guest_flooding_its_console_while_it_hangs_is_bounded_and_still_a_hang(
    farm_env, variant, request, monkeypatch
):
    """A guest that prints as fast as it can, then stops answering: the
    console log stays within its bounds (head, tail and a line saying what
    was left out), the hang is still an ERROR naming the timeout, and its
    evidence (asked for, bounded in time, and read from a console holding
    no report) is bounded too."""
    from phyfarm_farm import agent, console
    from phyfarm_farm.errors import GuestTimeout
    from phyfarm_farm.guest import HANG_EVIDENCE_BYTES
    from phyfarm_farm.plugin import BootSpec, boot_farm
    from phyfarm_farm.results import classify

    monkeypatch.setattr(console, "HEAD_BYTES", 256 << 10)
    monkeypatch.setattr(console, "TAIL_BYTES", 64 << 10)
    farm = boot_farm(request, farm_env, variant, BootSpec(network=False, usb=False))
    monkeypatch.setattr(agent, "SLACK", 1.0)
    g = farm.guest
    line = "phyfarm console flood 0123456789abcdef0123456789abcdef"
    g.check(["sh", "-c", f"yes '{line}' > /dev/console 2>&1 &"])
    want = 4 * ((256 + 64) << 10)
    deadline = time.monotonic() + 120
    while g._console.total < want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert g._console.total >= want, f"the guest printed only {g._console.total} bytes"
    # The guest freezes mid-flood: nobody answers, not even for sysrq.
    os.kill(g.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(GuestTimeout) as e:
            g.run(["true"], timeout=2)
    finally:
        os.kill(g.proc.pid, signal.SIGCONT)
    msg = str(e.value)
    assert "within 3s (--guest-timeout 2s" in msg, msg[:500]
    assert "no blocked-task report: the agent could not run sysrq either" in msg, msg[:500]
    assert len(msg) < HANG_EVIDENCE_BYTES + 2048, len(msg)
    assert classify(e, "call") == "ERROR"
    g.stop()
    kept = g.console.read_bytes()
    assert len(kept) < (256 + 64 + 1) << 10, len(kept)
    assert b"were not kept; the last 65536 follow]" in kept
    assert line.encode() in kept[-4096:], kept[-200:]
    assert b"Linux version" in kept[:4096], "the boot's start was not kept"


@pytest.mark.single_variant
def test_the_throughput_samples_are_the_emulators_own_count_of_the_wire(farm, variant):
    """A real guest and the real emulator: the host's count of the wire (the
    ground truth the throughput check holds the receiver's figures to) is
    read, and read second by second it gives the samples the verdict judges;
    none of them more than the paced wire can carry."""
    from phyfarm_farm.farm import TCP_GOODPUT_RATIO

    farm.start_iperf_server()
    g = farm.tcp_goodput(seconds=5, reverse=False, skip=1.0)
    assert g.wire_bytes is not None and g.wire_bytes >= g.claimed_bytes > 0, g
    assert g.sampled == "wire" and len(g.samples) >= 3, g
    # A 100 Mbit/s wire's TCP payload (1460 of every 1538 byte times), plus
    # the pacing's 10 ms of burst credit a second.
    most = 100.0 * TCP_GOODPUT_RATIO * 1.011
    assert all(0 < x <= most for x in g.samples), (g.samples, most)


@pytest.mark.single_variant
def test_the_partner_is_the_hosts_and_the_guest_has_none(farm, variant):
    """With --device emulated as root, the far end of the wire is the host's
    stack in a namespace of its own: the guest has no partner NIC, the
    host answers its pings, and DUT-to-partner throughput is the host
    iperf3 server's own record."""
    from phyfarm_farm.partner import HostPartner, host_partner_unavailable

    why = host_partner_unavailable()
    if why is not None:
        pytest.skip(f"the host-side partner cannot run here: {why}")
    assert isinstance(farm.link_partner, HostPartner), farm.link_partner
    nics = farm.guest.sh("ls /sys/bus/virtio/drivers/virtio_net/*/net 2>/dev/null; true")
    assert nics.stdout.strip() == "", f"the guest has a partner NIC: {nics.stdout}"
    assert farm.ping(count=3) == (3, 3)
    ns = farm.link_partner.ns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns in listed, listed
    farm.start_iperf_server()
    known = farm.host_server_records()
    g = farm.tcp_goodput(seconds=4, reverse=False, skip=1.0)
    docs = farm.link_partner.records("iperf3")
    assert len(docs) == known + 1, f"{len(docs)} host records after {known}"
    host_bytes = sum(float(i["sum"]["bytes"]) for i in docs[-1]["intervals"])
    assert g.claimed_bytes == host_bytes > 0, (g, host_bytes)


@pytest.mark.single_variant
@pytest.mark.partner_ns("user")
def test_a_partner_in_a_user_namespace_is_the_same_host_partner(farm, variant):
    """The partner a non-root harness gets: the host's stack in a network
    namespace inside a user namespace (`unshare -Urn`, no named netns),
    answering the guest's pings and recording DUT-to-partner throughput
    itself, as the named namespace does for root."""
    from phyfarm_farm.partner import HostPartner, host_partner_unavailable

    why = host_partner_unavailable()
    if why is not None:
        pytest.skip(f"the host-side partner cannot run here: {why}")
    lp = farm.link_partner
    assert isinstance(lp, HostPartner) and lp.method == "user", lp
    assert lp.ns == f"user:{lp.holder.pid}", lp.ns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lp.ns not in listed and f"-{lp.holder.pid}" not in listed, listed
    holder_net = os.readlink(f"/proc/{lp.holder.pid}/ns/net")
    assert holder_net != os.readlink("/proc/self/ns/net")
    emu_net = os.readlink(f"/proc/{farm.emu.proc.pid}/ns/net")
    assert emu_net == holder_net, "the emulator's tap is not in the partner's namespace"
    assert farm.ping(count=3) == (3, 3)
    farm.start_iperf_server()
    known = farm.host_server_records()
    g = farm.tcp_goodput(seconds=4, reverse=False, skip=1.0)
    docs = lp.records("iperf3")
    assert len(docs) == known + 1, f"{len(docs)} host records after {known}"
    host_bytes = sum(float(i["sum"]["bytes"]) for i in docs[-1]["intervals"])
    assert g.claimed_bytes == host_bytes > 0, (g, host_bytes)
