"""Series end to end through `phyfarm run`: ingest of the shipped revisions,
v7's precise apply failure, v8 applied and built after every patch in both
variants with the Rust gates and booted, both recorded in a results store with
their verdicts, and the PHY_NEW fixture that the enum exhaustiveness check must
catch."""

from __future__ import annotations

import json
import re
import shlex
import struct
from pathlib import Path

import pytest
from phyfarm_farm.plugin import PCAP_SNAPLEN

from conftest import REPO, read_json

SERIES = REPO / "patches" / "rust-phy-enum-check"
FIXTURES = Path(__file__).parent / "fixtures"


def show(phyfarm, path: Path) -> dict:
    r = phyfarm("series", "show", "--json", str(path))
    assert r.code == 0, r.describe()
    return json.loads(r.stdout)


def test_show_v7_as_posted(phyfarm):
    s = show(phyfarm, SERIES / "v7")
    assert (s["version"], s["tree"]) == (7, "net-next")
    assert [(p["index"], p["total"]) for p in s["patches"]] == [(3, 5), (4, 5)]
    assert s["patches"][0]["author"] == "Miguel Ojeda"
    assert s["patches"][1]["author"] == "FUJITA Tomonori"
    assert all(re.fullmatch(r"[0-9a-f]{40}", p["patch_id"]) for p in s["patches"])
    assert re.fullmatch(r"[0-9a-f]{64}", s["patchset_hash"])


def test_show_v8_has_the_change_id_of_the_cover_letter(phyfarm):
    s = show(phyfarm, SERIES / "v8")
    assert (s["version"], s["tree"], len(s["patches"])) == (8, "net-next", 2)
    assert s["change_id"] == "20231026-rust-phy-enum-check-fdb11bdd318a"
    assert s["cover"]["subject"].startswith("rust: net::phy:")


def test_not_a_patch_is_refused_with_its_name(phyfarm, tmp_path):
    bad = tmp_path / "0001-notes.patch"
    bad.write_text("just some notes\n")
    r = phyfarm("series", "show", str(tmp_path))
    assert r.code == 2, r.describe()
    assert str(bad) in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store") / "results.sqlite"


@pytest.fixture(scope="module")
def v7_build(phyfarm, podman, store, tmp_path_factory):
    out = tmp_path_factory.mktemp("v7")
    return out, phyfarm("--store", str(store), "run", str(SERIES / "v7"), "-o", str(out))


@pytest.mark.slow
def test_v7_does_not_apply_and_says_where(v7_build):
    out, r = v7_build
    assert r.code == 1, r.describe()
    b = read_json(out / "series-build.json")
    assert b["status"] == "FAIL"
    first = b["apply"][0]
    assert first["state"] == "failed"
    files = {h["file"] for h in first["rejected"]}
    assert "rust/Makefile" in files, first
    makefile = [h for h in first["rejected"] if h["file"] == "rust/Makefile"]
    assert all(h["header"].startswith("@@ ") and h["text"] for h in makefile)
    assert "rust/Makefile hunk #" in first["message"]
    assert "DOES NOT APPLY" in r.stdout
    # The MAINTAINERS entry is upstream (with one more F: line): already applied.
    second = b["apply"][1]
    assert second["state"] == "already-applied", second
    assert [h["already_present"] for h in second["rejected"]] == [True]
    # Nothing is built on a tree the series does not apply to.
    assert b["builds"] == []
    assert {g["status"] for g in b["gates"]} == {"SKIP"}
    # Recorded, with the verdict printed: changes requested.
    assert "rust-phy-enum-check/v7: changes-requested" in r.stdout, r.describe()
    assert read_json(out / "results.json")["revision"]["version"] == 7


# `make run`'s options: with the same kernels, farm and plan, the base's farm
# results of an earlier run are reused, as they are for a contributor.
@pytest.fixture(scope="module")
def v8_build(phyfarm, podman, store, v7_build, tmp_path_factory):
    out = tmp_path_factory.mktemp("v8")
    return out, phyfarm("--store", str(store), "run", str(SERIES / "v8"), "-o", str(out))


