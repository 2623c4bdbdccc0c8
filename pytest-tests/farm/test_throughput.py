"""throughput: iperf3 TCP in both directions and UDP at a fixed rate, from the
AX88772A interface to the partner NIC in its own network namespace. Judged
against the modelled line rate (the speed the link negotiated), never against
a fixed number; every figure is recorded with the accelerator that ran, in
host time (the guest clock's rate over each run is measured and recorded).
TCP runs with timestamps off and is counted at the receiver without its
first two seconds of ramp-up, as bench/guest-throughput.py measures the line
rate (Farm.tcp_goodput): the link's steady goodput, comparable with 1460/1538
of the line. The receiver's byte count is checked against the emulator's own
count of the frames it carried (host side): a guest claiming more than the
wire carried FAILs, whatever its iperf3 says. The per-second samples the
verdict compares with the base's are the emulator's count too, of new TCP
payload (retransmissions not counted again), read second by second on its
clock (Farm.tcp_goodput, wire_rates): the receiver's own intervals jitter
with the guest's scheduling (79-101 Mbit/s a second on a 95 Mbit/s wire)
where the wire's seconds agree to 0.01 %. Without an emulator (a forwarded
adapter) they are the receiver's intervals. The payload the partner sends
again toward the DUT is counted on the wire too: the wire loses nothing, so
beyond what the emulator dropped itself, it was lost in the DUT."""

from __future__ import annotations

import pytest
from phyfarm_farm.errors import CheckFailed
from phyfarm_farm.farm import TCP_GOODPUT_RATIO, lost_after_the_wire

SECONDS = 8
#: Below this share of the modelled TCP goodput the link is broken (stalls,
#: retransmission storms), whatever the accelerator and the host's load: one
#: TCG vCPU both sends and receives here, so a loaded host can take a healthy
#: link far below the line (a quiet one reaches 0.99).
FLOOR = 0.10
#: Above the modelled maximum (plus measurement slack) the pacing or the
#: reported speed is wrong.
CEILING = 1.03
#: Seconds of TCP ramp-up left out: under TCG a paced 100 Mbit/s flow
#: settles in about 2 s (in the first, samples of 80-90 Mbit/s are usual).
SKIP = 2.0
#: UDP is offered at this share of the line rate.
UDP_SHARE = 0.5
#: The receiver's bytes may exceed the frames the emulator counted by this
#: much before the guest's figure is called impossible (iperf3's control
#: exchange and the counters' read around the run).
WIRE_SLACK_BYTES = 64 * 1024
#: Loss above this is a broken path; below it, loss on a one-vCPU TCG guest is
#: the receiver falling behind, recorded, not judged.
UDP_MAX_LOSS = 50.0  # percent


def mbps(bits_per_second: float) -> float:
    return bits_per_second / 1e6


def interval_rates(d: dict, clock: float) -> list[float]:
    """iperf3's per-second rates (Mbit/s, in host time) without the first,
    slow-start second: the samples the verdict compares with the base's."""
    rates = [mbps(i["sum"]["bits_per_second"]) * clock for i in d.get("intervals", [])]
    return rates[1:] if len(rates) > 2 else rates


@pytest.mark.check("farm.throughput")
def test_throughput(farm, variant, measure):
    farm.start_iperf_server()
    problems = []
    speed = int(farm.link_state()["speed"])
    if farm.emu is not None:
        # The line rate is the wire's, which the emulator negotiated; the
        # guest's word for it must agree.
        wire = farm.emu.phy()["phy"]["speed"]
        if not isinstance(wire, int) or isinstance(wire, bool):
            problems.append(f"the guest reports {speed} Mbit/s, the wire has no link (ax88772-emu)")
        elif wire != speed:
            problems.append(
                f"the guest reports {speed} Mbit/s, the wire runs at {wire} Mbit/s (ax88772-emu)"
            )
            speed = wire
    line = float(speed)
    tcp_max = line * TCP_GOODPUT_RATIO
    measure("line_rate", line, "Mbit/s")

    farm.set_tcp_timestamps(False)
    for name, reverse in (("tcp_tx", False), ("tcp_rx", True)):
        # Rates in host time: the wire is paced by the host's clock.
        g = farm.tcp_goodput(seconds=SECONDS, reverse=reverse, skip=SKIP)
        rate = g.mbps
        measure(name, rate, "Mbit/s", samples=g.samples)
        measure(f"{name}_guest_clock_rate", g.clock, "ratio")
        measure(f"{name}_ratio_to_line", rate / tcp_max, "ratio")
        if g.retransmits is not None:
            measure(f"{name}_retransmits", g.retransmits, "segments")
        if g.wire_bytes is not None:
            # Host-side ground truth: the emulator's count of the frames it
            # carried. TCP payload is less than the frames that carry it,
            # so a receiver claiming more than the wire carried is a guest
            # whose figures cannot be true.
            measure(f"{name}_wire_bytes", g.wire_bytes, "bytes")
            if g.claimed_bytes > g.wire_bytes + WIRE_SLACK_BYTES:
                problems.append(
                    f"{name}: the guest reports {g.claimed_bytes / 1e6:.2f} MB received, "
                    f"the wire carried {g.wire_bytes / 1e6:.2f} MB (ax88772-emu's counters)"
                )
        if g.wire_again_bytes is not None:
            measure(f"{name}_wire_again_bytes", g.wire_again_bytes, "bytes")
        lost = lost_after_the_wire(g)
        if lost is not None:
            problems.append(lost)
        if rate < FLOOR * tcp_max:
            problems.append(
                f"{name} {rate:.1f} Mbit/s is below {FLOOR:.0%} of the {tcp_max:.1f} Mbit/s "
                f"TCP goodput of a {speed} Mbit/s link ({farm.accel})"
            )
        if rate > CEILING * tcp_max:
            problems.append(
                f"{name} {rate:.1f} Mbit/s exceeds what a {speed} Mbit/s link carries "
                f"({tcp_max:.1f} Mbit/s TCP goodput): pacing or speed is wrong"
            )

    offered = line * UDP_SHARE
    d, clock = farm.iperf_host_time("-w", "2M", seconds=SECONDS, udp_rate=f"{offered:.0f}M")
    s = d["end"].get("sum_received") or d["end"]["sum"]
    rate, loss = mbps(s["bits_per_second"]) * clock, float(s.get("lost_percent", 0.0))
    measure("udp", rate, "Mbit/s", samples=interval_rates(d, clock))
    measure("udp_offered", offered, "Mbit/s")
    measure("udp_loss", loss, "%")
    if loss > UDP_MAX_LOSS:
        problems.append(f"UDP at {offered:.0f} Mbit/s lost {loss:.2f}% (> {UDP_MAX_LOSS}%)")
    if problems:
        raise CheckFailed("; ".join(problems) + f"; emulator: {farm.phy_brief()}")
