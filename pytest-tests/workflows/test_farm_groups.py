"""The pull-request workflow's farm matrix runs the plan: every `-k` group
selects at least one planned check, every planned check is in exactly one
group, and the collect step assembles the groups with `phyfarm record`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "pull-request.yml"


def groups() -> list[str]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return list(doc["jobs"]["farm"]["strategy"]["matrix"]["group"])


def selected(group: str) -> set[tuple[str, str]]:
    argv = [
        sys.executable, "-m", "pytest", "--collect-only", "-q", "--list-checks",
        "--variant", "rust", "--variant", "c", "-p", "no:cacheprovider",
        "-k", group, str(REPO / "pytest-tests" / "farm"),
    ]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
    assert p.returncode in (0, 5), p.stdout[-3000:] + p.stderr[-3000:]
    return {tuple(x.split()[1:3]) for x in p.stdout.splitlines() if x.startswith("CHECK ")}


@pytest.fixture(scope="module")
def plan(phyfarm) -> set[tuple[str, str]]:
    r = phyfarm("farm", "plan", "--variants", "rust,c")
    assert r.code == 0, r.describe()
    return {
        tuple(x.split()) for x in r.stdout.splitlines() if not x.startswith("farm.differential.")
    }


def test_every_group_selects_planned_checks(plan):
    for g in groups():
        got = selected(g)
        assert got, f"-k {g} selects no farm check"
        assert got <= plan, f"-k {g} selects checks outside the plan: {got - plan}"


def test_every_planned_check_is_in_exactly_one_group(plan):
    seen: dict[tuple[str, str], list[str]] = {}
    for g in groups():
        for c in selected(g):
            seen.setdefault(c, []).append(g)
    missing = sorted(plan - set(seen))
    assert not missing, f"planned checks no group runs: {missing}"
    twice = {c: gs for c, gs in seen.items() if len(gs) > 1}
    assert not twice, f"checks run by more than one group: {twice}"


def test_the_collect_step_records_the_groups_against_the_plan():
    text = WORKFLOW.read_text()
    assert "store import results/*/" not in text
    assert '"$PHYFARM" record --series' in text
    # The families it plans are the matrix's groups.
    for g in groups():
        assert f"farm.{g}" in text, g
