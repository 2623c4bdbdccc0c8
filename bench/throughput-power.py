"""The throughput call's power and false alarms, measured on this host.

The farm must catch a 5 % throughput loss. This benchmark measures what the
verdict's call can do with the noise of real guests here, on a link that is
really slower, not on scaled numbers:

1. rounds: the farm's throughput check (`phyfarm test -k throughput`) runs
   on the same kernels (the base of a `phyfarm run` folder, --variant rust by
   default) --rounds times with the emulator as shipped and --rounds times
   with `ax88772-emu --pace-percent 95` (a wire 5 % slower, --slow-percent),
   interleaved (normal, slow, normal, slow, ...) as `phyfarm run` interleaves
   its confirmation rounds; every round gives the check's per-second TCP
   samples (tcp_tx, tcp_rx: the emulator's count of new TCP payload on the
   wire, second by second);
2. trials: each trial gives each side --per-side rounds (default 2, what
   `phyfarm run` calls on after its interleaved confirmation), and phyfarm
   itself judges them (`store import`, then `verdict --json`: the verdict's
   own rule, not a copy of it). Normal against slow rounds is a 5 % loss:
   every call that is not "regression" is a miss. Normal against other
   normal rounds (and slow against other slow ones) is base against base:
   every regression called there is a false alarm.

It prints the noise (per-round spread and the spread of round medians), the
largest difference of medians between two rounds of one link (the margin
behind the false alarms), the samples a side each call had, the power the
verdict itself reported for a 5 % loss with them, and the detected fraction
against the false alarms of the same invocation. Targets: detected >= 0.90
over >= 20 trials, false alarms <= 0.01. Trials share rounds, so they are
not independent: the round count says how much real evidence is behind them.

Nothing is asserted. Exit status: 0 the benchmark ran, 2 it could not run
(the reason is the last E: line). Progress goes to stderr as I:/E: lines.

    python3 bench/throughput-power.py [--run DIR] [--rounds 5] [--slow-percent 95]
                                      [--trials 40] [--seed N]
    python3 bench/throughput-power.py --from DIR   # reuse the rounds of DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
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


def emulator() -> Path:
    env = os.environ.get("PHYFARM_EMULATOR_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release/ax88772-emu"


def measure(artifacts: Path, rounds: int, slow: int, variant: str, into: Path) -> list[Path]:
    """Interleaved rounds, normal then slow: into/normal-I, into/slow-I."""
    emu = emulator()
    if not emu.is_file():
        die(f"no emulator at {emu}: cargo build --release -p ax88772 (or set PHYFARM_EMULATOR_BIN)")
    wrapper = into / "ax88772-emu-slow"
    # The slower wire is the shipped emulator with one more option; the
    # paths are quoted for sh.
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(str(emu))} --pace-percent {int(slow)} "$@"\n')
    wrapper.chmod(0o755)
    dirs = []
    for i in range(rounds):
        for kind, binary in (("normal", emu), ("slow", wrapper)):
            out = into / f"{kind}-{i}"
            info(f"round {i + 1}/{rounds} ({kind}): phyfarm test -k throughput on {artifacts}")
            r = subprocess.run(
                [
                    phyfarm(),
                    "test",
                    "--artifacts",
                    str(artifacts),
                    "-o",
                    str(out),
                    "-k",
                    "throughput",
                    "--variant",
                    variant,
                    "--emulator",
                    str(binary),
                ],
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


def pooled(rounds: list[dict]) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for r in rounds:
        for k, v in r.items():
            out.setdefault(k, []).extend(v)
    return out


def calls(base: dict, rev: dict, tmp: Path, n: int) -> dict[tuple[str, str], dict]:
    """The verdict's call for each (variant, rate): phyfarm judges."""
    ms = lambda s: [  # noqa: E731
        {
            "name": f"farm.throughput.{rate}",
            "variant": var,
            "value": statistics.mean(v),
            "unit": "Mbit/s",
            "samples": list(v),
        }
        for (var, rate), v in s.items()
    ]
    store = tmp / f"t{n}.sqlite"
    for name, doc in (
        ("base", run_doc(f"b{n}", False, ms(base))),
        ("rev", run_doc(f"r{n}", True, ms(rev))),
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
        (m["variant"], m["name"].rsplit(".", 1)[1]): m
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
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each link (>= 3)")
    ap.add_argument(
        "--slow-percent", type=int, default=95, help="the slower wire's share of the line rate"
    )
    ap.add_argument("--per-side", type=int, default=2, help="rounds a side in each trial")
    ap.add_argument("--trials", type=int, default=40, help="trials of each kind, at most")
    ap.add_argument("--seed", type=int, help="the seed of the trials' draw")
    ap.add_argument("--variant", default="rust", choices=("rust", "c"))
    ap.add_argument("--from", dest="reuse", type=Path, help="a folder of this benchmark's rounds")
    a = ap.parse_args()
    if not Path(phyfarm()).is_file():
        die(f"no phyfarm binary at {phyfarm()}: cargo build first (or set PHYFARM_BIN)")
    if not 1 <= a.slow_percent < 100:
        die("--slow-percent must be between 1 and 99")
    if a.per_side < 1:
        die("--per-side must be at least 1")
    if a.trials < 1:
        die("--trials must be at least 1")
    if a.reuse:
        into = a.reuse
    else:
        if a.rounds < 2 * a.per_side - 1 or a.rounds < 3:
            die("--rounds must be at least 3 and at least 2 x --per-side - 1")
        base = a.run / "base"
        if not (base / a.variant / "bzImage").is_file():
            die(f"no base kernels in {base}: run `make run` first, or give --run")
        into = Path(tempfile.mkdtemp(prefix="phyfarm-power-"))
        info(f"rounds go to {into} (reuse them with --from)")
        measure(base, a.rounds, a.slow_percent, a.variant, into)
    kinds = {}
    for kind in ("normal", "slow"):
        ds = sorted(into.glob(f"{kind}-*"), key=lambda d: int(d.name.rsplit("-", 1)[1]))
        kinds[kind] = [r for r in (samples_of(d / "results.json") for d in ds) if r]
    normal, slow = kinds["normal"], kinds["slow"]
    if min(len(normal), len(slow)) < a.per_side or len(normal) < 2 * a.per_side:
        die(f"too few rounds in {into}: {len(normal)} normal, {len(slow)} slow")
    keys = sorted(set.intersection(*(set(r) for r in normal + slow)))
    print(f"{len(normal)} normal and {len(slow)} slow rounds ({a.slow_percent} % of the line)")
    print(
        f"{'rate':16} {'link':7} {'samples/round':>13} {'within-round CV':>16} "
        f"{'round medians CV':>17} {'median':>8}"
    )
    for k in keys:
        for kind, rounds in (("normal", normal), ("slow", slow)):
            within = [statistics.pstdev(r[k]) / statistics.mean(r[k]) for r in rounds]
            medians = [statistics.median(r[k]) for r in rounds]
            between = statistics.pstdev(medians) / statistics.mean(medians)
            n = statistics.median(len(r[k]) for r in rounds)
            print(
                f"{k[0] + ' ' + k[1]:16} {kind:7} {n:>13.0f} {statistics.mean(within):>15.2%} "
                f"{between:>16.2%} {statistics.median(medians):>8.2f}"
            )
    # The margin behind the false-alarm figure: the largest difference of
    # medians between two rounds of the same link, against the 2.5 % the
    # verdict needs before it calls a regression.
    worst = max(
        abs(statistics.median(x[k]) / statistics.median(y[k]) - 1)
        for k in keys
        for rs in (normal, slow)
        for x, y in itertools.combinations(rs, 2)
    )
    print(
        f"largest difference of medians between two rounds of one link: {worst:.2%} "
        "(a regression is called from 2.5 %)"
    )
    subsets = lambda rs: list(itertools.combinations(range(len(rs)), a.per_side))  # noqa: E731
    slow_trials = [(normal, b, slow, s) for b in subsets(normal) for s in subsets(slow)]
    null_trials = [
        (rs, b, rs, c)
        for rs in (normal, slow)
        for b in subsets(rs)
        for c in subsets(rs)
        if not set(b) & set(c)
    ]
    # Every pairing is a trial; judging one takes phyfarm a second or so,
    # so at most --trials of each kind are drawn (seeded, printed).
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    slow_trials = rng.sample(slow_trials, min(a.trials, len(slow_trials)))
    null_trials = rng.sample(null_trials, min(a.trials, len(null_trials)))
    print(f"trial seed {seed} (--seed replays the draw)")
    detected = alarms = 0
    caught = alarmed = 0
    seen: list[int] = []
    powers: list[float] = []
    judged_slow = judged_null = 0
    with tempfile.TemporaryDirectory(prefix="phyfarm-power-") as t:
        tmp = Path(t)
        n = 0
        for trials, is_slow in ((slow_trials, True), (null_trials, False)):
            for bs, b, rs, r in trials:
                n += 1
                got = calls(pooled([bs[i] for i in b]), pooled([rs[i] for i in r]), tmp, n)
                called = any(got.get(k, {}).get("movement") == "regression" for k in keys)
                if is_slow:
                    caught += called
                else:
                    alarmed += called
                for k in keys:
                    m = got.get(k, {})
                    regression = m.get("movement") == "regression"
                    seen.append(min(m.get("samples", 0), m.get("base_samples", 0)))
                    if is_slow:
                        judged_slow += 1
                        detected += regression
                        if m.get("power") is not None:
                            powers.append(float(m["power"]))
                    else:
                        judged_null += 1
                        alarms += regression
    print(
        f"trials: {len(slow_trials)} with a {100 - a.slow_percent} % slower link and "
        f"{len(null_trials)} base against base ({a.per_side} rounds a side; {len(keys)} rates, "
        f"{judged_slow} and {judged_null} calls)"
    )
    print(
        f"samples a side per call: {statistics.median(seen):.0f} "
        "(the verdict's MISS limit: 5; per-second samples of the rounds, pooled)"
    )
    if powers:
        print(
            f"power the verdict reported for a 5 % loss (bootstrap on the base's samples): "
            f"median {statistics.median(powers):.2f}"
        )
    print(
        f"detected, {100 - a.slow_percent} % slower link, per rate: {detected / judged_slow:.2f}  "
        "(target >= 0.90)"
    )
    print(
        f"false alarms, base against base, per rate:  {alarms / judged_null:.2f}  (target <= 0.01)"
    )
    print(
        f"per trial (the verdict calls any rate): detected {caught / len(slow_trials):.2f} "
        f"of {len(slow_trials)}, false alarms {alarmed / len(null_trials):.2f} "
        f"of {len(null_trials)}"
    )


if __name__ == "__main__":
    main()
