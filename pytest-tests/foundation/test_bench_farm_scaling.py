"""bench/farm-scaling.py refuses what it cannot measure, with exit 2 and the
reason (the farm runs themselves are the bench; no timing is asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench/farm-scaling.py"


def bench(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=60,
        # What bench/farm-scaling.sh does, with this Python.
        env={**os.environ, "PYTHONPATH": str(REPO / "harness"), **env},
        cwd=REPO,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--workers", "1"], {}, "--workers must be >= 2"),
        (["--repeat", "0"], {}, "--repeat >= 1"),
        ([], {"PHYFARM_BIN": "/nonexistent/phyfarm"}, "no phyfarm binary at /nonexistent"),
    ],
)
def test_bad_options_and_a_missing_binary_are_exit_2(args, env, says):
    r = bench(*args, **env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "wall(" not in r.stdout, "no ratio against nothing"


def test_no_kernels_is_exit_2_naming_the_folder(tmp_path):
    r = bench("--artifacts", str(tmp_path), PHYFARM_BIN="/bin/true")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"no <variant>/bzImage under {tmp_path}" in r.stderr, r.stderr
    assert r.stdout == ""
