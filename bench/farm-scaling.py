#!/usr/bin/env python3
"""The farm's real fan-out on this machine: `phyfarm test -n W` against
`-n 1` on the same kernels, in one invocation.

    bench/farm-scaling.sh [--artifacts DIR] [--workers W] [--repeat R] [-k EXPR]
                          [--against one-worker|instant-autoneg]

With `--against instant-autoneg` the reference is the same `-n W` with the
emulated PHY autonegotiating at once (`--autoneg-ms 0`) instead of the
farm's 1.5-3 s: what realistic autonegotiation costs the farm.

Each round runs the farm once with one worker and once with W workers, the
order alternating from round to round so that drift on the host hits both
alike. It prints each run's wall time and summed check time, and two ratios
of medians:

  wall(-n W) / wall(-n 1)            target <= 0.6 for W = 2
  check time(-n W) / check time(-n 1)   how much each check slows down when
                                        W guests share the cores

bench/farm-fanout.py simulates the same from one run's durations; this
measures it. Exit 0 when it ran (a failing check is reported, not hidden),
2 when it could not (no phyfarm binary, no kernels, a farm run that could
not complete): the reason is the last E: line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from phyfarm_farm.guest import cache_dir, phyfarm_binary

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.6


class CannotRun(Exception):
    """The benchmark could not be completed (exit 2)."""


def log(level: str, msg: str) -> None:
    print(f"{level}: {msg}", file=sys.stderr, flush=True)


#: The emulator's instant autonegotiation, the reference of
#: `--against instant-autoneg` (pytest arguments of `phyfarm test`).
INSTANT_AUTONEG = ["--", "--emulator-arg=--autoneg-ms=0", "--emulator-arg=--autoneg-jitter-ms=0"]


def farm_once(args, workers: int, extra: list[str] | None = None) -> dict:
    """One `phyfarm test`: wall time, summed check time, counts."""
    argv = [str(phyfarm_binary()), "test", "--artifacts", str(args.artifacts), "-n", str(workers)]
    if args.keyword:
        argv += ["-k", args.keyword]
    argv += extra or []
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1):
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CannotRun(f"`phyfarm test -n {workers}` exited {p.returncode}: {tail}")
    lines = p.stdout.strip().splitlines()
    folder = Path(lines[-1]) if lines else Path()
    try:
        doc = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError) as e:
        raise CannotRun(f"`phyfarm test -n {workers}` left no results.json: {e}") from e
    tests = [t for t in doc.get("tests", []) if isinstance(t, dict)]
    checks = sum(float(t.get("duration") or 0) for t in tests)
    counts: dict[str, int] = {}
    for t in tests:
        counts[str(t.get("status"))] = counts.get(str(t.get("status")), 0) + 1
    if p.returncode == 1:
        log("W", f"-n {workers}: a check failed ({counts}); see {folder}")
    return {
        "workers": workers,
        "wall": wall,
        "checks": checks,
        "counts": counts,
        "folder": str(folder),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/farm-scaling.py",
        description="The farm's wall time with W workers against one, measured.",
    )
    p.add_argument(
        "--artifacts",
        type=Path,
        default=cache_dir() / "out",
        help="build outputs with <variant>/bzImage [<cache>/out]",
    )
    p.add_argument("--workers", type=int, default=2, help="W [2]")
    p.add_argument("--repeat", type=int, default=1, help="rounds, each -n 1 and -n W [1]")
    p.add_argument("-k", dest="keyword", help="pytest -k selection of checks [all]")
    p.add_argument(
        "--against",
        choices=["one-worker", "instant-autoneg"],
        default="one-worker",
        help="the reference run: -n 1, or -n W with instant autonegotiation [one-worker]",
    )
    a = p.parse_args(argv)
    if a.workers < 2 or a.repeat < 1:
        p.error("--workers must be >= 2 and --repeat >= 1")
    return a


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    log("I", "bench/farm-scaling.py " + " ".join(argv))
    try:
        if not phyfarm_binary().is_file():
            raise CannotRun(f"no phyfarm binary at {phyfarm_binary()} (cargo build -p phyfarm)")
        if not any((args.artifacts / v / "bzImage").is_file() for v in ("rust", "c")):
            raise CannotRun(f"no <variant>/bzImage under {args.artifacts} (make kernel)")
        w = args.workers
        instant = args.against == "instant-autoneg"
        # (label, workers, extra arguments): the reference first.
        ref = ("instant", w, INSTANT_AUTONEG) if instant else ("-n 1", 1, [])
        new = ("1.5-3 s", w, []) if instant else (f"-n {w}", w, [])
        runs: dict[str, list[dict]] = {ref[0]: [], new[0]: []}
        for rnd in range(args.repeat):
            for label, workers, extra in (ref, new) if rnd % 2 == 0 else (new, ref):
                log("I", f"round {rnd + 1}/{args.repeat}: phyfarm test -n {workers} ({label})")
                r = farm_once(args, workers, extra)
                runs[label].append(r)
                log("I", f"  {label}: {r['wall']:.0f} s wall, {r['checks']:.0f} s of checks")
    except CannotRun as e:
        log("E", f"could not run the benchmark: {e}")
        return 2
    one, many = runs[ref[0]], runs[new[0]]
    wall = statistics.median(r["wall"] for r in many) / statistics.median(r["wall"] for r in one)
    checks = statistics.median(r["checks"] for r in many) / statistics.median(
        r["checks"] for r in one
    )
    what = "autonegotiation's cost" if instant else "fan-out"
    print(f"farm {what} on {os.cpu_count()} cores, median of {args.repeat} round(s):")
    print(f"  {'run':<8} {'wall':>8} {'check time':>11}  counts")
    for label, rs in ((ref[0], one), (new[0], many)):
        for r in rs:
            print(f"  {label:<8} {r['wall']:>7.0f}s {r['checks']:>10.0f}s  {r['counts']}")
    if instant:
        print(f"  wall(1.5-3 s) / wall(instant)              {wall:.2f}  (-n {w})")
        print(f"  check time(1.5-3 s) / check time(instant)  {checks:.2f}")
        return 0
    verdict = "met" if wall <= TARGET else "NOT met"
    print(f"  wall(-n {w}) / wall(-n 1)              {wall:.2f}  {verdict} (target <= {TARGET})")
    print(f"  check time(-n {w}) / check time(-n 1)  {checks:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
