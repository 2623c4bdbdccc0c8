"""Unit tests of the farm's measurements: iperf3's steady window, the
receiver's figures against the emulator's wire count, the host partner's
records, the wire's throughput samples and payload sent again. No guest
needed."""

from __future__ import annotations

import json
import time

import pytest
from phyfarm_farm.errors import AgentError


def test_goodput_is_the_receivers_steady_window():
    """Farm.tcp_goodput's arithmetic: intervals starting in the first second
    and a closing partial one are left out, the mean weighs intervals by
    their length, and guest-time rates become host time."""
    from phyfarm_farm.farm import steady_goodput

    def iv(start: float, seconds: float, mbit: float) -> dict:
        b = mbit * 1e6 / 8 * seconds
        return {
            "sum": {"start": start, "seconds": seconds, "bytes": b, "bits_per_second": mbit * 1e6}
        }

    intervals = [iv(0.0, 1.0, 60.0), iv(1.0, 1.0, 90.0), iv(2.0, 2.0, 96.0), iv(4.0, 0.2, 300.0)]
    g = steady_goodput(intervals, clock=0.5)
    assert g.samples == [45.0, 48.0]
    assert g.seconds == 3.0
    assert abs(g.mbps - (90.0 + 2 * 96.0) / 3 * 0.5) < 1e-9
    assert steady_goodput(intervals, clock=1.0, skip=0.0).samples == [60.0, 90.0, 96.0]
    with pytest.raises(AgentError, match="no interval past its first 5s"):
        steady_goodput(intervals, clock=1.0, skip=5.0)


