"""probe: the guest enumerates the emulated adapter, asix binds, the AX88772A
PHY driver of the variant under test (Rust or C) attaches, and the link comes
up at 100/Full after autonegotiation; a ping crosses the wire."""

from __future__ import annotations

import pytest

PHY_DRIVER = "Asix Electronics AX88772A"
PHY_ID = 0x003B1861


def driver_symbols(farm) -> tuple[int, int]:
    """(Rust driver symbols, C driver symbols) in the guest's kallsyms."""
    r = farm.guest.run(["grep", "-c", "ax88796b_rust", "/proc/kallsyms"])
    rust = int(r.stdout.strip() or 0)
    r = farm.guest.run(
        [
            "grep",
            "-c",
            "-E",
            " (asix_soft_reset|asix_ax88772a_link_change_notify)$",
            "/proc/kallsyms",
        ]
    )
    c = int(r.stdout.strip() or 0)
    return rust, c


@pytest.mark.check("farm.probe")
def test_probe(farm, variant, measure):
    g, dut = farm.guest, farm.dut
    usb = f"/sys/class/net/{dut}/device/.."
    ids = (g.read(f"{usb}/idVendor"), g.read(f"{usb}/idProduct"))
    assert ids == ("0b95", "772a"), f"USB ids of {dut}: {ids}, expected 0b95:772a"
    driver = g.run(["readlink", f"/sys/class/net/{dut}/device/driver"]).stdout.strip()
    assert driver.endswith("/asix"), f"{dut} is bound to {driver!r}, expected asix"

    # The PHY attaches before the netdev registers, so there is no phydev
    # link: the adapter's MDIO bus is named after its USB device.
    r = g.sh(
        "for d in /sys/bus/mdio_bus/devices/usb-*; do echo $d $(readlink $d/driver)"
        " $(cat $d/phy_id); done"
    )
    phys = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if "usb-" in line]
    assert len(phys) == 1, f"expected one PHY on the adapter's MDIO bus, found: {r.stdout!r}"
    phy_driver, phy_id = phys[0].rsplit(" ", 1)
    assert phy_driver.endswith("/" + PHY_DRIVER), (
        f"PHY driver is {phy_driver.rsplit('/', 1)[-1]!r}, expected {PHY_DRIVER!r}"
    )
    phy_id = int(phy_id, 16)
    assert phy_id == PHY_ID, f"PHY id {phy_id:#010x}, expected {PHY_ID:#010x}"

    rust, c = driver_symbols(farm)
    impl = "rust" if rust and not c else "c" if c and not rust else "unknown"
    assert impl == variant, (
        f"the {variant} kernel runs the {impl} PHY driver "
        f"(kallsyms: {rust} ax88796b_rust symbols, {c} C driver symbols)"
    )

    st = farm.link_state()
    assert (st["carrier"], st["speed"], st["duplex"]) == ("1", "100", "full"), (
        f"{dut} link after autoneg: {st}; emulator: {farm.phy_brief()}"
    )
    es = farm.ethtool_settings()
    assert es.get("Auto-negotiation") == "on", f"ethtool {dut}: {es}"
    assert es.get("Link detected") == "yes", f"ethtool {dut}: {es}"
    if farm.emu is not None:
        p = farm.emu.phy()["phy"]
        assert (p["link"], p["speed"], p["full_duplex"], p["autoneg_complete"]) == (
            True,
            100,
            True,
            True,
        ), f"emulator PHY: {farm.phy_brief()}"

    t = farm.ping_until(timeout=10)
    assert t is not None, f"no ping reply from the partner within 10s; emulator: {farm.phy_brief()}"
    sent, recv = farm.ping(count=5)
    assert recv == sent == 5, f"ping: {recv}/{sent} replies"
    measure("first_ping", t, "s")
