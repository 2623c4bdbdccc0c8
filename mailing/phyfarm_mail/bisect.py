"""The first bad patch of a revision whose farm check FAILs where the base
PASSes: the check is run on the kernels of the revision's first k patches,
bisecting over k.

Each step is a real `phyfarm run` of a prefix of the revision (patches 1..k,
their subjects renumbered k/k so the prefix is a whole series) with only the
failing check's family and variant, recorded in a store of its own
(`<state>/bisect.sqlite`) so the revision's own verdict never sees it. A run
already retries a failing check once (a FAIL is two failing attempts in one
run), and a step is decided by a majority of up to three runs: good after
two runs with the check PASS, bad after two with it FAIL. A check that fails
one attempt in ten on a good kernel FAILs a run one time in a hundred (both
attempts), and makes a good step look bad about once in 3 300 (two such
runs out of three: 3 · 0.01²); one
that neither passes nor fails (ERROR, MISS) stops the search, saying so.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

RUNS_PER_STEP = 3
AGREE = 2


def failing(verdict: dict) -> list[tuple[str, str | None]]:
    """The farm checks that FAIL on the revision and PASS on the base."""
    out = []
    for c in verdict.get("vs_base", []):
        if not isinstance(c, dict) or not isinstance(c.get("check"), dict):
            continue
        kind = str(c.get("kind", "")).replace("_", "-").lower()
        path = str(c["check"].get("path", ""))
        if kind == "new-failure" and path.startswith("farm.") and c.get("status") == "FAIL":
            out.append((path, c["check"].get("variant")))
    return out


def renumber(raw: bytes, k: int) -> bytes:
    """The mail with its subject's `[... i/n]` made `[... i/k]`."""
    head, sep, body = raw.partition(b"\n\n")
    head = re.sub(
        rb"(?im)^(subject:[^\n]*\[[^\]\n]*?\b\d{1,4})/\d{1,4}\]",
        lambda m: m.group(1) + b"/" + str(k).encode() + b"]",
        head,
        count=1,
    )
    return head + sep + body


class Bisect:
    def __init__(
        self,
        phyfarm: str,
        root: Path,
        log: Callable[[str, str], None],
        run_args: list[str],
    ) -> None:
        self.phyfarm = phyfarm
        self.root = root
        self.store = root / "bisect.sqlite"
        self.log = log
        self.run_args = run_args
        #: What each step ran and gave, for the record: "1..1: PASS PASS".
        self.steps: list[str] = []
        #: The check bisected: (path, variant).
        self.check: tuple[str, str | None] | None = None

    def prefix(self, rev_dir: Path, name: str, version: int, k: int) -> tuple[str, Path]:
        series = f"{name}-first-{k}"[:100]
        d = self.root / "bisect" / series / f"v{version}"
        d.mkdir(parents=True, exist_ok=True)
        for f in d.glob("*.patch"):
            f.unlink()
        for i in range(1, k + 1):
            raw = (rev_dir / f"{i:04d}.patch").read_bytes()
            (d / f"{i:04d}.patch").write_bytes(renumber(raw, k))
        (d.parent / "series.toml").write_text(
            (rev_dir.parent / "series.toml")
            .read_text()
            .split("\n[[revision]]")[0]
            .replace(f'name = "{name}"', f'name = "{series}"', 1)
        )
        return f"{series}/v{version}", d

    def step(self, rev_dir: Path, name: str, version: int, k: int, path: str, variant) -> str:
        """'good', 'bad' or 'unknown' for the kernel of patches 1..k."""
        ref, d = self.prefix(rev_dir, name, version, k)
        family = re.match(r"^farm\.[a-z0-9_]+", path)
        args = [a for a in self.run_args]
        for opt in ("--checks", "--variants"):
            if opt in args:
                i = args.index(opt)
                del args[i : i + 2]
        args += ["--checks", family.group(0) if family else path]
        if variant:
            args += ["--variants", str(variant)]
        tally = {"PASS": 0, "FAIL": 0}
        seen: list[str] = []
        for n in range(1, RUNS_PER_STEP + 1):
            subprocess.run(
                [self.phyfarm, "--store", str(self.store), "run", str(d), *args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
            p = subprocess.run(
                [self.phyfarm, "--store", str(self.store), "verdict", ref, "--json"],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                checks = json.loads(p.stdout).get("checks", [])
            except ValueError:
                checks = []
            got = [
                c.get("status")
                for c in checks
                if c.get("path") == path and c.get("variant") == variant
            ]
            status = got[0] if got else "MISS"
            self.log("I", f"first bad patch: patches 1..{k}, run {n}: {path} {status}")
            seen.append(str(status))
            if status not in tally:
                break
            tally[status] += 1
            if tally["PASS"] >= AGREE:
                self.steps.append(f"1..{k}: {' '.join(seen)}")
                return "good"
            if tally["FAIL"] >= AGREE:
                self.steps.append(f"1..{k}: {' '.join(seen)}")
                return "bad"
        self.steps.append(f"1..{k}: {' '.join(seen)}")
        return "unknown"

    def find(self, rev_dir: Path, name: str, version: int, total: int, verdict: dict) -> str | None:
        """'k/n' of the first bad patch, or a sentence saying why it is not known."""
        checks = failing(verdict)
        if not checks or total < 2:
            return None
        path, variant = checks[0]
        self.check = (path, variant)
        good, bad = 0, total  # the base passes, the whole revision fails
        while bad - good > 1:
            mid = (good + bad) // 2
            verdict_of_mid = self.step(rev_dir, name, version, mid, path, variant)
            if verdict_of_mid == "good":
                good = mid
            elif verdict_of_mid == "bad":
                bad = mid
            else:
                return f"not found: {path} neither passed nor failed on patches 1..{mid}"
        return f"{bad}/{total}"
