"""bench/revision-to-verdict.py: its stage split and its refusals (the runs
themselves are the bench; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench/revision-to-verdict.py"


def load():
    spec = importlib.util.spec_from_file_location("rev2verdict", BENCH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_progress_lines_of_a_run_fall_in_their_stage():
    m = load()
    # Lines as `phyfarm run` prints them (from the v8 run of `make run`).
    lines = {
        "I: series v8 net-next (2 patches) from patches/rust-phy-enum-check/v8": "base builds",
        "I: [rust-kunit] the base's KUnit configuration": "base builds",
        "I: [series]: resetting the tree to the base": "apply",
        "I: [rust-kunit] a fresh series build tree from the base": "apply",
        "I: [1/2] applying: rust: add second `bindgen` pass": "apply",
        "I: [1/2 rust]: make bzImage": "patch builds",
        "I: [gate clippy] PASS in 26s": "gates + KUnit",
        "I: [rust-kunit]: make bzImage": "gates + KUnit",
        "I: booting /x/base/rust/bzImage under tcg": "boots",
        "I: farm: rust, c on auto (/x/base/farm)": "farm",
        "I: recorded runs a and b in /x/results.sqlite": "record",
        "I: PASS: usb driver asix registered": None,
    }
    for line, stage in lines.items():
        assert m.stage_of(line) == stage, line
    assert m.VERDICT.match("hostile-metadata/v1: awaiting-review since 2026-12-03T16:00:00Z")


def test_it_refuses_to_run_without_phyfarm_or_a_series(tmp_path):
    r = subprocess.run(
        [sys.executable, str(BENCH), "--phyfarm", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no phyfarm at" in r.stderr, r.stderr
    assert "ratio" not in r.stdout
    fake = tmp_path / "phyfarm"
    fake.write_text("#!/bin/sh\nexit 2\n")
    fake.chmod(0o755)
    r = subprocess.run(
        [sys.executable, str(BENCH), "--phyfarm", str(fake), "--series", str(tmp_path / "v9")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no series revision" in r.stderr, r.stderr
    series = tmp_path / "v1"
    series.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--phyfarm",
            str(fake),
            "--series",
            str(series),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "could not complete (exit 2)" in r.stderr, r.stderr
    assert "ratio" not in r.stdout
