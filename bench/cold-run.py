#!/usr/bin/env python3
"""`make run` from nothing, stage by stage, against a warm `make run` on the
same machine (the reference), in one invocation.

The cold run starts from a fresh clone of this checkout's commit (no
`target/`), an empty phyfarm cache (no venv, kernel source, build trees,
guest image, accelerator probe or store), an empty podman image store (the
base, kbuild and farm images built again from the Debian mirror), and empty
cargo and pip download caches. Then `make run` runs again in the same clone
and cache: the warm reference, what a maintainer's second run costs. Both are
started as CI and cron start them: stdin from /dev/null, SIGINT ignored.

Not cold: the Debian packages `containers/host-setup.sh` installs are the
host's (removing them would break the machine the bench runs on), and the
Rust toolchain. A fresh machine adds their download and install.

It prints one table: each stage's seconds cold and warm and their ratio.
Only the standard library is used (a cold machine has no venv yet), so run
it with the system's python3:

    python3 bench/cold-run.py [--rev REV] [--workdir DIR] [--keep]
    python3 bench/cold-run.py --table DIR   (the table again, from DIR's logs)

Exit 2, with the reason, when a `make run` fails (its table is still
printed, so the stage it stopped in shows) or an option is wrong.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run_stages():
    """`phyfarm run`'s own stages, as bench/revision-to-verdict.py splits them."""
    spec = importlib.util.spec_from_file_location(
        "rev2verdict", REPO / "bench/revision-to-verdict.py"
    )
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.stage_of


STAGE_OF_RUN = _run_stages()

# `make run`'s recipe lines, as make echoes them: each starts a part.
PARTS: list[tuple[str, re.Pattern[str]]] = [
    ("packages + venv", re.compile(r"^bash containers/phase\.sh setup ")),
    ("cargo build", re.compile(r"^bash containers/phase\.sh cargo-build ")),
    ("images", re.compile(r"^\S*phyfarm images\b")),
    ("v7", re.compile(r"^\S*phyfarm run \S+/v7\b")),
    ("v8", re.compile(r"^\S*phyfarm run \S+/v8\b")),
    ("dashboard", re.compile(r"^\S*phyfarm dashboard export ")),
]
FARM_ON_BASE = re.compile(r"^I: farm: .*/base/farm[^/]*\)$")

ORDER = [
    "packages + venv",
    "cargo build",
    "images",
    "v7: kernel source, base builds",
    "v7: apply, builds",
    "v7: boots, record",
    "v8: base builds",
    "v8: apply, patch builds",
    "v8: gates + KUnit",
    "v8: boots",
    "v8: farm on the base",
    "v8: farm on the revision",
    "v8: record",
    "dashboard",
]


class Splitter:
    """Splits a `make run` log into ORDER's stages: a line that starts a
    stage ends the one before it; other lines belong to the running one."""

    def __init__(self) -> None:
        self.part = "packages + venv"
        self.stage = self.part
        self.mark = 0.0

    def name(self, line: str) -> str:
        for part, pat in PARTS:
            if pat.search(line):
                self.part = part
                return {"v7": "v7: kernel source, base builds", "v8": "v8: base builds"}.get(
                    part, part
                )
        if self.part not in ("v7", "v8"):
            return self.stage
        s = STAGE_OF_RUN(line)
        if s is None or (line.startswith("I: accelerator:") and "farm" in self.stage):
            # A farm's own accelerator line belongs to the farms.
            return self.stage
        if self.part == "v7":
            return {
                "base builds": "v7: kernel source, base builds",
                "apply": "v7: apply, builds",
                "patch builds": "v7: apply, builds",
            }.get(s, "v7: boots, record")
        if s == "farm":
            return (
                "v8: farm on the base" if FARM_ON_BASE.search(line) else "v8: farm on the revision"
            )
        return {
            "base builds": "v8: base builds",
            "apply": "v8: apply, patch builds",
            "patch builds": "v8: apply, patch builds",
            "gates + KUnit": "v8: gates + KUnit",
            "boots": "v8: boots",
            "record": "v8: record",
        }[s]

    def split(self, timed: list[tuple[float, str]], end: float) -> dict[str, float]:
        shares: dict[str, float] = {}
        for t, line in timed:
            s = self.name(line)
            if s != self.stage:
                shares[self.stage] = shares.get(self.stage, 0.0) + t - self.mark
                self.stage, self.mark = s, t
        shares[self.stage] = shares.get(self.stage, 0.0) + end - self.mark
        return shares


class LogError(Exception):
    pass


def read_log(path: Path) -> tuple[list[tuple[float, str]], float, int | None]:
    """A log this bench wrote: `<seconds>\\t<line>`, last `<seconds>\\tEXIT <code>`."""
    timed, end, code = [], 0.0, None
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        t, sep, line = raw.partition("\t")
        try:
            sec = float(t)
        except ValueError:
            raise LogError(f"{path}:{n}: not a line of this bench's log") from None
        if not sep:
            raise LogError(f"{path}:{n}: not a line of this bench's log")
        if line.startswith("EXIT "):
            end, code = sec, int(line[5:])
        else:
            timed.append((sec, line))
    if code is None:
        raise LogError(f"{path}: no EXIT line (the run did not finish)")
    return timed, end, code


