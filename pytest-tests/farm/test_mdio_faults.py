"""mdio-faults: PHY register accesses fail (the emulator STALLs the ASIX MII
vendor request, as when the chip's MDIO access times out, so the PHY driver
gets -EPIPE) while iperf3 traffic runs, then across a link down/up. Each
phase injects a bounded, seeded fault rule (printed in every failure), then
clears it; the interface must come back at 100/Full and carry traffic.

phylib reports an error the PHY driver returns to its state machine with a
WARN naming the function and the errno ("phy_check_link_status+0x0/0xc0:
returned: -32", phy_error_precise) and stops the PHY (PHY_ERROR) until the
interface is taken down and up. That report, with the injected -EPIPE, is
the error being reported as it should be, and is the one kernel report
expected here; every other one (oops, BUG, panic, another WARN, refcount,
lockdep, a different errno) fails the check. So does a link that is lost
and stays lost with no error reported, and an interface that does not
recover once the faults stop (by itself, or by ifdown/ifup after phylib
stopped the PHY)."""

from __future__ import annotations

import json
import re
import time

import pytest
from phyfarm_farm.errors import CheckFailed
from phyfarm_farm.farm import IP, IPERF3, PARTNER_IP, TCP_GOODPUT_RATIO
from phyfarm_farm.guest import Splat, find_splats, phylib_error

SEED = 772
#: (name, fault rules, what runs while they are in force)
PHASES = [
    (
        "read_under_traffic",
        [{"op": "read", "regs": [1], "count": 3, "probability": 0.5, "seed": SEED}],
        "traffic",
    ),
    (
        "write_read_across_link_flap",
        [
            {"op": "write", "regs": [0, 4], "count": 4, "probability": 1.0, "seed": SEED},
            {"op": "read", "regs": [5], "count": 1, "probability": 1.0, "seed": SEED + 1},
        ],
        "link_flap",
    ),
]
#: The errno a STALLed MII vendor request gives the PHY driver (-EPIPE).
INJECTED_ERRNO = 32
#: The background iperf3 runs against a server of its own, so an aborted
#: stream never leaves the judged one's server busy.
BG_PORT = "5202"
BG_SECONDS = 4
#: A link that phylib did not stop comes back within this after the faults stop.
SELF_RECOVERY = 6.0
CARRIER_LIMIT = 15.0
#: Share of the modelled TCP goodput the recovered link must carry (the
#: throughput check's floor: below it the link is broken, not slow).
FLOOR = 0.10


def phy_error_report(s: Splat) -> bool:
    """phylib's WARN on an error a PHY driver returned to its state machine,
    with the errno the emulator injects."""
    return phylib_error(s) == INJECTED_ERRNO


def kernel_log(farm) -> list[str]:
    r = farm.guest.run(["dmesg"], max_output=4 << 20)
    return r.stdout.splitlines()


def relevant(lines: list[str], limit: int = 40) -> str:
    """The PHY, asix and report lines of the kernel log, bounded."""
    keep = re.compile(r"asix|phy_|PHY|mdio|Link is|returned:|WARNING|BUG|Oops|refcount|eth\d")
    out = [line[:200] for line in lines if keep.search(line)]
    return "\n".join(out[-limit:])


