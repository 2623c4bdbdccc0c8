"""replug: the adapter is unplugged and plugged back in (usbredir device
disconnect, then connect) 10 times while pings flow both ways, so asix
unbinds and binds and the PHY driver is removed and probed again in a live
guest. After each replug the net device returns (under whatever name the
kernel gives it), gets its address back, has carrier at 100/Full and passes
traffic. At the end exactly one AX88772A net device and one PHY on its MDIO
bus exist, and the kernel log has no "unregister_netdevice: waiting for",
refcount or other report. (A net device whose references leak never
finishes unregistering, which holds the USB hub thread: the next replug's
device then never appears, and the message names that replug.)"""

from __future__ import annotations

import statistics
import time

import pytest
from phyfarm_farm.errors import CheckFailed
from phyfarm_farm.farm import DUT_IP, IP, PARTNER_IP

REPLUGS = 10
DOWN_MS = 300
RETURN_LIMIT = 15.0  # seconds from the replug to the new net device
CARRIER_LIMIT = 10.0
TRAFFIC_LIMIT = 5.0
#: Background pings while the adapter goes away: 100 a second, 1200 bytes.
BG_ARGS = ["-q", "-i", "0.01", "-s", "1200", "-w", "2"]
LEAK_LINES = ("unregister_netdevice: waiting for", "refcount_t")

# A device being unregistered can lose its sysfs files between two reads:
# it is listed only with its ifindex.
ASIX_NETDEVS = """for n in /sys/class/net/*; do
  d=$(readlink "$n/device/driver" 2>/dev/null)
  [ "${d##*/}" = asix ] || continue
  i=$(cat "$n/ifindex" 2>/dev/null) && [ -n "$i" ] && echo "${n##*/} $i"
done"""


def asix_netdevs(farm) -> list[tuple[str, str]]:
    r = farm.guest.sh(ASIX_NETDEVS, timeout=10)
    return [tuple(line.split()[:2]) for line in r.stdout.splitlines() if len(line.split()) >= 2]


def wait_new_netdev(farm, old_ifindex: str, timeout: float) -> tuple[str, str] | str:
    """The asix net device registered after `old_ifindex` went, or how the
    wait ended without one."""
    script = f"""asix() {{
{ASIX_NETDEVS}
}}
end=$(( $(cut -d. -f1 /proc/uptime) + {int(timeout)} ))
while :; do
  asix | grep -v " {old_ifindex}$" && break
  [ "$(cut -d. -f1 /proc/uptime)" -ge "$end" ] && break
  usleep 20000
done"""
    r = farm.guest.sh(script, timeout=timeout + 10)
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] != old_ifindex:
            return parts[0], parts[1]
    return r.describe()


def slab_kb(farm) -> int | None:
    for line in farm.guest.read("/proc/meminfo").splitlines():
        if line.startswith("Slab:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def replug(farm, i: int, ifindex: str) -> tuple[dict, str]:
    g = farm.guest
    tx = g.submit({"argv": ["ping", *BG_ARGS, PARTNER_IP], "timeout": 10})
    # The partner's pings (the host's, when the partner is the host's).
    rx = farm.link_partner.submit(["ping", *BG_ARGS, DUT_IP], 10)
    time.sleep(0.4)
    t0 = time.monotonic()
    farm.emu.ctl("usb", action="replug", down_ms=DOWN_MS)
    new = wait_new_netdev(farm, ifindex, RETURN_LIMIT)
    back = time.monotonic() - t0
    if isinstance(new, str):
        raise CheckFailed(
            f"replug {i}: no asix net device {RETURN_LIMIT:.0f}s after the adapter came back "
            f"(devices now: {asix_netdevs(farm)}; the wait: {new})"
        )
    farm.dut = new[0]
    r = g.sh(f"{IP} addr add {DUT_IP}/24 dev {farm.dut} && {IP} link set {farm.dut} up", 20)
    if r.exit != 0:
        raise CheckFailed(f"replug {i}: cannot set {farm.dut} up again: {r.describe()}")
    t1 = time.monotonic()
    w = farm.wait_carrier(True, CARRIER_LIMIT)
    if w["exit"] != 0:
        raise CheckFailed(
            f"replug {i}: {farm.dut} has no carrier {CARRIER_LIMIT:.0f}s after ifup "
            f"(guest: {w.get('read')}); emulator: {farm.phy_brief()}"
        )
    carrier = time.monotonic() - t1
    traffic = farm.ping_until(TRAFFIC_LIMIT)
    if traffic is None:
        raise CheckFailed(
            f"replug {i}: {farm.dut} carries no ping {TRAFFIC_LIMIT:.0f}s after carrier"
        )
    st = farm.link_state()
    if (st["speed"], st["duplex"]) != ("100", "full"):
        raise CheckFailed(f"replug {i}: {farm.dut} came back at {st}")
    sent = 0
    for out in (g.result(tx, 10).get("stdout", ""), farm.link_partner.result(rx, 10)["stdout"]):
        for line in out.splitlines():
            if "packets transmitted" in line:
                sent += int(line.split()[0])
    return {"back": back, "carrier": carrier, "traffic": traffic, "bg_sent": sent}, new[1]


@pytest.mark.check("farm.replug")
@pytest.mark.needs_ctl
def test_replug(farm, variant, measure):
    devs = asix_netdevs(farm)
    assert len(devs) == 1, f"before the first replug: asix net devices {devs}"
    ifindex = devs[0][1]
    slab0 = slab_kb(farm)
    results: list[dict] = []
    try:
        for i in range(1, REPLUGS + 1):
            res, ifindex = replug(farm, i, ifindex)
            results.append(res)
    except CheckFailed as e:
        done = "; ".join(
            f"{n + 1}: back {r['back']:.1f}s carrier {r['carrier']:.1f}s"
            for n, r in enumerate(results)
        )
        raise CheckFailed(f"{e}\nreplugs that passed: {done or 'none'}") from None

    for name in ("back", "carrier", "traffic"):
        vals = [r[name] for r in results]
        measure(f"{name}_median", statistics.median(vals), "s")
        measure(f"{name}_max", max(vals), "s")
    measure("replugs", REPLUGS, "count")
    measure("bg_pings_sent", sum(r["bg_sent"] for r in results), "count")
    slab1 = slab_kb(farm)
    if slab0 is not None and slab1 is not None:
        measure("slab_growth", slab1 - slab0, "kB")

    devs = asix_netdevs(farm)
    assert len(devs) == 1, f"after {REPLUGS} replugs: asix net devices {devs}, expected one"
    r = farm.guest.sh("ls -d /sys/bus/mdio_bus/devices/usb-* 2>/dev/null", timeout=10)
    phys = r.stdout.split()
    assert len(phys) == 1, f"after {REPLUGS} replugs: PHYs on USB MDIO buses {phys}, expected one"
    log = farm.guest.run(["dmesg"], max_output=4 << 20).stdout.splitlines()
    bad = [line[:200] for line in log if any(x in line for x in LEAK_LINES)]
    assert not bad, f"after {REPLUGS} replugs the kernel log shows:\n" + "\n".join(bad[:20])
    sent, recv = farm.ping(count=5)
    assert recv == sent == 5, f"after {REPLUGS} replugs: {recv}/{sent} ping replies"
