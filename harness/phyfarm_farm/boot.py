"""One guest of a variant with one adapter for one check (`farm`,
`boot_farm`): the emulator, exporter and link partner it needs, its logs,
and its clean-up; after the check, the wire's record of faults a working
driver never causes (`wire_faults`)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .emulator import Emulator
from .errors import CheckFailed
from .exporter import Exporter
from .farm import Farm
from .farm_env import GADGET, FarmEnv
from .guest import HUNG_CAP, Guest, GuestConfig, host_tsc_khz, qemu_user, share_with_qemu
from .partner import HostPartner

# Bytes of each frame the wire pcap keeps: Ethernet, IP and TCP headers with
# options. Whole frames made a throughput check's capture 250 MB a run.
PCAP_SNAPLEN = 128

#: The emulator's counters of what a driver that works never causes on a
#: clean wire (none moved in any check of a passing run of both variants):
#: TX frames with a malformed header or oversized (tx_errors), frames sent
#: while the MAC's duplex disagrees with the PHY's (duplex_collisions) or
#: crossing while the PHY's disagrees with the partner's
#: (wire_duplex_collisions),
#: data sent through an isolated PHY (isolated_dropped), RX frames the
#: driver's bulk IN request was too small for (rx_too_big_for_request),
#: transfers on an endpoint the driver left halted (halted_stalls), and
#: vendor requests the chip does not have (control_stalls beyond the ones
#: injected), and frames lost to a full RX FIFO on a link that negotiated
#: flow control while the MAC's TFC was off, so no PAUSE held the partner
#: (rx_overflow_tfc_off: the driver did not program the negotiated pause).
#: Read on the host after each check: whatever the guest says,
#: a check whose wire saw one of them FAILs, naming it.
WIRE_FAULTS = (
    "tx_errors",
    "duplex_collisions",
    "wire_duplex_collisions",
    "isolated_dropped",
    "rx_too_big_for_request",
    "halted_stalls",
    "control_stalls",
    "rx_overflow_tfc_off",
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
            how = request.node.get_closest_marker("partner_ns")
            partner = HostPartner(logdir, method=how.args[0] if how else None)
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
