"""A guest with its adapter (emulated or forwarded) and its link partner,
set up for the checks: the AX88772A interface ("dut") at DUT_IP, the
partner at PARTNER_IP, on the host side of the emulator's wire or, where
that cannot run, a virtio NIC of the guest (partner.py)."""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
import time
from dataclasses import dataclass, field

from .emulator import Emulator
from .errors import AgentError, CheckFailed, HarnessError
from .exporter import Exporter
from .guest import Guest
from .partner import DUT_IP, IP, NETNS, PARTNER_IP, GuestPartner, HostPartner

__all__ = ["DUT_IP", "IP", "NETNS", "PARTNER_IP", "Farm"]

ETHTOOL = "/usr/sbin/ethtool"
IPERF3 = "/usr/bin/iperf3"
#: Longest wait for the host-side iperf3 server's record after the client
#: returned (it is printed when the server closes the test).
HOST_RECORD_WAIT = 5.0
#: A 1500-byte frame on 100BASE-TX takes 1538 byte times (14 header, 4 FCS,
#: 8 preamble, 12 inter-frame gap).
WIRE_BYTES = 1500 + 14 + 4 + 8 + 12


def tcp_goodput_ratio(timestamps: bool) -> float:
    """TCP goodput as a share of the line rate with 1500-byte frames: the MSS
    (less 12 bytes of options with timestamps) over a frame's wire time."""
    return (1500 - 20 - 20 - (12 if timestamps else 0)) / WIRE_BYTES


#: The goodput the throughput check judges against: it runs with TCP
#: timestamps off (1460/1538, 94.9 Mbit/s on a 100 Mbit/s link).
TCP_GOODPUT_RATIO = tcp_goodput_ratio(timestamps=False)


#: A read of the wire count that grew by less than this is not yet (or no
#: longer) the bulk flow: iperf3's control messages are a few hundred bytes.
BULK_BYTES = 64 * 1024


def wire_rates(reads: list[tuple[float, int]], seconds: float, skip: float) -> list[float]:
    """Per-second goodput samples (Mbit/s, on the emulator's clock) from its
    count of new TCP payload in the data's direction, read every fraction of
    a second while a `seconds`-long bulk flow ran: `reads` are (seconds,
    bytes). The flow starts at the read before the first that grew by
    BULK_BYTES and ends at the read before the last such one (whose interval
    may have gone idle), and at most `seconds` after its start; its first
    `skip` seconds (slow start) are left out, and each whole second after
    that is one sample, the bytes between its two ends (interpolated between
    reads)."""
    grew = [i for i in range(1, len(reads)) if reads[i][1] - reads[i - 1][1] >= BULK_BYTES]
    if not grew:
        return []
    # The last bulk read's interval may have gone idle before its end.
    start, end = reads[grew[0] - 1][0], reads[grew[-1] - 1][0]
    end = min(end, start + seconds)

    def count(t: float) -> float:
        for (t0, c0), (t1, c1) in zip(reads, reads[1:], strict=False):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return float(reads[-1][1])

    out = []
    t = start + skip
    while t + 1.0 <= end + 1e-9:
        out.append((count(t + 1.0) - count(t)) * 8 / 1e6)
        t += 1.0
    return out


