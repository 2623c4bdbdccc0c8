"""KCIDB statuses for pytest outcomes, the run's results.json, and the
rust-versus-c differential."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .errors import CheckFailed, FarmError

#: KCIDB statuses in priority order (the worst one wins).
PRIORITY = ["FAIL", "ERROR", "MISS", "PASS", "DONE", "SKIP"]


def classify(excinfo, when: str) -> str:
    """The KCIDB status of a failed phase: only the code under test can FAIL."""
    exc = excinfo.value if excinfo is not None else None
    if isinstance(exc, FarmError):
        return exc.status
    if isinstance(exc, pytest.fail.Exception):
        return "FAIL" if when == "call" else "ERROR"
    if isinstance(exc, AssertionError) and when == "call":
        return "FAIL"
    if when == "setup":
        return "MISS"
    return "ERROR"


def worst(statuses: list[str]) -> str:
    present = [s for s in PRIORITY if s in statuses]
    return present[0] if present else "MISS"


def message(excinfo, limit: int = 4000) -> str:
    if excinfo is None:
        return ""
    text = excinfo.exconly()
    if len(text) > limit:
        text = text[:limit] + "\n[...]"
    return text


def check_id(nodeid: str) -> tuple[str, str | None]:
    """`farm/test_throughput.py::test_tcp[rust]` -> ("farm.throughput.tcp", "rust")."""
    path, _, name = nodeid.partition("::")
    module = Path(path).stem.removeprefix("test_")
    variant = None
    m = re.search(r"\[(.*)\]$", name)
    if m:
        params = m.group(1).split("-")
        name = name[: m.start()]
        for p in params:
            if p in ("rust", "c"):
                variant = p
        rest = [p for p in params if p not in ("rust", "c")]
        if rest:
            name += "[" + "-".join(rest) + "]"
    return f"farm.{module}.{name.removeprefix('test_')}", variant


@dataclass
class TestRecord:
    nodeid: str
    id: str
    variant: str | None
    phases: dict = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    duration: float = 0.0
    measurements: list[dict] = field(default_factory=list)
    properties: dict = field(default_factory=dict)
    subtests: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        s = list(self.phases.values())
        if not s:
            return "MISS"
        if "call" not in self.phases and self.phases.get("setup") == "PASS":
            return "ERROR"
        if all(x in ("PASS", "SKIP") for x in s) and "SKIP" in s:
            return "SKIP"
        return worst(s)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "nodeid": self.nodeid,
            "variant": self.variant,
            "status": self.status,
            "duration": round(self.duration, 3),
            "message": "\n".join(m for m in self.messages if m),
            "measurements": self.measurements,
            "subtests": self.subtests,
            **self.properties,
        }


class Collector:
    """Gathers reports (on the xdist controller, or alone) into results.json."""

    def __init__(self, results_dir: Path, environment: dict) -> None:
        self.results_dir = results_dir
        self.environment = environment
        self.tests: dict[str, TestRecord] = {}
        self.started = time.time()

    def add(self, report) -> None:
        info = getattr(report, "phyfarm", None)
        if info is None:
            return
        rec = self.tests.get(report.nodeid)
        if rec is None:
            cid, variant = check_id(report.nodeid)
            rec = self.tests[report.nodeid] = TestRecord(report.nodeid, cid, variant)
        rec.phases[report.when] = info["status"]
        if info.get("message"):
            rec.messages.append(info["message"])
        rec.duration += report.duration
        if report.when == "teardown":
            for key, value in report.user_properties:
                v = json.loads(value) if isinstance(value, str) else value
                if key == "measurement":
                    rec.measurements.append(v)
                elif key == "subtest":
                    rec.subtests.append(v)
                else:
                    rec.properties[key] = v

    def records(self) -> list[dict]:
        out = [r.to_json() for r in self.tests.values()]
        # One result per KTAP case, beside the test that ran them.
        for r in list(self.tests.values()):
            for s in r.subtests:
                out.append(
                    {
                        "id": f"{r.id}.{s['name']}",
                        "nodeid": f"{r.nodeid}::{s['name']}",
                        "variant": r.variant,
                        "status": s["status"],
                        "duration": 0.0,
                        "message": s.get("message", ""),
                        "measurements": [],
                        "subtests": [],
                    }
                )
        return out

    def write(self, differential: list[dict]) -> dict:
        tests = self.records() + differential
        counts: dict[str, int] = {}
        for t in tests:
            counts[t["status"]] = counts.get(t["status"], 0) + 1
        doc = {
            "schema": 1,
            "reproducer": os.environ.get("PHYFARM_REPRODUCER", ""),
            "started": _rfc3339(self.started),
            "finished": _rfc3339(time.time()),
            "duration": round(time.time() - self.started, 3),
            "environment": self.environment,
            "status": worst([t["status"] for t in tests]) if tests else "MISS",
            "counts": counts,
            "tests": tests,
        }
        self.results_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.results_dir / f".results.json.{os.getpid()}"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.results_dir / "results.json")
        return doc


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def differential(records: list[dict], noise_band: float) -> list[dict]:
    """Same check on rust and c: a different outcome, or a rate beyond the
    noise band, is its own FAIL; otherwise PASS."""
    by_check: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.get("variant") in ("rust", "c"):
            by_check.setdefault(r["id"], {})[r["variant"]] = r
    out = []
    for cid, pair in sorted(by_check.items()):
        if set(pair) != {"rust", "c"}:
            continue
        rust, c = pair["rust"], pair["c"]
        problems = []
        if rust["status"] != c["status"]:
            problems.append(f"outcome differs: rust {rust['status']}, c {c['status']}")
        cm = {m["name"]: m for m in c["measurements"]}
        measurements = []
        for m in rust["measurements"]:
            other = cm.get(m["name"])
            if other is None or m.get("unit") != "Mbit/s" or not other["value"]:
                continue
            ratio = m["value"] / other["value"]
            measurements.append(
                {"name": f"{m['name']}_rust_over_c", "value": round(ratio, 4), "unit": "ratio"}
            )
            if abs(ratio - 1) > noise_band:
                problems.append(
                    f"{m['name']}: rust {m['value']:.1f} vs c {other['value']:.1f} Mbit/s "
                    f"(ratio {ratio:.2f}, noise band ±{noise_band:.0%})"
                )
        if rust["status"] in ("SKIP", "MISS") and c["status"] in ("SKIP", "MISS"):
            status = "SKIP"
        else:
            status = "FAIL" if problems else "PASS"
        out.append(
            {
                "id": f"farm.differential.{cid.removeprefix('farm.')}",
                "nodeid": "",
                "variant": None,
                "status": status,
                "duration": 0.0,
                "message": "; ".join(problems),
                "measurements": measurements,
                "subtests": [],
            }
        )
    return out


__all__ = [
    "CheckFailed",
    "Collector",
    "classify",
    "check_id",
    "differential",
    "message",
    "worst",
]
