"""link-flap: N link down/up cycles driven from the emulator's control socket.
Every transition must be seen by the guest (carrier and operstate), carrier
off within 2 s of the cable going away; time to detect and to recover is
recorded per flap; traffic resumes after each; the PHY driver's
link_change_notify path (soft reset + autoneg restart on entering NOLINK)
shows in the emulator's MDIO counters. A second run turns on the "reset
needed after link loss" quirk, which a driver without that reset fails. A
third forces 10/half with a PHY whose reset takes 500 ms: the forced mode
must be on the wire after every flap, which a soft reset that does not wait
for BMCR.RESET to clear fails."""

from __future__ import annotations

import statistics
import time

import pytest
from phyfarm_farm.errors import CheckFailed

DETECT_LIMIT = 2.0  # seconds from cable pulled to carrier off
RECOVER_LIMIT = 10.0
TRAFFIC_LIMIT = 5.0
QUIRK_FLAPS = 5
SLOW_RESET_MS = 500
BMCR_ANENABLE = 0x1000


def flap(farm, i: int) -> dict:
    g = farm.guest
    carrier = farm.sysfs("carrier")
    oper = farm.sysfs("operstate")
    # Down: start polling in the guest, then pull the cable.
    pending = g.submit(
        {
            "wait": {
                "all": [{"path": carrier, "equals": "0"}],
                "timeout": 10,
                "interval_ms": 5,
                "read": [oper],
            }
        }
    )
    t0 = time.monotonic()
    farm.emu.link(False)
    r = g.result(pending, 10)
    detect = time.monotonic() - t0
    if r["exit"] != 0:
        # The guest's word against the wire's: the emulator pulled the cable.
        raise CheckFailed(
            f"flap {i}: the guest reports carrier on, the wire has been down for 10 s "
            f"(ax88772-emu: {farm.phy_brief()})"
        )
    w = g.wait_files([{"path": oper, "not_equals": "up"}], timeout=5)
    if w["exit"] != 0:
        raise CheckFailed(f"flap {i}: operstate still 'up' 5s after carrier off")
    oper_down = w["values"][oper]
    # Up again.
    pending = g.submit(
        {
            "wait": {
                "all": [{"path": carrier, "equals": "1"}],
                "timeout": RECOVER_LIMIT,
                "interval_ms": 5,
            }
        }
    )
    t1 = time.monotonic()
    farm.emu.link(True)
    r = g.result(pending, RECOVER_LIMIT)
    recover = time.monotonic() - t1
    if r["exit"] != 0:
        raise CheckFailed(
            f"flap {i}: no carrier {RECOVER_LIMIT:.0f}s after the link came back; "
            f"emulator: {farm.phy_brief()}"
        )
    w = g.wait_files([{"path": oper, "equals": "up"}], timeout=5)
    if w["exit"] != 0:
        raise CheckFailed(f"flap {i}: operstate {w['values'][oper]!r} 5s after carrier on")
    traffic = farm.ping_until(TRAFFIC_LIMIT)
    if traffic is None:
        raise CheckFailed(f"flap {i}: no ping reply {TRAFFIC_LIMIT:.0f}s after carrier on")
    return {"detect": detect, "recover": recover, "traffic": traffic, "oper_down": oper_down}


def timeline(results: list[dict]) -> str:
    """Carrier off and on times per flap, for the failure's evidence."""
    if not results:
        return "timeline: the first flap failed"
    rows = [
        f"flap {i + 1}: carrier off after {r['detect']:.2f} s, on after {r['recover']:.2f} s, "
        f"traffic after {r['traffic']:.2f} s"
        for i, r in enumerate(results)
    ]
    return "timeline:\n" + "\n".join(rows)


def mdio_writes(farm) -> dict:
    return farm.emu.phy()["phy"]["mdio_writes"]


def force_10half(farm) -> None:
    """The partner and the DUT forced to 10/half (autoneg off)."""
    farm.emu.ctl("partner", autoneg=False, modes=["10half"])
    r = farm.ethtool("-s", farm.dut, "autoneg", "off", "speed", "10", "duplex", "half")
    assert r.exit == 0, f"ethtool -s 10/half:\n{r.describe()}"
    w = farm.guest.wait_files(
        [
            {"path": farm.sysfs("carrier"), "equals": "1"},
            {"path": farm.sysfs("speed"), "equals": "10"},
            {"path": farm.sysfs("duplex"), "equals": "half"},
        ],
        timeout=15,
    )
    if w["exit"] != 0:
        raise CheckFailed(f"forced 10/half: the guest shows {w['values']}; {farm.phy_brief()}")


