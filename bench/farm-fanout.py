#!/usr/bin/env python3
"""How far the farm's fan-out (`phyfarm test -n N`) scales, simulated from the
per-check durations of a real farm run.

Each check boots its own guest and emulator, so on a runner with at least N
free cores the farm is a scheduling problem: N workers take checks from one
queue. This replays a run's `farm/results.json` durations through two
schedules, pytest-xdist's (checks handed out in collection order to whichever
worker is free) and longest first, for N = 1, 2, 4, 8, 16, and prints each
wall time as a ratio against N = 1 of the same schedule, beside the lower
bound max(longest check, total / N).

    bench/farm-fanout.py [RESULTS.json]

The default is the farm of the last `make run` (<cache>/runs/
rust-phy-enum-check-v8/farm/results.json). The durations were measured with
the run's own worker count on its own machine, so a check that competed for
a core is counted at its slowed-down length: on a larger runner the real
ratios are at least this good. Exit 2, with the reason, when the file is
missing or holds no timed checks.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
from pathlib import Path

WORKERS = (1, 2, 4, 8, 16)


def default_results() -> Path:
    cache = os.environ.get("PHYFARM_CACHE") or str(Path.home() / ".cache" / "phyfarm")
    return Path(cache) / "runs" / "rust-phy-enum-check-v8" / "farm" / "results.json"


def durations(path: Path) -> list[float]:
    """The durations of the run's checks, in the order the run collected them
    (first attempts only; a retry is extra work the schedule cannot plan)."""
    doc = json.loads(path.read_text())
    tests = doc.get("tests")
    if not isinstance(tests, list):
        raise ValueError("no 'tests' list")
    out = [
        float(t["duration"])
        for t in tests
        if isinstance(t, dict)
        and isinstance(t.get("duration"), (int, float))
        and t.get("attempt", 0) == 0
        and t["duration"] > 0
    ]
    if not out:
        raise ValueError("no timed checks")
    return out


def makespan(jobs: list[float], workers: int) -> float:
    """Wall time when each job goes, in order, to the first free worker."""
    free = [0.0] * workers
    for d in jobs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
    return max(free)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 1:
        print("E: at most one RESULTS.json (see --help)", file=sys.stderr)
        return 2
    path = Path(argv[0]) if argv else default_results()
    try:
        jobs = durations(path)
    except FileNotFoundError:
        print(
            f"E: {path}: no farm results (run `make run` first, or name a results.json)",
            file=sys.stderr,
        )
        return 2
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"E: {path}: not a farm results file: {e}", file=sys.stderr)
        return 2
    total = sum(jobs)
    longest = max(jobs)
    print(f"farm fan-out, simulated from {path}")
    print(f"{len(jobs)} timed checks, {total:.0f} s in all, the longest {longest:.1f} s")
    print(f"{'workers':>7} {'xdist order':>16} {'longest first':>16} {'lower bound':>16}")
    base_in_order = makespan(jobs, 1)
    base_lpt = makespan(sorted(jobs, reverse=True), 1)
    for n in WORKERS:
        in_order = makespan(jobs, n)
        lpt = makespan(sorted(jobs, reverse=True), n)
        bound = max(longest, total / n)
        print(
            f"{n:>7} {in_order:7.0f} s ({in_order / base_in_order:4.2f})"
            f" {lpt:7.0f} s ({lpt / base_lpt:4.2f})"
            f" {bound:7.0f} s ({bound / total:4.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
