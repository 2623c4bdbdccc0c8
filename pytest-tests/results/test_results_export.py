"""phyfarm's exports checked by the tools that consume them: KCIDB JSON by
kcidb-io's own validator, patchwork checks against patchwork's rules, JUnit by
an XML parser, b4's CI-check JSON by its protocol."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import kcidb_io
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "pipeline/tests/fixtures/results"
NOW = "2026-06-16T00:00:00Z"


@pytest.fixture
def store(phyfarm, tmp_path: Path) -> Path:
    path = tmp_path / "results.sqlite"
    for name in ("base.json", "v7.json", "v8.json"):
        r = phyfarm("--store", str(path), "store", "import", str(FIXTURES / name))
        assert r.code == 0, r.describe()
    return path


@pytest.mark.parametrize("revision", ["rust-phy-enum-check/v7", "rust-phy-enum-check/v8"])
def test_kcidb_export_passes_kcidb_io_validation(phyfarm, store, tmp_path, revision):
    out = tmp_path / "kcidb.json"
    r = phyfarm("--store", str(store), "export", "kcidb", revision, "--now", NOW, "-o", str(out))
    assert r.code == 0, r.describe()
    data = json.loads(out.read_text())
    kcidb_io.schema.V5_3.validate_exactly(data)
    assert kcidb_io.schema.LATEST.is_valid(data)
    patched = [c for c in data["checkouts"] if c["patchset_hash"]]
    assert len(patched) == 1
    assert patched[0]["patchset_files"], "the patch files are listed in order"
    assert "@" in patched[0]["message_id"]
    if revision.endswith("v7"):
        assert patched[0]["valid"] is False, "v7 does not apply"
    else:
        numbers = [t for t in data["tests"] if "number" in t]
        assert numbers and all(t["status"] == "DONE" for t in numbers)
        retries = [t for t in data["tests"] if t["misc"].get("attempt") == 1]
        assert retries and all("retry_of" in t["misc"] for t in retries)


def test_kcidb_validator_rejects_a_broken_document(phyfarm, store):
    r = phyfarm("--store", str(store), "export", "kcidb", "rust-phy-enum-check/v8", "--now", NOW)
    data = json.loads(r.stdout)
    data["tests"][0]["status"] = "BROKEN"
    assert not kcidb_io.schema.V5_3.is_valid_exactly(data)


def test_patchwork_checks_follow_patchwork_rules(phyfarm, store):
    r = phyfarm(
        "--store",
        str(store),
        "export",
        "patchwork",
        "rust-phy-enum-check/v8",
        "--now",
        NOW,
        "--dashboard-url",
        "https://phyfarm.example.org",
    )
    assert r.code == 0, r.describe()
    doc = json.loads(r.stdout)
    assert doc["target_url"] == "https://phyfarm.example.org/series/rust-phy-enum-check/v8"
    for patch in doc["patches"]:
        for check in patch["checks"]:
            assert check["state"] in {"pending", "success", "warning", "fail"}
            assert all(c.isalnum() or c in "-_" for c in check["context"])
            assert len(check["target_url"]) <= 200
    farm = [c for c in doc["patches"][0]["checks"] if c["context"] == "phyfarm-farm"]
    assert farm[0]["state"] == "warning", "the flaky link-flap check is reported, not hidden"


def test_junit_parses(phyfarm, store):
    r = phyfarm("--store", str(store), "export", "junit", "rust-phy-enum-check/v7", "--now", NOW)
    assert r.code == 0, r.describe()
    root = ET.fromstring(r.stdout)
    assert root.tag == "testsuites"
    assert int(root.get("failures")) == 1
    assert root.find(".//testcase[@name='patch1']/failure") is not None


def test_b4_ci_check_speaks_the_protocol(phyfarm, store, tmp_path):
    import subprocess

    mail = (
        "From: Miguel Ojeda <ojeda@kernel.org>\n"
        "Subject: [PATCH net-next v8 1/2] rust: bindings\n"
        "Message-ID: <20260610-rust-phy-enum-check-v8-1-5d2c0e7a91b4@example.org>\n\nbody\n"
    )
    p = subprocess.run(
        [str(phyfarm.binary), "--store", str(store), "b4-ci-check", "--now", NOW],
        input=mail,
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    results = json.loads(p.stdout)
    assert results and all(r["status"] in {"pass", "warn", "fail"} for r in results)
    assert all(r["tool"] and r["url"].endswith("/series/rust-phy-enum-check/v8") for r in results)