def still_forced(farm, i: int) -> None:
    """After the flap, the wire must still run what the driver configured:
    the PHY forced (BMCR.ANENABLE clear) at 10/half. A PHY reset restores
    BMCR's default (autonegotiation on); a driver that writes its forced
    mode while the PHY is still in reset has that write dropped, as the
    chip drops it. Read from the emulator, whatever the guest says."""
    p = farm.emu.phy()["phy"]
    got = (bool(p["bmcr"] & BMCR_ANENABLE), p["speed"], p["full_duplex"])
    if got != (False, 10, False):
        raise CheckFailed(
            f"flap {i}: the driver configured forced 10/half, the wire runs "
            f"{p['speed']}/{'full' if p['full_duplex'] else 'half'} with autonegotiation "
            f"{'on' if got[0] else 'off'} (BMCR {p['bmcr']:#06x}) after the PHY's reset; "
            f"emulator: {farm.phy_brief()}"
        )


@pytest.mark.check("farm.link_flap")
@pytest.mark.needs_ctl
@pytest.mark.parametrize("quirk", ["plain", "reset_after_link_loss", "forced_slow_reset"])
def test_link_flap(farm, variant, flaps, measure, quirk):
    """`forced_slow_reset`: the DUT forced to 10/half, and the PHY's reset
    taking 500 ms (802.3 22.2.4.1.1 allows up to 0.5 s; Linux polls
    BMCR.RESET for 600 ms), so link_change_notify's soft reset must wait
    for it before the driver writes its forced mode again."""
    n = flaps if quirk == "plain" else min(flaps, QUIRK_FLAPS)
    if quirk == "reset_after_link_loss":
        farm.emu.ctl("quirks", reset_after_link_loss=True)
    if quirk == "forced_slow_reset":
        n = min(flaps, 2)
        farm.emu.ctl("phy_timing", reset_ms=SLOW_RESET_MS)
        force_10half(farm)
    before = farm.link_state()
    w0 = mdio_writes(farm)
    results: list[dict] = []
    try:
        for i in range(n):
            results.append(flap(farm, i + 1))
            if quirk == "forced_slow_reset":
                still_forced(farm, i + 1)
    except CheckFailed as e:
        # The evidence: what happened on each flap before the failing one.
        raise CheckFailed(f"{e}\n{timeline(results)}") from None
    after = farm.link_state()
    w1 = mdio_writes(farm)

    detect = [r["detect"] for r in results]
    recover = [r["recover"] for r in results]
    for name, vals in (
        ("detect", detect),
        ("recover", recover),
        ("traffic", [r["traffic"] for r in results]),
    ):
        measure(f"{name}_median", statistics.median(vals), "s")
        measure(f"{name}_max", max(vals), "s")
    measure("flaps", n, "count")

    downs = int(after["carrier_down_count"]) - int(before["carrier_down_count"])
    ups = int(after["carrier_up_count"]) - int(before["carrier_up_count"])
    assert (downs, ups) == (n, n), (
        f"{n} flaps, but the guest counted {downs} carrier downs and {ups} ups"
    )
    slow = [(i + 1, round(d, 3)) for i, d in enumerate(detect) if d > DETECT_LIMIT]
    assert not slow, f"carrier off later than {DETECT_LIMIT}s after link down: {slow}"
    odd = {r["oper_down"] for r in results} - {"down", "lowerlayerdown", "dormant"}
    assert not odd, f"operstate while the link was down: {odd}"
    # link_change_notify: a soft reset (BMCR written) and an autoneg restart,
    # which rewrites ADVERTISE after the reset restored its default.
    bmcr = w1.get("0x00", 0) - w0.get("0x00", 0)
    adv = w1.get("0x04", 0) - w0.get("0x04", 0)
    measure("bmcr_writes_per_flap", bmcr / n, "writes")
    if quirk == "forced_slow_reset":
        # Forced mode writes no advertisement.
        adv = n
    assert bmcr >= 2 * n and adv >= n, (
        f"link_change_notify not exercised: {bmcr} BMCR and {adv} ADVERTISE writes "
        f"over {n} flaps (expected >= {2 * n} and >= {n})"
    )