def make_run(clone: Path, env: dict[str, str], log: Path, label: str) -> int:
    """`make run` in `clone` as a background script starts it; each line
    written to `log` with its second since the start."""
    print(f"I: {label}: make run in {clone} (log {log})", flush=True)
    t0 = time.monotonic()
    with log.open("w") as out:
        p = subprocess.Popen(
            ["make", "run"],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        assert p.stdout is not None
        try:
            for line in p.stdout:
                out.write(f"{time.monotonic() - t0:.2f}\t{line.rstrip()}\n")
                out.flush()
            code = p.wait()
        except KeyboardInterrupt:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
            raise
        out.write(f"{time.monotonic() - t0:.2f}\tEXIT {code}\n")
    print(f"I: {label}: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
    return code


def table(workdir: Path) -> int:
    rows = {}
    for name in ("cold", "warm"):
        log = workdir / f"{name}.log"
        if log.is_file():
            try:
                timed, end, code = read_log(log)
            except LogError as e:
                print(f"E: {e}", file=sys.stderr)
                return 2
            rows[name] = (Splitter().split(timed, end), end, code)
        elif name == "cold" or rows["cold"][2] == 0:
            print(f"E: {log}: missing (run the bench first)", file=sys.stderr)
            return 2
        else:  # the cold run failed: no reference was run
            rows[name] = ({}, 0.0, None)
    print(f"\ncold make run from nothing, against a warm one on the same cache ({workdir})")
    print(f"  {'stage':32}{'cold':>9}{'warm':>9}{'cold/warm':>11}")
    for st in ORDER:
        c, w = rows["cold"][0].get(st, 0.0), rows["warm"][0].get(st, 0.0)
        ratio = f"{c / w:.1f}" if w >= 1 else "-"
        print(f"  {st:32}{c:>7.0f} s{w:>7.0f} s{ratio:>11}")
    c, w = rows["cold"][1], rows["warm"][1]
    ratio = f"{c / w:.2f}" if w > 0 else "-"
    print(f"  {'total':32}{c:>7.0f} s{w:>7.0f} s{ratio:>11}")
    warm = f"{w / 60:.1f} min, exit {rows['warm'][2]}" if rows["warm"][2] is not None else "not run"
    print(f"  cold: {c / 60:.1f} min, exit {rows['cold'][2]}; warm: {warm}")
    failed = [n for n in rows if rows[n][2] not in (0, None)]
    if failed:
        print(
            f"E: make run failed ({', '.join(failed)}): see {workdir}/<name>.log", file=sys.stderr
        )
        return 2
    return 0


def podman_store(workdir: Path) -> Path:
    conf = workdir / "storage.conf"
    conf.write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{workdir / "containers"}"\n'
        f'runroot = "{workdir / "containers-run"}"\n'
    )
    return conf


def clean(workdir: Path, conf: Path) -> None:
    """Removes what the cold run made, but its logs. The images go through
    podman (their layers may be mounted) with this bench's store named
    explicitly, so the host's own images are never touched."""
    if (workdir / "containers").is_dir():
        subprocess.run(
            [
                "podman",
                "--root",
                str(workdir / "containers"),
                "--runroot",
                str(workdir / "containers-run"),
                "rmi",
                "--all",
                "--force",
            ],
            env={**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)},
            stdout=subprocess.DEVNULL,
            check=False,
        )
    for d in ("clone", "cache", "containers", "containers-run", "cargo-home", "pip-cache"):
        shutil.rmtree(workdir / d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cache = Path(
        os.environ.get("PHYFARM_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phyfarm"
    )
    ap.add_argument("--rev", default="HEAD", help="the commit to clone [default: HEAD]")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=cache.parent / "phyfarm-cold-run",
        help="the cold run's clone, cache, image store and logs [default: %(default)s]",
    )
    ap.add_argument("--keep", action="store_true", help="keep the cold cache and images afterwards")
    ap.add_argument(
        "--table", type=Path, metavar="DIR", help="print the table of DIR's logs, run nothing"
    )
    a = ap.parse_args()
    if a.table:
        return table(a.table)
    workdir = a.workdir.resolve()
    if workdir.is_relative_to(REPO):
        print(
            f"E: --workdir {a.workdir}: inside the checkout; kernel trees stay out of it",
            file=sys.stderr,
        )
        return 2
    if workdir.is_relative_to(cache.resolve()) or cache.resolve().is_relative_to(workdir):
        print(
            f"E: --workdir {a.workdir}: shares the phyfarm cache {cache}; it must be apart",
            file=sys.stderr,
        )
        return 2
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{a.rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if rev.returncode != 0:
        print(f"E: --rev {a.rev}: not a commit of {REPO}", file=sys.stderr)
        return 2
    commit = rev.stdout.strip()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = podman_store(workdir)
    clean(workdir, conf)
    clone = workdir / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CARGO_TARGET_DIR", "MAKEFLAGS", "MAKELEVEL")
    }
    env.update(
        PHYFARM_CACHE=str(workdir / "cache"),
        CONTAINERS_STORAGE_CONF=str(conf),
        CARGO_HOME=str(workdir / "cargo-home"),
        PIP_CACHE_DIR=str(workdir / "pip-cache"),
    )
    print(f"I: cold run of {commit[:12]} in {workdir}", flush=True)
    try:
        (workdir / "warm.log").unlink(missing_ok=True)
        if make_run(clone, env, workdir / "cold.log", "cold") == 0:
            make_run(clone, env, workdir / "warm.log", "warm (reference)")
    finally:
        if not a.keep:
            clean(workdir, conf)
    return table(workdir)


if __name__ == "__main__":
    sys.exit(main())
