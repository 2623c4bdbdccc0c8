"""The throughput call's power and false alarms, measured on this host.

The farm must catch a 5 % throughput loss. This benchmark measures what the
verdict's call can do with the noise of real guests here:

1. noise: the farm's throughput check (`phyfarm test -k throughput`) runs
   --rounds times on the same kernels (the base of a `phyfarm run` folder,
   rust and c), each round one guest per variant, as the farm runs it; every
   round gives iperf3's per-second TCP samples (tcp_tx, tcp_rx);
2. trials: for each pair of different rounds (a "base" and a "revision"
   guest, so between-guest drift is in it), the revision's samples are
   scaled to a link 5 % slower (--loss), and the two sides are recorded and
   judged by phyfarm itself (`store import`, then `verdict --json`: the
   verdict's own rule, not a copy of it). The same pairs unscaled are
   base-against-base: every regression called there is a false alarm.

It prints the noise (per-round spread and the spread of round medians), the
sample count a side the verdict needs (its MISS limit) and has, and the
detected fraction against the false alarms of the same invocation. Targets:
detected >= 0.90 over >= 20 trials, false alarms <= 0.01.

Nothing is asserted. Exit status: 0 the benchmark ran, 2 it could not run
(the reason is the last E: line). Progress goes to stderr as I:/E: lines.

    python3 bench/throughput-power.py [--run DIR] [--rounds 6] [--loss 0.05]
    python3 bench/throughput-power.py --from DIR...   # reuse rounds
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATES = ("tcp_tx", "tcp_rx")


def info(msg: str) -> None:
    print(f"I: {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"E: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def cache() -> Path:
    env = os.environ.get("PHYFARM_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "phyfarm"


def phyfarm() -> str:
    return os.environ.get("PHYFARM_BIN", str(REPO / "target/debug/phyfarm"))


def samples_of(results: Path) -> dict[tuple[str, str], list[float]]:
    """(variant, rate) -> per-second Mbit/s samples of one farm run."""
    doc = json.loads(results.read_text())
    out: dict[tuple[str, str], list[float]] = {}
    for t in doc["tests"]:
        if t["id"] != "farm.throughput" or t["status"] != "PASS":
            continue
        for m in t["measurements"]:
            if m["name"] in RATES and len(m.get("samples", [])) > 1:
                out[(t["variant"], m["name"])] = [float(x) for x in m["samples"]]
    return out


def measure(artifacts: Path, rounds: int, into: Path) -> list[Path]:
    dirs = []
    for i in range(rounds):
        out = into / f"round-{i}"
        info(f"round {i + 1}/{rounds}: phyfarm test -k throughput on {artifacts}")
        r = subprocess.run(
            [phyfarm(), "test", "--artifacts", str(artifacts), "-o", str(out), "-k", "throughput"],
            stdout=subprocess.DEVNULL,
            check=False,
        )
        if r.returncode != 0 or not (out / "results.json").is_file():
            die(f"the throughput check did not pass in {out} (exit {r.returncode})")
        dirs.append(out)
    return dirs


def run_doc(rid: str, revision: bool, measurements: list[dict]) -> dict:
    doc = {
        "schema": 1,
        "id": rid,
        "revision": None,
        "base": "linux-source-6.12 bench",
        "environment": {"accelerator": "tcg", "host": "bench", "arch": "x86_64"},
        "started": "2026-01-01T00:00:00Z" if not revision else "2026-01-01T02:00:00Z",
        "finished": "2026-01-01T01:00:00Z" if not revision else "2026-01-01T03:00:00Z",
        "tests": [
            {"path": "farm.throughput", "variant": m["variant"], "status": "PASS"}
            for m in measurements
        ],
        "measurements": measurements,
    }
    if revision:
        doc["revision"] = {
            "series": "bench",
            "version": 1,
            "change_id": None,
            "tree": "net-next",
            "message_id": None,
            "patchset_hash": "0" * 64,
            "patches": [],
        }
    return doc


def calls(base: dict, rev: dict, scale: float, tmp: Path, n: int) -> dict[tuple[str, str], str]:
    """The verdict's movement for each (variant, rate): phyfarm judges."""
    ms = lambda s, k: [  # noqa: E731
        {
            "name": f"farm.throughput.{rate}",
            "variant": var,
            "value": statistics.mean(v) * k,
            "unit": "Mbit/s",
            "samples": [x * k for x in v],
        }
        for (var, rate), v in s.items()
    ]
    store = tmp / f"t{n}.sqlite"
    for name, doc in (
        ("base", run_doc(f"b{n}", False, ms(base, 1.0))),
        ("rev", run_doc(f"r{n}", True, ms(rev, scale))),
    ):
        path = tmp / f"{name}{n}.json"
        path.write_text(json.dumps(doc))
        r = subprocess.run(
            [phyfarm(), "--store", str(store), "store", "import", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            die(f"store import {path}: {r.stderr.strip()}")
    r = subprocess.run(
        [
            phyfarm(),
            "--store",
            str(store),
            "verdict",
            "bench/v1",
            "--json",
            "--now",
            "2026-01-01T04:00:00Z",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        rep = json.loads(r.stdout)
    except json.JSONDecodeError:
        die(f"verdict: {r.stderr.strip()}")
    return {
        (m["variant"], m["name"].rsplit(".", 1)[1]): m["movement"]
        for m in rep["measurements"]
        if m["name"].rsplit(".", 1)[1] in RATES
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--run",
        type=Path,
        default=cache() / "runs/rust-phy-enum-check-v8",
        help="a phyfarm run folder",
    )
    ap.add_argument("--rounds", type=int, default=6, help="throughput runs to measure (>= 2)")
    ap.add_argument("--loss", type=float, default=0.05, help="the seeded loss of the slower link")
    ap.add_argument(
        "--from", dest="reuse", type=Path, nargs="*", help="farm output folders to reuse"
    )
    a = ap.parse_args()
    if not Path(phyfarm()).is_file():
        die(f"no phyfarm binary at {phyfarm()}: cargo build first (or set PHYFARM_BIN)")
    if a.reuse:
        dirs = a.reuse
    else:
        if a.rounds < 2:
            die("--rounds must be at least 2")
        base = a.run / "base"
        if not (base / "rust/bzImage").is_file():
            die(f"no base kernels in {base}: run `make run` first, or give --run")
        dirs = measure(base, a.rounds, Path(tempfile.mkdtemp(prefix="phyfarm-power-")))
    rounds = [samples_of(d / "results.json") for d in dirs]
    rounds = [r for r in rounds if r]
    if len(rounds) < 2:
        die("fewer than two rounds with throughput samples")
    keys = sorted(set.intersection(*(set(r) for r in rounds)))
    print(f"{'rate':16} {'samples/round':>13} {'within-round CV':>16} {'round medians CV':>17}")
    for k in keys:
        within = [statistics.pstdev(r[k]) / statistics.mean(r[k]) for r in rounds]
        medians = [statistics.median(r[k]) for r in rounds]
        between = statistics.pstdev(medians) / statistics.mean(medians)
        n = statistics.median(len(r[k]) for r in rounds)
        print(
            f"{k[0] + ' ' + k[1]:16} {n:>13.0f} {statistics.mean(within):>15.1%} {between:>16.1%}"
        )
    pairs = list(itertools.permutations(range(len(rounds)), 2))
    detected = alarms = judged = 0
    with tempfile.TemporaryDirectory(prefix="phyfarm-power-") as t:
        tmp = Path(t)
        for n, (i, j) in enumerate(pairs):
            slow = calls(rounds[i], rounds[j], 1.0 - a.loss, tmp, 2 * n)
            same = calls(rounds[i], rounds[j], 1.0, tmp, 2 * n + 1)
            for k in keys:
                judged += 1
                detected += slow.get(k) == "regression"
                alarms += same.get(k) == "regression"
    print(f"trials: {judged} ({len(pairs)} ordered pairs of rounds x {len(keys)} rates)")
    print("minimum samples a side for a call: 5 (the verdict's MISS limit)")
    print(f"detected, {a.loss:.0%} slower link: {detected / judged:.2f}  (target >= 0.90)")
    print(f"false alarms, base against base:  {alarms / judged:.2f}  (target <= 0.01)")


if __name__ == "__main__":
    main()