class _WireEmu:
    """An emulator whose counters advance by `per_run` between two reads."""

    def __init__(self, per_run: int) -> None:
        self.reads = 0
        self.per_run = per_run

    def counters(self) -> dict:
        import threading

        # Only the reads around the run advance it (the wire sampler's
        # thread reads what is there).
        if threading.current_thread() is threading.main_thread():
            self.reads += 1
        n = self.per_run * (self.reads // 2)
        # The shape of ax88772-emu's reply (ctl.rs), nested as it is.
        return {"ok": True, "at_us": 0, "counters": {"tx_bytes": n, "rx_bytes": n}}


class _IperfGuest:
    """A guest whose iperf3 receiver says it got `bytes_per_second` for 8 s."""

    def __init__(self, bytes_per_second: float) -> None:
        self.bps = bytes_per_second

    def read(self, path: str) -> str:
        return "100.0 90.0"

    def run(self, argv, timeout=None, **kw):
        from phyfarm_farm.agent import CmdResult

        one = {"seconds": 1.0, "bytes": self.bps, "bits_per_second": self.bps * 8}
        intervals = [{"sum": {"start": float(i), **one}} for i in range(8)]
        doc = {"intervals": intervals, "end": {"sum_sent": {"retransmits": 0}}}
        doc["server_output_json"] = {"intervals": intervals}
        return CmdResult(argv=argv, exit=0, stdout=json.dumps(doc), stderr="", seconds=0.1)


def test_the_receivers_bytes_are_checked_against_the_emulators_wire_count():
    from phyfarm_farm.farm import Farm

    # 11.5 MB a second claimed for 8 s; the wire carried 96 MB (frames
    # with headers): consistent. The same claim over a wire that carried
    # 10 MB is a guest whose figures cannot be true.
    ok = Farm(guest=_IperfGuest(11.5e6), emu=_WireEmu(96_000_000), variant="rust", accel="tcg")
    g = ok.tcp_goodput(seconds=8, reverse=False, skip=2.0)
    assert g.wire_bytes == 96_000_000 and g.claimed_bytes == 92e6
    lying = Farm(guest=_IperfGuest(11.5e6), emu=_WireEmu(10_000_000), variant="rust", accel="tcg")
    g = lying.tcp_goodput(seconds=8, reverse=True, skip=2.0)
    assert g.wire_bytes == 10_000_000 and g.claimed_bytes > g.wire_bytes


class _LoggedHostPartner:
    """A HostPartner whose iperf3 server log already holds `docs` (written
    as iperf3 -s -J writes them) and then a partial one."""

    def __new__(cls, tmp_path, docs):
        from phyfarm_farm.partner import HostPartner

        p = HostPartner(tmp_path)
        log = tmp_path / "partner-iperf3.log"
        log.write_text("".join(json.dumps(d, indent=2) + "\n" for d in docs) + '{\n  "start": {')

        class _Logged:
            name = "iperf3"
            log_path = log

        p.procs.append(_Logged())
        return p


def test_the_host_partners_records_are_its_own_output_whole_documents_only(tmp_path):
    docs = [{"intervals": [1]}, {"intervals": [2]}]
    p = _LoggedHostPartner(tmp_path, docs)
    assert p.records("iperf3") == docs, "the partial third document is not one yet"
    assert p.records("nobody") == []


def test_with_the_host_as_partner_dut_to_partner_is_judged_on_the_hosts_record(
    tmp_path, monkeypatch
):
    """The guest's iperf3 client passes the server's record on
    (--get-server-output); with the host as partner the record read is the
    host server's own output: a guest that forges the copy changes nothing."""
    from phyfarm_farm.farm import Farm

    one = {"seconds": 1.0, "bytes": 1e6, "bits_per_second": 8e6}
    host_doc = {"intervals": [{"sum": {"start": float(i), **one}} for i in range(8)]}
    partner = _LoggedHostPartner(tmp_path, [{"intervals": []}, host_doc])
    # The guest says 11.5 MB a second; the host's server counted 1 MB.
    farm = Farm(
        guest=_IperfGuest(11.5e6),
        emu=None,
        variant="rust",
        accel="tcg",
        link_partner=partner,
    )
    farm.host_server_records = lambda: 1  # the test before this one
    g = farm.tcp_goodput(seconds=8, reverse=False, skip=2.0)
    assert g.claimed_bytes == 8e6, g  # not the 92 MB of the guest's copy
    # No new record from the host: ERROR, never the guest's copy.
    farm.host_server_records = lambda: 2
    import phyfarm_farm.farm as farm_module
    import pytest as _pytest
    from phyfarm_farm.errors import AgentError

    monkeypatch.setattr(farm_module, "HOST_RECORD_WAIT", 0.1)
    with _pytest.raises(AgentError, match="host-side server"):
        farm.tcp_goodput(seconds=8, reverse=False, skip=2.0)


def _flow_reads(rate_bps: float, begin: float, end: float, stall=(0.0, 0.0)):
    """The emulator's byte count read every 0.2 s: iperf3's control bytes at
    0.1 s, a bulk flow of `rate_bps` wire bits a second from `begin` to
    `end` (paused over `stall`), 200 closing bytes at 9.0 s."""
    reads, n, t = [], 0, 0.0
    for i in range(50):
        t1 = i * 0.2
        for a in (x / 100 for x in range(int(t * 100), int(t1 * 100))):
            if begin <= a < end and not stall[0] <= a < stall[1]:
                n += rate_bps / 8 / 100
        if t <= 0.1 < t1 or (i == 0 and t1 >= 0.1):
            n += 300
        if t <= 9.0 < t1:
            n += 200
        reads.append((100.0 + t1, int(n)))
        t = t1
    return reads


def test_the_wire_count_gives_one_steady_sample_a_host_second():
    from phyfarm_farm.farm import wire_rates

    # 95 Mbit/s of payload from 0.5 s to 8.5 s: the flow is taken from the
    # read before its first bulk growth (0.4 s), its first 2 s left out,
    # and it ends at the read before its last bulk one (8.4 s): six whole
    # seconds of 95 Mbit/s each.
    reads = _flow_reads(95e6, 0.5, 8.5)
    got = wire_rates(reads, seconds=8.0, skip=2.0)
    assert len(got) == 6, got
    for x in got:
        assert abs(x - 95.0) < 0.5, got
    # Neither the control bytes nor the closing ones make a flow.
    assert wire_rates([(0.0, 0), (0.2, 300), (0.4, 300), (9.0, 500)], 8.0, 2.0) == []
    # A flow that stops for half a second shows it in that second only.
    stalled = wire_rates(_flow_reads(95e6, 0.5, 8.5, stall=(4.5, 5.0)), 8.0, 2.0)
    low = [x for x in stalled if x < 80]
    assert len(low) in (1, 2) and min(low) < 60, stalled
    # `seconds` bounds the flow: a longer one gives no more samples.
    assert len(wire_rates(_flow_reads(95e6, 0.5, 9.8), seconds=8.0, skip=2.0)) == 6


def test_with_an_emulator_the_throughput_samples_are_the_wires():
    import threading

    from phyfarm_farm.farm import Farm

    class Emu:
        """While iperf3 runs, frames grow 11.875 MB a second (95 Mbit/s) and
        new TCP payload 11.4 MB (91.2 Mbit/s: the rest was retransmitted)."""

        def __init__(self):
            self.running = threading.Event()
            self.t, self.last = 0.0, None

        def counters(self):
            now = time.monotonic()
            if self.running.is_set() and self.last is not None:
                self.t += now - self.last
            self.last = now
            frames, new = int(self.t * 11.875e6), int(self.t * 11.4e6)
            c = {"tx_bytes": frames, "rx_bytes": frames}
            c |= {"tx_tcp_new_bytes": new, "rx_tcp_new_bytes": new}
            again = int(self.t * 0.2e6)
            c |= {"tx_tcp_again_bytes": again, "rx_tcp_again_bytes": again}
            return {"ok": True, "at_us": int(now * 1e6), "counters": c}

    class SlowIperf(_IperfGuest):
        def read(self, path: str) -> str:
            return f"{time.monotonic():.3f} 0.0"  # the guest's clock runs

        def run(self, argv, timeout=None, **kw):
            if "iperf3" in argv[0]:
                emu.running.set()
                time.sleep(3.6)
                emu.running.clear()
            return super().run(argv, timeout, **kw)

    emu = Emu()
    # The receiver claims 92 Mbit/s; the samples the verdict gets are the
    # emulator's new payload, second by second (91.2), not its frames (95)
    # and not the receiver's intervals. The receiver's record is still read
    # and checked against the frames.
    farm = Farm(guest=SlowIperf(11.5e6), emu=emu, variant="rust", accel="tcg")
    g = farm.tcp_goodput(seconds=8, reverse=False, skip=1.0)
    assert g.sampled == "wire" and 1 <= len(g.samples) <= 3, g.samples
    assert all(abs(x - 91.2) < 1.0 for x in g.samples), g.samples
    assert g.claimed_bytes == 92e6 and g.wire_bytes > 0
    # What the wire carried for the first time and again, counted around
    # the run; the emulator's own RX drops only matter toward the guest.
    assert abs(g.wire_new_bytes - 3.6 * 11.4e6) < 0.3 * 11.4e6, g.wire_new_bytes
    assert abs(g.wire_again_bytes - 3.6 * 0.2e6) < 0.3 * 0.2e6, g.wire_again_bytes
    assert g.wire_dropped_frames is None


def test_payload_sent_again_beyond_the_emulators_own_drops_is_lost_in_the_dut():
    from phyfarm_farm.farm import Goodput, lost_after_the_wire

    def g(new, again, dropped):
        return Goodput(
            mbps=90.0, samples=[], clock=1.0, seconds=8.0, wire_new_bytes=new,
            wire_again_bytes=again, wire_dropped_frames=dropped,
        )  # fmt: skip

    # Nothing sent again, or a trickle: a healthy receiver.
    assert lost_after_the_wire(g(90_000_000, 0, 0)) is None
    assert lost_after_the_wire(g(90_000_000, 400_000, 0)) is None
    # 4.6 % sent again with no drop of the emulator's: lost in the DUT.
    why = lost_after_the_wire(g(89_520_000, 4_100_000, 0))
    assert why and "4.10 MB of the 89.52 MB payload again (4.6%)" in why, why
    assert "lost after the wire" in why
    # The same, explained by frames the emulator dropped itself: not the DUT.
    assert lost_after_the_wire(g(89_520_000, 4_100_000, 3000)) is None
    # Without the counters (no emulator, or DUT -> partner) nothing is said.
    assert lost_after_the_wire(g(90_000_000, 4_100_000, None)) is None
    assert lost_after_the_wire(g(None, None, 0)) is None
