"""A check that provokes a kernel report on purpose (farm.mdio_faults and
phylib's WARN on an injected MDIO error) names it; every other report still
fails it. No guest needed."""

from __future__ import annotations

from pathlib import Path

from phyfarm_farm.guest import Guest, GuestConfig, find_splats, phylib_error

PHY_ERROR = """\
[    5.944352] asix 1-1:1.0 eth1: Failed to read reg index 0x0001: -32
[    5.944825] ------------[ cut here ]------------
[    5.944894] phy_check_link_status+0x0/0xc0: returned: -32
[    5.945532] WARNING: CPU: 0 PID: 20 at drivers/net/phy/phy.c:1313 _phy_state_machine+0x11a/0x180
[    5.951990] Call Trace:
[    5.952932] ---[ end trace 0000000000000000 ]---
[    5.971495] asix 1-1:1.0 eth1: Link is Down
"""
OTHER_WARN = """\
[    7.000000] ------------[ cut here ]------------
[    7.000001] called from state HALTED
[    7.000002] WARNING: CPU: 0 PID: 9 at drivers/net/phy/phy.c:1450 phy_start+0x50/0x90
[    7.000003] ---[ end trace 0000000000000000 ]---
[    8.000000] refcount_t: underflow; use-after-free.
"""


def test_a_warn_keeps_its_message_and_phylibs_error_report_is_recognised():
    s = find_splats(PHY_ERROR + OTHER_WARN)
    assert [x.what for x in s] == ["warned", "warned", "reported a refcount error"]
    assert s[0].excerpt.startswith("[    5.944825] ------------[ cut here ]")
    assert s[0].message.endswith("phy_check_link_status+0x0/0xc0: returned: -32")
    assert [phylib_error(x) for x in s] == [32, None, None]
    # The same message outside phylib's file is not phylib's report.
    moved = PHY_ERROR.replace("drivers/net/phy/phy.c", "drivers/net/usb/asix_common.c")
    assert phylib_error(find_splats(moved)[0]) is None


def test_expected_reports_are_left_out_and_every_other_one_stays(tmp_path: Path):
    g = Guest(
        GuestConfig(kernel=tmp_path / "k", initrd=tmp_path / "i", accel="tcg"), tmp_path, tmp_path
    )
    g.console.write_text(PHY_ERROR + OTHER_WARN)
    assert len(g.splats()) == 3
    g.expected_splats.append(lambda s: phylib_error(s) == 32)
    left = g.splats()
    assert [x.what for x in left] == ["warned", "reported a refcount error"]
    assert "phy_start" in left[0].excerpt
    g.expected_splats[:] = [lambda s: phylib_error(s) == 5]
    assert len(g.splats()) == 3, "an errno other than the injected one is not expected"