@pytest.mark.slow
def test_v8_applies_builds_every_patch_and_passes_the_gates(phyfarm, v8_build):
    out, r = v8_build
    assert r.code == 0, r.describe()
    b = read_json(out / "series-build.json")
    assert [a["state"] for a in b["apply"]] == ["applied", "already-applied"], b["apply"]
    assert "reverse-applies" in b["apply"][1]["message"]
    built = {(x["index"], x["variant"]): x["status"] for x in b["builds"]}
    assert built == {
        (1, "rust"): "PASS",
        (1, "c"): "PASS",
        (2, "rust"): "PASS",
        (2, "c"): "PASS",
    }
    gates = {g["name"]: g["status"] for g in b["gates"]}
    assert gates == {
        "rustfmtcheck": "PASS",
        "enum-check": "PASS",
        "clippy": "PASS",
        "rustdoc": "PASS",
        "kunit-build": "PASS",
    }, b["gates"]
    # The KUnit configuration of the patched tree and of the base.
    for k in (out / "rust-kunit", out / "base" / "rust-kunit"):
        assert (k / "bzImage").stat().st_size > 1_000_000
    for v in ("rust", "c"):
        assert (out / v / "bzImage").stat().st_size > 1_000_000
        assert read_json(out / v / "metadata.json")["status"] == "PASS"
        assert read_json(out / v / "boot" / "boot.json")["status"] == "PASS"
        assert read_json(out / "base" / v / "boot" / "boot.json")["status"] == "PASS"
    # The farm ran on the patched kernels and on the base, and was recorded.
    rec = read_json(out / "results.json")
    # Every planned check reached the record, parameters and all, and none
    # is missing or incomplete; the base ran the same plan.
    plan = phyfarm("farm", "plan", "--variants", "rust,c", "--kunit")
    planned = {tuple(x.split()) for x in plan.stdout.splitlines()}
    planned = {(i, None if v == "-" else v) for i, v in planned}
    base = read_json(out / "results-base.json")
    for run in (rec, base):
        farm = {
            (t["path"], t["variant"]): t["status"]
            for t in run["tests"]
            if t["path"].startswith("farm.") and t.get("attempt", 0) == 0
        }
        assert planned <= set(farm), sorted(planned - set(farm))
        bad = {k: s for k, s in farm.items() if s in ("MISS", "ERROR", "SKIP")}
        assert not bad, bad
    assert ("farm.link_flap[reset_after_link_loss]", "rust") in planned
    assert ("farm.differential.cable_test[cable-test]", None) in planned
    # The Rust doctests ran on the patched tree, one result per case.
    doctests = [t for t in rec["tests"] if t["path"].startswith("farm.kunit.")]
    assert len(doctests) > 10 and all(t["status"] == "PASS" for t in doctests), doctests[:3]
    tp = [m for m in rec["measurements"] if m["name"] == "farm.throughput.tcp_tx"]
    assert len(tp) == 2 and all(len(m["samples"]) >= 4 for m in tp), tp
    # The wire captures keep each frame's headers (PCAP_SNAPLEN bytes): whole
    # frames made the throughput checks' captures 250 MB each.
    pcaps = sorted(out.glob("farm*/logs/*/wire.pcap"))
    assert any("throughput" in str(p) for p in pcaps), pcaps
    for p in pcaps:
        with p.open("rb") as f:
            assert struct.unpack("<IHHiIII", f.read(24))[5] == PCAP_SNAPLEN, p
    # It passes against the base: awaiting review, with the three-day clock.
    assert "rust-phy-enum-check/v8: awaiting-review" in r.stdout, r.describe()
    assert "ready to merge at" in r.stdout


