"""cable-test: `ethtool --cable-test` over netlink. Neither AX88772A driver
implements cable testing, so the honest answer is EOPNOTSUPP; the link,
carrier and PHY state must be untouched afterwards. A driver that does
implement it is compared with the cable state set on the emulator."""

from __future__ import annotations

import pytest

NOT_SUPPORTED = "Operation not supported"


def state(farm) -> tuple[dict, dict]:
    ls = farm.link_state()
    p = farm.emu.phy()["phy"]
    return ls, {
        k: p[k]
        for k in (
            "state",
            "link",
            "speed",
            "full_duplex",
            "bmcr",
            "advertise",
            "link_ups",
            "link_downs",
        )
    }


@pytest.mark.check("farm.cable_test")
@pytest.mark.needs_ctl
@pytest.mark.parametrize("mode", ["--cable-test", "--cable-test-tdr"])
def test_cable_test(farm, variant, mode):
    before_link, before_phy = state(farm)
    writes_before = farm.emu.phy()["phy"]["mdio_writes"]
    r = farm.ethtool(mode, farm.dut)
    if r.exit == 0:
        # The driver implements it: its report must match the emulator's cable.
        farm.emu.ctl("cable", state="open", distance_m=12)
        r2 = farm.ethtool(mode, farm.dut)
        farm.emu.ctl("cable", state="ok")
        assert r2.exit == 0 and "open" in r2.stdout.lower(), (
            f"cable open at 12 m on the emulator, driver reports:\n{r2.describe()}"
        )
        return
    assert NOT_SUPPORTED in r.stderr, f"expected EOPNOTSUPP from {mode}:\n{r.describe()}"
    assert "PHY driver does not support cable test" in r.stderr, (
        f"EOPNOTSUPP but not from the PHY driver check:\n{r.describe()}"
    )
    after_link, after_phy = state(farm)
    assert after_link == before_link, f"link changed: {before_link} -> {after_link}"
    assert after_phy == before_phy, f"PHY changed: {before_phy} -> {after_phy}"
    writes_after = farm.emu.phy()["phy"]["mdio_writes"]
    assert writes_after == writes_before, (
        f"{mode} wrote PHY registers: {writes_before} -> {writes_after}"
    )
    sent, recv = farm.ping(count=3)
    assert recv == sent == 3, f"traffic after {mode}: {recv}/{sent} ping replies"
