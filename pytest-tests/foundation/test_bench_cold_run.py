"""bench/cold-run.py: how it splits `make run` into stages, its table and its
refusals (the runs themselves are the bench; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench/cold-run.py"

# Lines as `make run` prints them (the shipped series, 3715fb7), each with
# the stage it starts or continues.
MAKE_RUN = [
    ("bash containers/phase.sh setup bash containers/host-setup.sh", "packages + venv"),
    ("I: host prerequisites ready (venv: /c/venv)", "packages + venv"),
    ("bash containers/phase.sh cargo-build cargo build --workspace --bins", "cargo build"),
    ("   Compiling ax88772 v0.1.0 (/w/qemu-farm/ax88772)", "cargo build"),
    ("target/debug/phyfarm images", "images"),
    ("I: guest image /c/guest/farm-57b50fbdb25caa74.cpio built in 29 s", "images"),
    (
        "target/debug/phyfarm run patches/rust-phy-enum-check/v7 --no-farm || test $? -eq 1",
        "v7: kernel source, base builds",
    ),
    ("I: [rust]: images 0s, source 0s, configure 0s, build 3s", "v7: kernel source, base builds"),
    ("I: [series]: resetting the tree to the base", "v7: apply, builds"),
    ("I: [3/5] applying: rust: add second `bindgen` pass", "v7: apply, builds"),
    ("I: accelerator: tcg (KVM probe boot did not finish in 20s)", "v7: boots, record"),
    ("I: recorded runs a and b in /c/results.sqlite", "v7: boots, record"),
    ("target/debug/phyfarm run patches/rust-phy-enum-check/v8", "v8: base builds"),
    ("I: [rust-kunit] the base's KUnit configuration", "v8: base builds"),
    ("I: [1/2] applying: rust: add second `bindgen` pass", "v8: apply, patch builds"),
    ("I: [1/2 rust] build PASS in 21 s", "v8: apply, patch builds"),
    ("I: [rust-kunit]: make bzImage", "v8: gates + KUnit"),
    ("I: [gate clippy] PASS in 18s", "v8: gates + KUnit"),
    ("I: accelerator: tcg (KVM probe boot did not finish in 20s)", "v8: boots"),
    ("I: booting /c/runs/x-v8/rust/bzImage under tcg", "v8: boots"),
    ("I: farm: rust, c on auto (/c/runs/x-v8/base/farm)", "v8: farm on the base"),
    ("PASS  farm.probe   rust  7.4s", "v8: farm on the base"),
    ("I: accelerator: tcg (KVM probe boot did not finish in 20s)", "v8: farm on the base"),
    ("I: farm: rust, c on auto (/c/runs/x-v8/farm)", "v8: farm on the revision"),
    ("I: farm: rust, c on auto (/c/runs/x-v8/base/farm-throughput)", "v8: farm on the base"),
    ("I: farm: rust, c on auto (/c/runs/x-v8/farm-throughput)", "v8: farm on the revision"),
    ("I: recorded runs c and d in /c/results.sqlite", "v8: record"),
    ("target/debug/phyfarm dashboard export /c/site", "dashboard"),
]


def load():
    spec = importlib.util.spec_from_file_location("cold_run", BENCH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_each_line_of_make_run_falls_in_its_stage():
    m = load()
    s = m.Splitter()
    for line, stage in MAKE_RUN:
        s.stage = s.name(line)
        assert s.stage == stage, line
    assert {st for _, st in MAKE_RUN} == set(m.ORDER)


def test_a_stage_lasts_from_the_line_that_starts_it_to_the_next_stage():
    m = load()
    timed = [(float(i), line) for i, (line, _) in enumerate(MAKE_RUN)]
    shares = m.Splitter().split(timed, end=float(len(MAKE_RUN)) + 5)
    assert shares["packages + venv"] == 2.0
    assert shares["v8: farm on the base"] == 3.0 + 1.0  # two separate spells
    assert shares["dashboard"] == 6.0
    assert sum(shares.values()) == len(MAKE_RUN) + 5


def write_log(path: Path, code: int) -> None:
    lines = [f"{i * 10}.00\t{line}" for i, (line, _) in enumerate(MAKE_RUN)]
    path.write_text("\n".join([*lines, f"{len(MAKE_RUN) * 10}.00\tEXIT {code}"]) + "\n")


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_the_table_has_every_stage_and_the_ratio(tmp_path):
    write_log(tmp_path / "cold.log", 0)
    (tmp_path / "warm.log").write_text("5.00\tI: x\n140.00\tEXIT 0\n")
    r = bench("--table", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for st in load().ORDER:
        assert f"  {st} " in r.stdout, st
    assert "total" in r.stdout and "280 s" in r.stdout and "2.00" in r.stdout


def test_a_failed_cold_run_shows_where_it_stopped_and_exits_2(tmp_path):
    write_log(tmp_path / "cold.log", 2)
    r = bench("--table", str(tmp_path))
    assert r.returncode == 2
    assert "warm: not run" in r.stdout and "make run failed (cold)" in r.stderr


def test_it_refuses_what_it_cannot_measure(tmp_path):
    r = bench("--workdir", str(REPO / "cold"))
    assert r.returncode == 2 and "inside the checkout" in r.stderr, r.stderr
    cache = tmp_path / "cache"
    r = bench("--workdir", str(cache / "cold"), env={"PHYFARM_CACHE": str(cache)})
    assert r.returncode == 2 and "shares the phyfarm cache" in r.stderr, r.stderr
    r = bench(
        "--rev", "no-such-rev", "--workdir", str(tmp_path / "w"), env={"PHYFARM_CACHE": str(cache)}
    )
    assert r.returncode == 2 and "--rev no-such-rev: not a commit" in r.stderr, r.stderr
    assert not (tmp_path / "w").exists()
    r = bench("--table", str(tmp_path))
    assert r.returncode == 2 and "cold.log: missing" in r.stderr, r.stderr
    (tmp_path / "cold.log").write_text("0.00\tline\nnot a bench log\n")
    r = bench("--table", str(tmp_path))
    assert r.returncode == 2 and "cold.log:2: not a line of this bench's log" in r.stderr, r.stderr