class Phase:
    def __init__(self, farm, name: str, rules: list[dict]) -> None:
        self.farm, self.name, self.rules = farm, name, rules
        self.injected = 0
        self.reports = 0
        self.recovery = ""

    def spec(self) -> str:
        return json.dumps({"phase": self.name, "mdio_fault": self.rules})

    def fail(self, what: str) -> CheckFailed:
        return CheckFailed(
            f"{self.name}: {what}\nfault spec: {self.spec()} ({self.injected} injected)\n"
            f"emulator: {self.farm.phy_brief()}\n"
            f"kernel log:\n{relevant(kernel_log(self.farm), limit=25)}"
        )

    def inject(self) -> None:
        for r in self.rules:
            self.farm.emu.ctl("mdio_fault", **r)

    def clear(self) -> None:
        faults = self.farm.emu.describe()["faults"]["mdio"]
        self.injected = sum(r["injected"] for r in faults["rules"])
        self.farm.emu.ctl("mdio_fault", clear=True)

    def wait_injected(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            rules = self.farm.emu.describe()["faults"]["mdio"]["rules"]
            if any(r["injected"] for r in rules):
                return
            time.sleep(0.2)


def bg_traffic_start(farm):
    farm.link_partner.serve("iperf3-bg", [IPERF3, "-s", "-B", PARTNER_IP, "-p", BG_PORT])
    time.sleep(0.3)
    argv = [IPERF3, "-c", PARTNER_IP, "-p", BG_PORT, "-u", "-b", "20M", "-t", str(BG_SECONDS)]
    argv += ["--bidir", "-J"]
    return farm.guest.submit({"argv": argv, "timeout": BG_SECONDS + 20})


def recover(farm, phase: Phase, before: int) -> None:
    """After the faults stop: carrier back by itself, or, when phylib
    stopped the PHY and said so, after ifdown/ifup."""
    if phase.reports == 0:
        w = farm.wait_carrier(True, SELF_RECOVERY)
        if w["exit"] == 0:
            phase.recovery = "by itself"
            return
        # A loaded guest may print phylib's report after the count was taken.
        count_reports(farm, phase, before)
        if phase.reports == 0:
            raise phase.fail(
                f"no carrier {SELF_RECOVERY:.0f}s after the faults stopped, and no error was "
                "reported (a silently dead link)"
            )
    g, dut = farm.guest, farm.dut
    for argv in ([IP, "link", "set", dut, "down"], [IP, "link", "set", dut, "up"]):
        r = g.run(argv, timeout=20)
        if r.exit != 0:
            raise phase.fail(f"{' '.join(argv)} failed: {r.describe()}")
    w = farm.wait_carrier(True, CARRIER_LIMIT)
    if w["exit"] != 0:
        raise phase.fail(
            f"phylib reported the error; no carrier {CARRIER_LIMIT:.0f}s after ifdown/ifup"
        )
    phase.recovery = "after ifdown/ifup"


def count_reports(farm, phase: Phase, before: int) -> None:
    """The reports phylib made during the phase; any other report fails."""
    others = farm.guest.splats()
    if others:
        s = others[0]
        head = "\n".join(s.excerpt.splitlines()[:4])
        raise phase.fail(f"the guest kernel {s.what} (console line {s.line_no}):\n{head}")
    phase.reports = reports_so_far(farm) - before


def reports_so_far(farm) -> int:
    return sum(1 for s in find_splats(farm.guest.console_text()) if phy_error_report(s))


def judge_link(farm, phase: Phase) -> None:
    st = farm.link_state()
    if (st["carrier"], st["speed"], st["duplex"]) != ("1", "100", "full"):
        raise phase.fail(f"after recovery ({phase.recovery}) the guest shows {st}")
    t = farm.ping_until(8)
    if t is None:
        raise phase.fail(f"no ping reply 8s after recovery ({phase.recovery})")
    sent, recv = farm.ping(count=5)
    if recv != sent or sent != 5:
        raise phase.fail(f"after recovery ({phase.recovery}): {recv}/{sent} ping replies")


@pytest.mark.check("farm.mdio_faults")
@pytest.mark.needs_ctl
# Its injected MDIO errors leave the MAC without TFC on a link that
# negotiated PAUSE for a while (in every run here, both variants, the base
# too; most likely the LPA read error, as phylink resolves the pause again
# only on a link change), and a full RX queue then loses some of the iperf3
# traffic's frames. That loss is the injection's, not the driver's.
@pytest.mark.expect_counters("rx_overflow_tfc_off")
def test_mdio_faults(farm, variant, measure):
    farm.guest.expected_splats.append(phy_error_report)
    farm.start_iperf_server()
    for name, rules, during in PHASES:
        phase = Phase(farm, name, rules)
        before = reports_so_far(farm)
        t0 = time.monotonic()
        if during == "traffic":
            bg = bg_traffic_start(farm)
            time.sleep(1.0)
            phase.inject()
            phase.wait_injected(BG_SECONDS)
            # Let the state machine poll (once a second) past the fault.
            time.sleep(1.5)
            phase.clear()
            count_reports(farm, phase, before)
            recover(farm, phase, before)
            r = farm.guest.result(bg, BG_SECONDS + 20)
            measure(f"{name}_bg_iperf_exit", r.get("exit", -1), "code")
        else:
            phase.inject()
            farm.emu.link(False)
            if farm.wait_carrier(False, 5)["exit"] != 0:
                raise phase.fail("carrier stayed on 5s after the link went down")
            time.sleep(0.5)
            farm.emu.link(True)
            farm.wait_carrier(True, 5)
            time.sleep(1.5)
            phase.clear()
            count_reports(farm, phase, before)
            recover(farm, phase, before)
        if phase.injected == 0:
            raise phase.fail("no MDIO access hit the fault rules: the PHY was not exercised")
        judge_link(farm, phase)
        count_reports(farm, phase, before)
        measure(f"{name}_injected", phase.injected, "count")
        measure(f"{name}_phy_error_reports", phase.reports, "count")
        measure(f"{name}_seconds", time.monotonic() - t0, "s")
        if phase.reports > phase.injected:
            raise phase.fail(
                f"{phase.reports} phylib error reports for {phase.injected} injected faults"
            )

    # The recovered link carries real traffic, not just pings.
    d = farm.iperf(seconds=2)
    rate = d["end"]["sum_received"]["bits_per_second"] / 1e6
    measure("tcp_after_faults", rate, "Mbit/s")
    floor = FLOOR * 100 * TCP_GOODPUT_RATIO
    if rate < floor:
        raise CheckFailed(
            f"after the faults the link carries {rate:.1f} Mbit/s TCP (< {floor:.1f}); "
            f"fault specs: {json.dumps([p[1] for p in PHASES])}\n"
            f"kernel log:\n{relevant(kernel_log(farm))}"
        )
