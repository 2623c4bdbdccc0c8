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

from .errors import CheckFailed, FarmError, HarnessError

#: The results.json contract, shared with the Rust reader (phyfarm::contract).
SCHEMA_FILE = (
    Path(__file__).resolve().parents[2] / "pipeline" / "schema" / "farm-results.schema.json"
)
SCHEMA_VERSION = 2

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


#: A check id: dotted lower-case words, then optionally the check's
#: parameters in brackets (`farm.link_flap[reset_after_link_loss]`). The same
#: pattern is in pipeline/schema/farm-results.schema.json and the Rust reader.
ID_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\[[A-Za-z0-9_,=+-]+\])?$")


def check_id(item) -> tuple[str, str | None]:
    """The check id and variant of a farm test item, from its `check` marker
    and its parameters: `@pytest.mark.check("farm.link_flap")` with
    quirk=reset_after_link_loss, variant=rust ->
    ("farm.link_flap[reset_after_link_loss]", "rust")."""
    m = item.get_closest_marker("check")
    if m is None or not m.args:
        raise ValueError('no @pytest.mark.check("farm.<name>") marker')
    base = m.args[0]
    params = dict(getattr(getattr(item, "callspec", None), "params", {}) or {})
    variant = params.pop("variant", None)
    values = [str(v).lstrip("-") for v in params.values()]
    cid = f"{base}[{','.join(values)}]" if values else base
    if not ID_RE.match(cid):
        raise ValueError(f"check id {cid!r} does not match {ID_RE.pattern}")
    return cid, variant


def subtest_name(name: str) -> str:
    """A KTAP case name as an id component."""
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")[:120] or "case"


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
            rec = TestRecord(report.nodeid, info["id"], info["variant"])
            self.tests[report.nodeid] = rec
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
                        "id": f"{r.id}.{subtest_name(s['name'])}",
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

    def write(self) -> dict:
        tests = self.records()
        counts: dict[str, int] = {}
        for t in tests:
            counts[t["status"]] = counts.get(t["status"], 0) + 1
        doc = {
            "schema": SCHEMA_VERSION,
            "reproducer": os.environ.get("PHYFARM_REPRODUCER", ""),
            "started": _rfc3339(self.started),
            "finished": _rfc3339(time.time()),
            "duration": round(time.time() - self.started, 3),
            "environment": self.environment,
            "status": worst([t["status"] for t in tests]) if tests else "MISS",
            "counts": counts,
            "tests": tests,
        }
        validate(doc)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.results_dir / f".results.json.{os.getpid()}"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.results_dir / "results.json")
        return doc


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def validate(doc: dict) -> None:
    """Check a results.json document against the schema the Rust reader
    shares; a harness that writes what the importer cannot store is a bug."""
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(document)"
        raise HarnessError(
            f"results.json does not match {SCHEMA_FILE.name} at {where}: {e.message}"
        ) from None


__all__ = [
    "CheckFailed",
    "Collector",
    "classify",
    "check_id",
    "validate",
    "message",
    "worst",
]