def wire_count(reply: dict, key: str) -> int | None:
    """One byte counter of the emulator's `counters` reply, which nests them:
    {"ok": true, "at_us": ..., "counters": {"tx_bytes": ...}}; None if absent."""
    c = reply.get("counters")
    n = c.get(key) if isinstance(c, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


#: partner -> DUT: the share of the payload the partner may send again
#: (beyond one segment per frame the emulator dropped itself) before the
#: DUT is said to lose frames after the wire. A healthy DUT on the lossless
#: emulated wire retransmits nothing; a driver that drops RX frames costs
#: the sender percents (2.8-4.6 % for one that drops every frame a bulk-in
#: transfer cuts, patches/selftest/rx-split-dropped).
AGAIN_MAX_SHARE = 0.005
#: A retransmitted segment's payload at most (an Ethernet frame's).
MAX_SEGMENT_BYTES = 1500


def lost_after_the_wire(g: Goodput) -> str | None:
    """partner -> DUT: the wire loses nothing, so what the partner had to
    send again, beyond one segment for each frame the emulator dropped
    itself, was lost in the DUT (its USB driver's RX path, the stack).
    Counted on the host: the guest's word plays no part."""
    if g.wire_dropped_frames is None or not g.wire_new_bytes or g.wire_again_bytes is None:
        return None
    lost = g.wire_again_bytes - MAX_SEGMENT_BYTES * g.wire_dropped_frames
    if lost <= AGAIN_MAX_SHARE * g.wire_new_bytes:
        return None
    return (
        f"tcp_rx: the partner sent {g.wire_again_bytes / 1e6:.2f} MB of the "
        f"{g.wire_new_bytes / 1e6:.2f} MB payload again "
        f"({g.wire_again_bytes / g.wire_new_bytes:.1%}), and ax88772-emu dropped "
        f"{g.wire_dropped_frames} frames itself: frames were lost after the wire, in the "
        "DUT's receive path (ax88772-emu's counters)"
    )


def wire_delta(before: dict, after: dict, key: str) -> int | None:
    """How much one counter moved between two `counters` replies (None if
    either lacks it)."""
    a, b = wire_count(before, key), wire_count(after, key)
    return b - a if a is not None and b is not None else None


class WireSampler:
    """Reads one of the emulator's byte counters every `period` host seconds
    in a thread while the `with` block runs: the trusted side's own record
    of a flow, second by second (see wire_rates). A read that fails ends the
    sampling; what was read is kept."""

    def __init__(self, emu: Emulator, key: str, period: float = 0.2) -> None:
        self.emu, self.key, self.period = emu, key, period
        self.reads: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wire-sampler", daemon=True)

    def _read(self) -> bool:
        try:
            reply = self.emu.counters()
        except HarnessError:
            return False
        n, at = wire_count(reply, self.key), reply.get("at_us")
        if n is None:
            return False
        # The emulator's own time of the read (a reply delayed on a loaded
        # host then costs nothing); a reply without it ends the sampling.
        if not isinstance(at, int) or isinstance(at, bool):
            return False
        t = at / 1e6
        if self.reads and t < self.reads[-1][0]:
            return False
        self.reads.append((t, n))
        return True

    def _run(self) -> None:
        while self._read() and not self._stop.wait(self.period):
            pass

    def __enter__(self) -> WireSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self._read()


@dataclass
class Goodput:
    """A TCP run's goodput in Mbit/s, host time: the mean over the steady
    window, its per-interval samples, and the guest clock's rate."""

    mbps: float
    samples: list[float]
    clock: float
    seconds: float
    #: The sender's retransmitted segments over the whole run, if reported.
    retransmits: int | None = None
    #: Bytes the receiver says it received over the whole run.
    claimed_bytes: float = 0.0
    #: Bytes of Ethernet frames the emulator carried in the data's direction
    #: over the run, counted on the host (None without the emulator).
    wire_bytes: int | None = None
    #: Where the samples were counted: "wire" (the emulator's byte count,
    #: host side, see wire_rates) or "receiver" (iperf3's intervals).
    sampled: str = "receiver"
    #: TCP payload the emulator carried for the first time, and again
    #: (retransmitted), over the run in the data's direction; frames the
    #: emulator itself dropped on their way to the guest (None without it).
    wire_new_bytes: int | None = None
    wire_again_bytes: int | None = None
    wire_dropped_frames: int | None = None


#: The emulator's counters of frames it dropped on their way to the guest
#: (a full FIFO, a closed RX gate, no link, an impairment, a bad FCS, ...):
#: each may cost the sender one retransmission that is not the guest's doing.
RX_DROP_COUNTERS = (
    "rx_dropped_no_link",
    "rx_dropped_gated",
    "rx_overflow",
    "rx_overflow_tfc_off",
    "rx_too_big_for_request",
    "impair_dropped",
    "rx_crc_errors",
    "isolated_dropped",
    "duplex_collision_drops",
)


def steady_goodput(intervals: list[dict], clock: float, skip: float = 1.0) -> Goodput:
    """Receiver-side iperf3 intervals -> Goodput: intervals starting before
    `skip` seconds and a closing one shorter than half a second are left
    out; the mean weighs each interval by its length. `clock` (guest seconds
    per host second) turns guest-time rates into host time."""
    kept = []
    for i in intervals:
        s = i["sum"]
        if s.get("omitted") or float(s["start"]) < skip - 0.05 or float(s["seconds"]) < 0.5:
            continue
        kept.append(s)
    if not kept:
        raise AgentError(f"iperf3 ran no interval past its first {skip:g}s")
    total_bytes = sum(float(s["bytes"]) for s in kept)
    total_seconds = sum(float(s["seconds"]) for s in kept)
    samples = [float(s["bits_per_second"]) / 1e6 * clock for s in kept]
    return Goodput(total_bytes * 8 / total_seconds / 1e6 * clock, samples, clock, total_seconds)


@dataclass
class Farm:
    guest: Guest
    emu: Emulator | None
    variant: str
    accel: str
    #: The kernel driver the DUT interface binds to (cdc_ether for QEMU's usb-net).
    dut_driver: str = "asix"
    dut: str = ""
    #: The guest's partner NIC when the partner is the guest's (GuestPartner).
    partner_nic: str = ""
    notes: dict = field(default_factory=dict)
    #: The exporter guest on the forwarded-gadget path, else None.
    exporter: Exporter | None = None
    #: The far end of the wire: the host's (HostPartner) or the guest's.
    link_partner: HostPartner | GuestPartner | None = None

    def __post_init__(self) -> None:
        if self.link_partner is None:
            self.link_partner = GuestPartner(self.guest)

    @property
    def partner_in_guest(self) -> bool:
        return isinstance(self.link_partner, GuestPartner)

    # -- set-up --------------------------------------------------------------
    def find_interfaces(self, timeout: float = 30.0) -> None:
        """Wait for the DUT interface to register; find the guest's partner
        NIC when the partner is the guest's."""
        # The drivers' own sysfs folders name their interfaces: globs and
        # shell builtins only, so that polling starts no program (each one
        # costs tens of milliseconds of the guest's only CPU under TCG, the
        # CPU the adapter's enumeration needs).
        # The partner NIC is waited for only when the partner is the guest's.
        found = '[ -n "$dut" ] && [ -n "$partner" ]' if self.partner_in_guest else '[ -n "$dut" ]'
        script = f"""
read up _ </proc/uptime; end=$(( ${{up%%.*}} + {int(timeout)} ))
while :; do
  dut=; partner=
  for n in /sys/bus/usb/drivers/{self.dut_driver}/*/net/*; do [ -e "$n" ] && dut=${{n##*/}}; done
  for n in /sys/bus/virtio/drivers/virtio_net/*/net/*; do [ -e "$n" ] && partner=${{n##*/}}; done
  {found} && break
  read up _ </proc/uptime; [ "${{up%%.*}}" -ge "$end" ] && break
  usleep 20000
done
echo "dut=$dut partner=$partner"
"""
        r = self.guest.sh(script, timeout=timeout + 10)
        kv = dict(x.split("=", 1) for x in r.stdout.split())
        self.dut, self.partner_nic = kv.get("dut", ""), kv.get("partner", "")
        if self.partner_in_guest and not self.partner_nic:
            raise HarnessError(f"the guest has no virtio partner NIC: {r.describe()}")
        if not self.dut:
            usb = self.guest.sh(
                "cat /sys/bus/usb/devices/*/idVendor /sys/bus/usb/devices/*/idProduct"
            )
            raise CheckFailed(
                f"no network interface bound to {self.dut_driver} within {timeout:.0f}s "
                f"(USB ids seen: {usb.stdout.split()}); console: {self.guest.console}"
            )

    def setup_network(self, carrier_timeout: float = 20.0) -> float:
        """Partner into its netns (the guest's), addresses, links up;
        returns seconds to carrier."""
        p, d = self.partner_nic, self.dut
        # Three `ip -batch` runs instead of one `ip` per step: every program
        # a TCG guest starts costs tens of milliseconds, and this runs before
        # every check. The DUT comes up last, when the script ends.
        guest_partner = f"""{IP} -batch - <<'END'
netns add {NETNS}
link set {p} netns {NETNS}
END
{IP} -n {NETNS} -batch - <<'END'
link set lo up
addr add {PARTNER_IP}/24 dev {p}
link set {p} up
END
"""
        script = f"""set -e
{guest_partner if self.partner_in_guest else ""}{IP} -batch - <<'END'
addr add {DUT_IP}/24 dev {d}
link set {d} up
END
"""
        r = self.guest.sh(script, timeout=30)
        if r.exit != 0:
            raise HarnessError(f"network set-up failed: {r.describe()}")
        t = time.monotonic()
        w = self.wait_carrier(True, carrier_timeout)
        if w["exit"] != 0:
            raise CheckFailed(
                f"{d}: no carrier within {carrier_timeout:.0f}s of ifup "
                f"(emulator PHY: {self.phy_brief()})"
            )
        return time.monotonic() - t

    def start_iperf_server(self) -> None:
        # Room for UDP bursts on a one-CPU guest that both sends and receives.
        self.guest.run(
            ["sysctl", "-w", "net.core.rmem_max=4194304", "net.core.wmem_max=4194304"], timeout=10
        )
        # -J: the server's per-second record reaches the client
        # (--get-server-output), the receiver's side of a DUT->partner test.
        assert self.link_partner is not None
        self.link_partner.serve("iperf3", [IPERF3, "-s", "-J", "-B", PARTNER_IP])
        # The server needs a moment to listen.
        for _ in range(50):
            s = self.link_partner.run(["cat", "/proc/net/tcp"], timeout=10)
            if ":1451 " in s.stdout:  # port 5201
                return
            time.sleep(0.1)
        raise HarnessError("iperf3 server never listened on port 5201")

    # -- observation ---------------------------------------------------------
    def sysfs(self, what: str) -> str:
        return f"/sys/class/net/{self.dut}/{what}"

    def wait_carrier(self, up: bool, timeout: float) -> dict:
        return self.guest.wait_files(
            [{"path": self.sysfs("carrier"), "equals": "1" if up else "0"}],
            timeout=timeout,
            read=[self.sysfs("operstate"), self.sysfs("speed"), self.sysfs("duplex")],
        )

    def link_state(self) -> dict:
        names = [
            "carrier",
            "operstate",
            "speed",
            "duplex",
            "carrier_up_count",
            "carrier_down_count",
        ]
        r = self.guest.sh("; ".join(f"echo {n}=$(cat {self.sysfs(n)} 2>/dev/null)" for n in names))
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def ethtool(self, *args: str, timeout: float = 20):
        return self.guest.run([ETHTOOL, *args], timeout=timeout)

    def ethtool_settings(self) -> dict:
        """`ethtool DEV` as a dict of its "Key: value" lines."""
        r = self.ethtool(self.dut)
        out = {}
        for line in r.stdout.splitlines():
            if ":" in line and line.startswith("\t") and not line.startswith("\t\t"):
                k, v = line.strip().split(":", 1)
                out[k.strip()] = v.strip()
        return out

    def phy_brief(self) -> str:
        if self.emu is None:
            return "n/a (forwarded adapter)"
        try:
            p = self.emu.phy()["phy"]
        except HarnessError as e:
            return f"unavailable ({e})"
        return (
            f"state={p['state']} link={p['link']} speed={p['speed']} full={p['full_duplex']} "
            f"bmcr={p['bmcr']:#06x} bmsr={p['bmsr']:#06x} lpa={p['lpa']:#06x}"
        )

    def ping(self, count: int = 3, timeout: float = 10, interval: float = 0.2) -> tuple[int, int]:
        """(sent, received) from the DUT to the partner."""
        r = self.guest.run(
            [
                "ping",
                "-c",
                str(count),
                "-i",
                str(interval),
                "-W",
                "1",
                "-w",
                str(int(timeout)),
                PARTNER_IP,
            ],
            timeout=timeout + 5,
        )
        sent = recv = 0
        for line in r.stdout.splitlines():
            if "packets transmitted" in line:
                parts = line.split(",")
                sent = int(parts[0].split()[0])
                recv = int(parts[1].split()[0])
        return sent, recv

    def ping_until(self, timeout: float) -> float | None:
        """Seconds until one ping crosses the wire, or None."""
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            _, recv = self.ping(count=1, timeout=1, interval=0.2)
            if recv:
                return time.monotonic() - t
        return None

    def guest_clock(self) -> tuple[float, float]:
        """(host monotonic, guest uptime) at about the same instant."""
        h0 = time.monotonic()
        up = self.guest.read("/proc/uptime")
        h1 = time.monotonic()
        try:
            return (h0 + h1) / 2, float(up.split()[0])
        except (IndexError, ValueError):
            raise AgentError(f"/proc/uptime read {up!r}") from None

    def set_tcp_timestamps(self, on: bool) -> None:
        """TCP timestamps on or off at both ends (the setting is per network
        namespace)."""
        argv = ["sysctl", "-w", f"net.ipv4.tcp_timestamps={int(on)}"]
        self.guest.check(argv)
        assert self.link_partner is not None
        r = self.link_partner.run(argv, timeout=10)
        if r.exit != 0:
            raise HarnessError(f"the partner's TCP timestamps: {r.describe()}")

    def iperf_host_time(
        self, *args: str, seconds: int = 5, reverse: bool = False, udp_rate: str = ""
    ) -> tuple[dict, float]:
        """iperf3, and the guest clock's rate against the host's over the run
        (guest seconds per host second). iperf3 times itself with the guest's
        clock, which under TCG on a loaded host can lose ticks (seen: 5 guest
        seconds for 5.8 host seconds); a rate times this factor is in host
        time, the time the modelled wire is paced in."""
        h0, g0 = self.guest_clock()
        data = self.iperf(*args, seconds=seconds, reverse=reverse, udp_rate=udp_rate)
        h1, g1 = self.guest_clock()
        return data, (g1 - g0) / (h1 - h0) if h1 > h0 else 1.0

    def tcp_goodput(self, seconds: int, reverse: bool, skip: float = 1.0) -> Goodput:
        """TCP goodput as the receiver counted it, in host time, over the
        steady part of a `seconds`-long iperf3 run: the first `skip` seconds
        (slow start) and a closing partial second are left out. The receiver
        is the partner's server for DUT->partner (its record comes back with
        --get-server-output), the DUT for partner->DUT (-R). Neither iperf3's
        -O (the sender's backlog at the end of the omitted time then counts
        as received) nor a sender-side figure (bytes in the socket buffer,
        not on the wire) is used. With an emulator the per-second samples
        are its count of new TCP payload on the wire (WireSampler,
        wire_rates), the mean stays the receiver's;
        without one they are the receiver's intervals."""
        # The host's own count of what crossed the wire, around the run: the
        # guest's figures are checked against it (a kernel can say anything).
        # The samples the verdict judges are the emulator's count of new TCP
        # payload (retransmissions not counted again), read second by second
        # on its clock: where the receiver's intervals jitter with the
        # guest's scheduling (seen: 79-101 Mbit/s a second on a 95 Mbit/s
        # wire), the wire's seconds agree to 0.01 %.
        key = "rx_bytes" if reverse else "tx_bytes"
        new = "rx_tcp_new_bytes" if reverse else "tx_tcp_new_bytes"
        again = "rx_tcp_again_bytes" if reverse else "tx_tcp_again_bytes"
        counted = (key, new, again, *RX_DROP_COUNTERS)
        c0 = self.emu.counters() if self.emu is not None else {}
        known = self.host_server_records()
        sampler = WireSampler(self.emu, new) if self.emu is not None else None
        with sampler or contextlib.nullcontext():
            d, clock = self.iperf_host_time("--get-server-output", seconds=seconds, reverse=reverse)
        c1 = self.emu.counters() if self.emu is not None else {}
        moved = {k: wire_delta(c0, c1, k) for k in counted}
        side = d if reverse else d.get("server_output_json")
        if not reverse and not self.partner_in_guest:
            # The receiver is the host's iperf3: its own record, from its own
            # output, never the copy the guest's client passes on.
            side = self.host_server_record(known)
        if not isinstance(side, dict) or not side.get("intervals"):
            raise AgentError(
                "iperf3 returned no receiver record"
                + (
                    ""
                    if reverse
                    else " (the host-side server's output)"
                    if not self.partner_in_guest
                    else " (the server's, --get-server-output)"
                )
            )
        g = steady_goodput(side["intervals"], clock, skip)
        g.retransmits = d["end"].get("sum_sent", {}).get("retransmits")
        g.claimed_bytes = sum(float(i["sum"]["bytes"]) for i in side["intervals"])
        g.wire_bytes, g.wire_new_bytes, g.wire_again_bytes = moved[key], moved[new], moved[again]
        drops = [moved[k] for k in RX_DROP_COUNTERS]
        if reverse and None not in drops:
            g.wire_dropped_frames = sum(drops)
        # Bounded by `seconds` of host time: nothing the guest says about
        # its clock changes which of the wire's seconds are samples.
        wire = wire_rates(sampler.reads, seconds, skip) if sampler else []
        if wire:
            g.samples, g.sampled = wire, "wire"
        return g

    def host_server_records(self) -> int:
        """How many tests the host-side iperf3 server has recorded (0 when
        the partner is the guest's)."""
        if isinstance(self.link_partner, HostPartner):
            return len(self.link_partner.records("iperf3"))
        return 0

    def host_server_record(self, known: int) -> dict | None:
        """The host-side iperf3 server's record of the test after the first
        `known` ones (it prints it when the test ends, a moment after the
        client returns)."""
        assert isinstance(self.link_partner, HostPartner)
        end = time.monotonic() + HOST_RECORD_WAIT
        while True:
            docs = self.link_partner.records("iperf3")
            if len(docs) > known:
                return docs[known]
            if time.monotonic() > end:
                return None
            time.sleep(0.1)

    def iperf(
        self, *args: str, seconds: int = 5, reverse: bool = False, udp_rate: str = ""
    ) -> dict:
        argv = [IPERF3, "-c", PARTNER_IP, "-J", "-t", str(seconds), *args]
        if reverse:
            argv.append("-R")
        if udp_rate:
            argv += ["-u", "-b", udp_rate]
        for attempt in range(3):
            r = self.guest.run(argv, timeout=seconds + 30, max_output=8 << 20)
            try:
                data = json.loads(r.stdout)
            except ValueError:
                raise AgentError(f"iperf3 printed no JSON: {r.describe()}") from None
            # The one-test-at-a-time server may still be closing the last test.
            busy = ("server is busy", "control message", "Connection reset")
            if "error" in data and any(b in data["error"] for b in busy) and attempt < 2:
                time.sleep(1.0)
                continue
            break
        if "error" in data:
            raise CheckFailed(
                f"iperf3 {' '.join(shlex.quote(a) for a in argv[1:])}: {data['error']}"
            )
        return data

    def mdio(self) -> tuple[dict, dict]:
        assert self.emu is not None
        p = self.emu.phy()["phy"]
        return p["mdio_reads"], p["mdio_writes"]
