"""speed/duplex: ethtool -s with autoneg off at 10/half, 10/full, 100/half,
100/full (the partner forced to the same mode), then autoneg again. The
guest's view, the emulator's BMCR and the MAC's medium mode agree (flow
control on only once autonegotiation gave a full-duplex link PAUSE: a
forced mode negotiates none), and traffic flows at every setting: pings,
then a second of TCP, whose data and ACKs cross on the wire, so that a
PHY running another duplex than the partner shows as late collisions on
the emulator's wire."""

from __future__ import annotations

import time

import pytest
from phyfarm_farm.errors import CheckFailed

BMCR_SPEED100, BMCR_ANENABLE, BMCR_FULLDPLX = 0x2000, 0x1000, 0x0100
MEDIUM_FD, MEDIUM_PS = 0x0002, 0x0200
MEDIUM_RFC, MEDIUM_TFC = 0x0010, 0x0020
ALL_MODES = ["100full", "100half", "10full", "10half"]


def settle(farm, speed: int, duplex: str, timeout: float = 15) -> float:
    t = time.monotonic()
    w = farm.guest.wait_files(
        [
            {"path": farm.sysfs("carrier"), "equals": "1"},
            {"path": farm.sysfs("speed"), "equals": str(speed)},
            {"path": farm.sysfs("duplex"), "equals": duplex},
        ],
        timeout=timeout,
    )
    if w["exit"] != 0:
        raise CheckFailed(
            f"{speed}/{duplex}: the guest shows {w['values']} after {timeout:.0f}s; "
            f"emulator: {farm.phy_brief()}"
        )
    return time.monotonic() - t


def check_model(farm, speed: int, duplex: str, autoneg: bool, timeout: float = 10) -> None:
    """The emulator's PHY and the MAC's medium mode must come to agree with the
    guest's view. The guest's sysfs may already show the target mode while a
    renegotiation is still under way (going back to autoneg from 100/full keeps
    100/full), so the model is polled until it agrees or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _check_model_once(farm, speed, duplex, autoneg)
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _check_model_once(farm, speed: int, duplex: str, autoneg: bool) -> None:
    p = farm.emu.phy()["phy"]
    medium = farm.emu.describe()["mac_registers"]["medium"]
    counters = farm.emu.counters().get("counters", {})
    bmcr = p["bmcr"]
    got = {
        "phy": (p["speed"], p["full_duplex"]),
        "bmcr_speed100": bool(bmcr & BMCR_SPEED100),
        "bmcr_full": bool(bmcr & BMCR_FULLDPLX),
        "bmcr_aneg": bool(bmcr & BMCR_ANENABLE),
        "medium_100": bool(medium & MEDIUM_PS),
        "medium_full": bool(medium & MEDIUM_FD),
        "medium_tx_rx_flow_control": (bool(medium & MEDIUM_TFC), bool(medium & MEDIUM_RFC)),
        # Frames that crossed against a partner of another duplex (the
        # whole check so far: one would have failed the mode it came in).
        "wire_duplex_collisions": counters.get("wire_duplex_collisions"),
    }
    full = duplex == "full"
    want = {
        "phy": (speed, full),
        "bmcr_speed100": speed == 100,
        "bmcr_full": full,
        "bmcr_aneg": autoneg,
        "medium_100": speed == 100,
        "medium_full": full,
        # The partner advertises PAUSE whenever it autonegotiates.
        "medium_tx_rx_flow_control": (autoneg and full, autoneg and full),
        "wire_duplex_collisions": 0,
    }
    if got == want:
        return
    how = "autonegotiated" if autoneg else "forced"
    wire = (
        f"{p['speed']}/{'full' if p['full_duplex'] else 'half'}"
        if p["speed"] is not None
        else "no link"
    )
    mac = f"{100 if got['medium_100'] else 10}/{'full' if got['medium_full'] else 'half'}"
    wrong = ", ".join(f"{k} {got[k]} (expected {want[k]})" for k in want if got[k] != want[k])
    raise AssertionError(
        f"the guest shows {speed}/{duplex} {how}, the emulator's PHY runs {wire} and its MAC "
        f"{mac}: {wrong} (BMCR {bmcr:#06x}, medium {medium:#06x})"
    )


@pytest.mark.check("farm.speed_duplex")
@pytest.mark.needs_ctl
def test_speed_duplex(farm, variant, measure):
    farm.start_iperf_server()
    for speed, duplex in [(10, "half"), (10, "full"), (100, "half"), (100, "full")]:
        farm.emu.ctl("partner", autoneg=False, modes=[f"{speed}{duplex}"])
        r = farm.ethtool("-s", farm.dut, "autoneg", "off", "speed", str(speed), "duplex", duplex)
        assert r.exit == 0, f"ethtool -s {speed}/{duplex}:\n{r.describe()}"
        measure(f"settle_{speed}{duplex}", settle(farm, speed, duplex), "s")
        es = farm.ethtool_settings()
        assert (es.get("Speed"), es.get("Duplex"), es.get("Auto-negotiation")) == (
            f"{speed}Mb/s",
            duplex.capitalize(),
            "off",
        ), f"ethtool {farm.dut}: {es}"
        t = farm.ping_until(5)
        assert t is not None, f"no traffic at {speed}/{duplex}; emulator: {farm.phy_brief()}"
        sent, recv = farm.ping(count=3)
        assert recv == sent == 3, f"{speed}/{duplex}: {recv}/{sent} ping replies"
        farm.iperf(seconds=1)
        check_model(farm, speed, duplex, autoneg=False)

    farm.emu.ctl("partner", autoneg=True, modes=ALL_MODES)
    r = farm.ethtool("-s", farm.dut, "autoneg", "on")
    assert r.exit == 0, f"ethtool -s autoneg on:\n{r.describe()}"
    measure("settle_autoneg", settle(farm, 100, "full"), "s")
    check_model(farm, 100, "full", autoneg=True)
    assert farm.ping_until(5) is not None, "no traffic after autoneg came back"