@pytest.mark.slow
def test_an_unchanged_base_is_not_relinked(phyfarm, v8_build, tmp_path):
    """Building the base again changes nothing, so nothing is linked again
    (every container has the same host name, which kbuild records)."""
    out = tmp_path / "rust"
    r = phyfarm("build", "--variant", "rust", "-o", str(out))
    assert r.code == 0, r.describe()
    log = (out / "build.log").read_text()
    assert "bzImage is ready" in log, log[-2000:]
    relinked = re.findall(r"^\s+(?:LD|UPD)\s+(vmlinux|include/generated/compile.h)$", log, re.M)
    assert not relinked, log[-3000:]


def one_patch(tmp_path: Path, path: str, old: str, new: str) -> Path:
    """A one-patch revision changing one line of `path` in the distro tree."""
    d = tmp_path / path.replace("/", "_")
    d.mkdir()
    (d / "0001-change.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: A Contributor <contributor@phyfarm.invalid>\n"
        "Date: Thu, 3 Dec 2026 10:00:00 +0000\n"
        f"Subject: [PATCH net-next v1 1/1] change {path}\n\n"
        "A change to one file.\n---\n"
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1,1 +1,1 @@\n-{old}\n+{new}\n-- \n2.39.5\n"
    )
    return d


def gates_of(phyfarm, path: Path) -> dict:
    r = phyfarm("series", "gates", "--json", str(path))
    assert r.code == 0, r.describe()
    return {g["gate"]: (g["runs"], g["reason"]) for g in json.loads(r.stdout)}


@pytest.mark.slow
def test_gates_run_only_on_what_a_revision_can_affect(phyfarm, v8_build, tmp_path):
    """Read from the dependency records of the real base build (v8_build
    built it): a header bindgen reads runs the crate gates, a C-only change
    runs none, a driver change lints without documenting."""
    v8 = gates_of(phyfarm, SERIES / "v8")
    assert all(runs for runs, _ in v8.values()), v8
    driver = gates_of(phyfarm, REPO / "patches" / "selftest" / "hostile-metadata" / "v1")
    assert {g: runs for g, (runs, _) in driver.items()} == {
        "rustfmtcheck": True,
        "enum-check": False,
        "rustdoc": False,
        "clippy": True,
    }, driver
    assert "no header bindgen reads" in driver["rustdoc"][1]
    c_only = gates_of(
        phyfarm,
        one_patch(
            tmp_path,
            "drivers/net/phy/ax88796b.c",
            "// SPDX-License-Identifier: GPL-2.0+",
            "// SPDX-License-Identifier: GPL-2.0-or-later",
        ),
    )
    assert not any(runs for runs, _ in c_only.values()), c_only
    header = gates_of(
        phyfarm,
        one_patch(
            tmp_path,
            "include/linux/phy.h",
            "/* SPDX-License-Identifier: GPL-2.0-or-later */",
            "/* SPDX-License-Identifier: GPL-2.0+ */",
        ),
    )
    assert header["rustdoc"] == (True, "the series changes include/linux/phy.h"), header
    assert header["clippy"][0] and header["enum-check"][0], header
    assert not header["rustfmtcheck"][0], header
    # What `phyfarm run` did for v8 is what the command says.
    out, _ = v8_build
    ran = {g["name"] for g in read_json(out / "series-build.json")["gates"]}
    assert set(v8) <= ran


@pytest.mark.slow
def test_both_revisions_are_in_the_store(phyfarm, store, v7_build, v8_build):
    r = phyfarm("--store", str(store), "verdict", "--json")
    assert r.code in (0, 1), r.describe()
    states = {
        (x["revision"]["series"], x["revision"]["version"]): x["state"]
        for x in json.loads(r.stdout)
    }
    # v8 supersedes v7 once it is recorded; v8 passes and awaits review.
    assert states == {
        ("rust-phy-enum-check", 7): "superseded",
        ("rust-phy-enum-check", 8): "awaiting-review",
    }, states


