#!/usr/bin/env python3
"""A one-patch revision from `phyfarm run` to its printed verdict, on a warm
cache, with each stage's share of the wall time.

Two runs in one invocation, each into its own run folder and store: the
reference with `--fresh-base` (every base check run again), then the
default (the base's checks reused when their key is unchanged; the base's
throughput is always measured). It prints both, stage by stage, and the
ratio default / reference. Absolute times vary with the host's load; the
ratio is what to compare between machines and commits.

    bench/revision-to-verdict.py [--series DIR] [--phyfarm PATH] [-- RUN ARGS]

Exit 2, with the reason and no ratio, when a run cannot complete (phyfarm
missing, the series missing, a run that exits 2 or prints no verdict).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SERIES = REPO / "patches/selftest/hostile-metadata/v1"

# The stage a progress line starts, by its text (first match wins).
STAGES: list[tuple[str, re.Pattern[str]]] = [
    ("record", re.compile(r"recorded runs ")),
    ("farm", re.compile(r"^I: farm:|farm on the base|throughput lower than|retrying the failed")),
    ("boots", re.compile(r"booting |^I: accelerator:")),
    # The KUnit build runs beside the gates: one stage.
    ("gates + KUnit", re.compile(r"\[rust-kunit\](:| build)|\[gate ")),
    ("patch builds", re.compile(r"\[\d+/\d+ (rust|c)\]")),
    ("apply", re.compile(r"\[series\]|fresh series build tree|\[\d+/\d+\] appl")),
    ("base builds", re.compile(r"^I: series v|^I: \[(rust|c)\]: |the base's KUnit")),
]
ORDER = [
    "base builds",
    "apply",
    "patch builds",
    "gates + KUnit",
    "boots",
    "farm",
    "record",
]
VERDICT = re.compile(r"^\S+/v\d+: (testing|awaiting-review|ready-to-merge|changes-requested)")


def stage_of(line: str) -> str | None:
    for name, pat in STAGES:
        if pat.search(line):
            return name
    return None


def run(phyfarm: Path, series: Path, out: Path, extra: list[str]) -> dict:
    argv = [
        str(phyfarm),
        "--store",
        str(out / "store.sqlite"),
        "run",
        str(series),
        "-o",
        str(out / "run"),
        *extra,
    ]
    print(f"  $ {' '.join(argv)}", flush=True)
    shares: dict[str, float] = {}
    stage, mark = "base builds", time.monotonic()
    t0 = mark
    verdict = ""
    log = (out / "run.log").open("w")
    p = subprocess.Popen(
        argv,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert p.stdout is not None
    for line in p.stdout:
        log.write(line)
        now = time.monotonic()
        s = stage_of(line)
        if s is not None and s != stage:
            shares[stage] = shares.get(stage, 0.0) + now - mark
            stage, mark = s, now
        if VERDICT.match(line):
            verdict = line.strip()
    code = p.wait()
    end = time.monotonic()
    shares[stage] = shares.get(stage, 0.0) + end - mark
    log.close()
    return {
        "exit": code,
        "seconds": end - t0,
        "shares": shares,
        "verdict": verdict,
        "log": out / "run.log",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", type=Path, default=DEFAULT_SERIES, help="a one-patch revision")
    ap.add_argument("--phyfarm", type=Path, default=REPO / "target/debug/phyfarm")
    ap.add_argument("--out", type=Path, help="where the two runs go [default: a temporary folder]")
    ap.add_argument("run_args", nargs="*", help="passed to both `phyfarm run`s (after --)")
    a = ap.parse_args()
    if not a.phyfarm.is_file():
        print(f"E: no phyfarm at {a.phyfarm}: build it with cargo build", file=sys.stderr)
        return 2
    if not a.series.is_dir():
        print(f"E: no series revision at {a.series}", file=sys.stderr)
        return 2
    root = a.out or Path(tempfile.mkdtemp(prefix="phyfarm-rev2verdict-"))
    shown = a.series.relative_to(REPO) if a.series.is_relative_to(REPO) else a.series
    print(f"revision to verdict: {shown}")
    results = {}
    for name, extra in (("fresh base (reference)", ["--fresh-base"]), ("base reused", [])):
        out = root / ("fresh" if extra else "reused")
        out.mkdir(parents=True, exist_ok=True)
        r = run(a.phyfarm, a.series, out, [*extra, *a.run_args])
        if r["exit"] == 2 or not r["verdict"]:
            print(
                f"E: the {name} run could not complete (exit {r['exit']}); see {r['log']}",
                file=sys.stderr,
            )
            return 2
        results[name] = r
    names = list(results)
    w = 24
    print()
    print(f"  {'':14}" + "".join(f"{n:>{w}}" for n in names))
    print(f"  {'total':14}" + "".join(f"{results[n]['seconds']:>{w - 2}.0f} s" for n in names))
    for st in ORDER:
        cells = []
        for n in names:
            r = results[n]
            sec = r["shares"].get(st, 0.0)
            cells.append(f"{sec:>{w - 10}.0f} s ({sec / r['seconds']:>4.0%})")
        print(f"  {st:14}" + "".join(cells))
    for n in names:
        print(f"  {n}: exit {results[n]['exit']}, {results[n]['verdict']}")
    ratio = results[names[1]]["seconds"] / results[names[0]]["seconds"]
    print(f"\n  ratio base reused / fresh base  {ratio:.2f}")
    print(f"  runs and logs: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
