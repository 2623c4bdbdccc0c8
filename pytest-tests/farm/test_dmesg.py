"""dmesg clean: a guest taken through bind, ifup, traffic, ifdown/ifup, a
link flap and ethtool queries logs no WARN, BUG, Oops, lockdep or refcount
report. (Every other check also fails on such a report on its console.)"""

from __future__ import annotations

import pytest
from phyfarm_farm.farm import IP
from phyfarm_farm.guest import find_splats


@pytest.mark.check("farm.dmesg")
def test_dmesg_clean(farm, variant):
    assert farm.ping_until(10) is not None, "no traffic after ifup"
    for argv in ([IP, "link", "set", farm.dut, "down"], [IP, "link", "set", farm.dut, "up"]):
        r = farm.guest.run(argv)
        assert r.exit == 0, r.describe()
    w = farm.wait_carrier(True, 15)
    assert w["exit"] == 0, f"no carrier after ifdown/ifup: {farm.phy_brief()}"
    if farm.emu is not None:
        farm.emu.link(False)
        assert farm.wait_carrier(False, 5)["exit"] == 0, "carrier stayed on with the link down"
        farm.emu.link(True)
        assert farm.wait_carrier(True, 10)["exit"] == 0, "carrier did not come back"
    for args in ([farm.dut], ["-i", farm.dut], ["-S", farm.dut], ["-r", farm.dut]):
        farm.ethtool(*args)
    assert farm.ping_until(10) is not None, "no traffic at the end"
    r = farm.guest.run(["dmesg"], max_output=4 << 20)
    assert r.exit == 0, r.describe()
    splats = find_splats(r.stdout)
    assert not splats, "kernel log is not clean:\n" + "\n\n".join(
        f"{s.what} (line {s.line_no}):\n{s.excerpt}" for s in splats
    )
