"""The pull-request workflow's farm matrix runs the plan: the detect job
derives the groups from `phyfarm farm plan --json` (its step is run here as
written), every `-k` group selects at least one planned check, every planned
check is in exactly one group, and the collect step assembles the groups
with `phyfarm record` against the same plan."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "pull-request.yml"


@pytest.fixture(scope="module")
def groups(phyfarm, tmp_path_factory) -> list[str]:
    """The groups the detect job's plan step writes, by running that step."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    matrix = doc["jobs"]["farm"]["strategy"]["matrix"]["group"]
    assert matrix == "${{ fromJSON(needs.detect.outputs.groups) }}", matrix
    step = next(s for s in doc["jobs"]["detect"]["steps"] if s.get("id") == "plan")
    work = tmp_path_factory.mktemp("detect")
    out = work / "output"
    env = {**os.environ, "PHYFARM": str(phyfarm.binary), "GITHUB_OUTPUT": str(out)}
    p = subprocess.run(
        ["bash", "-e", "-c", step["run"]], cwd=work, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(x for x in out.read_text().splitlines() if x.startswith("groups="))
    got = json.loads(line.removeprefix("groups="))
    assert got and all(isinstance(g, str) and g for g in got), got
    return got


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


def test_every_group_selects_planned_checks(plan, groups):
    for g in groups:
        got = selected(g)
        assert got, f"-k {g} selects no farm check"
        assert got <= plan, f"-k {g} selects checks outside the plan: {got - plan}"


def test_every_planned_check_is_in_exactly_one_group(plan, groups):
    seen: dict[tuple[str, str], list[str]] = {}
    for g in groups:
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
    # The families it plans come from the plan detect wrote, never a list.
    assert "plan.json" in text
    assert not re.search(r"farm\.", text), "a hand-written check id in the workflow"


def test_no_workflow_lists_check_ids_by_hand():
    for path in (REPO / ".github").rglob("*"):
        if path.is_file():
            hits = [
                f"{path.name}:{i}: {line.strip()}"
                for i, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(r"farm\.", line)
            ]
            assert not hits, hits