@pytest.mark.slow
def test_phy_new_state_fails_the_build_with_rustc_message(phyfarm, podman, v8_build, tmp_path):
    # v8 plus a patch adding PHY_NEW to enum phy_state, renumbered as v9 n/3.
    series = tmp_path / "v9"
    series.mkdir()
    for i, src in enumerate(sorted((SERIES / "v8").glob("000[12]-*.patch")), 1):
        text = src.read_text()
        text = re.sub(r"\[PATCH net-next v8 \d/2\]", f"[PATCH net-next v9 {i}/3]", text, count=1)
        (series / src.name).write_text(text)
    (series / "0003-net-phy-add-PHY_NEW.patch").write_text(
        (FIXTURES / "phy-new-state.patch").read_text()
    )
    out = tmp_path / "out"
    r = phyfarm("build", "--series", str(series), "--variant", "rust", "-o", str(out))
    assert r.code == 1, r.describe()
    b = read_json(out / "series-build.json")
    assert b["status"] == "FAIL"
    assert b["apply"][2]["state"] == "applied"
    last = [x for x in b["builds"] if x["index"] == 3]
    assert [x["status"] for x in last] == ["FAIL"], last
    needle = "pattern `phy_state::PHY_NEW` not covered"
    assert (
        any(needle in line for line in last[0]["log_excerpt"])
        or needle in Path(last[0]["log"]).read_text()
    )
    gate = {g["name"]: g for g in b["gates"]}["enum-check"]
    assert gate["status"] == "FAIL" and needle in gate["message"], gate


@pytest.mark.slow
def test_a_broken_emulator_on_both_sides_is_an_error_never_the_revisions_fail(
    phyfarm, podman, v8_build, tmp_path
):
    """The farm's own parts failing alike on the base and the revision (here
    the emulator, killed as soon as every guest's QEMU greets it) leave the
    revision `testing` with each check an ERROR that names the emulator: an
    ERROR the base shares never becomes the revision's FAIL."""
    real = REPO / "target/release/ax88772-emu"
    assert real.is_file(), "the v8 run builds the emulator"
    broken = tmp_path / "ax88772-emu"
    # Killed on its own log line, not after a time: a timer raced the
    # shortest check (a probe once finished first and PASSed).
    broken.write_text(
        "#!/bin/sh\n# ax88772-emu, killed when QEMU's hello reaches it.\n"
        'fifo=$(mktemp -u)\nmkfifo "$fifo" || exit 1\n'
        f'{shlex.quote(str(real))} "$@" 2>"$fifo" &\npid=$!\n'
        "while IFS= read -r line; do\n  printf '%s\\n' \"$line\" >&2\n"
        '  case "$line" in *"usb: peer hello"*) kill -9 "$pid";; esac\n'
        'done < "$fifo"\nrm -f "$fifo"\nwait "$pid"\n'
    )
    broken.chmod(0o755)
    store = tmp_path / "store.sqlite"
    out = tmp_path / "run"
    # One check a side: every check meets the same dead emulator, and each
    # one ending in ERROR here adds about 40 s (4 a side took 531 s, 1 288 s).
    args = ["--variants", "rust", "--checks", "farm.probe", "--no-kunit"]
    r = phyfarm(
        "--store", str(store), "run", str(SERIES / "v8"), *args,
        "--no-gates", "--emulator", str(broken), "-o", str(out),
    )  # fmt: skip
    assert r.code == 2, r.describe()
    assert "rust-phy-enum-check/v8: testing" in r.stdout, r.describe()
    v = phyfarm("--store", str(store), "verdict", "rust-phy-enum-check/v8", "--json")
    assert v.code == 2, v.describe()
    report = json.loads(v.stdout)
    assert report["state"] == "testing", report["reason"]
    farm = [c for c in report["checks"] if c["path"].startswith("farm.")]
    assert farm, report["checks"]
    assert {c["status"] for c in farm} == {"ERROR"}, [(c["path"], c["status"]) for c in farm]
    assert all("ax88772-emu" in c["log_excerpt"] for c in farm), [c["log_excerpt"] for c in farm]
    # The base ran with the same broken emulator.
    base = read_json(out / "results-base.json")
    base_farm = [t for t in base["tests"] if t["path"].startswith("farm.")]
    assert base_farm and {t["status"] for t in base_farm} == {"ERROR"}, base_farm
