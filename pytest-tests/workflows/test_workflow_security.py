"""phyfarm's GitHub Actions workflows: actionlint, and the security rules of
workflow_rules.py, which must pass on .github/workflows and must catch a
deliberately insecure workflow, rule by rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import workflow_rules as wr

from conftest import REPO

WORKFLOWS = REPO / ".github" / "workflows"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml")) + sorted(WORKFLOWS.glob("*.yaml"))


def actionlint() -> str:
    """The actionlint that pytest-tests/requirements.txt installs beside this Python."""
    venv_bin = Path(sys.executable).parent / "actionlint"
    found = str(venv_bin) if venv_bin.exists() else shutil.which("actionlint")
    assert found, (
        "actionlint is not installed: run containers/host-setup.sh "
        "(it installs pytest-tests/requirements.txt into the venv)"
    )
    return found


def test_the_workflows_are_there():
    names = {p.name for p in WORKFLOW_FILES}
    assert {"pull-request.yml", "pull-request-report.yml", "verdicts.yml", "ci.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_follows_the_security_rules(path):
    violations = wr.check(path)
    assert not violations, "\n".join(map(str, violations))


def test_actionlint_passes_on_the_workflows():
    p = subprocess.run(
        [actionlint(), "-no-color"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, f"actionlint exit {p.returncode}:\n{p.stdout}{p.stderr}"


def test_actionlint_rejects_a_broken_workflow():
    p = subprocess.run(
        [actionlint(), "-no-color", str(FIXTURES / "actionlint-broken.yml")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 1, f"actionlint exit {p.returncode}:\n{p.stdout}{p.stderr}"
    assert "no-such-job" in p.stdout, p.stdout


@pytest.mark.parametrize("rule", wr.RULES)
def test_the_insecure_fixture_is_caught_by_every_rule(rule):
    found = {v.rule for v in wr.check(FIXTURES / "insecure-workflow.yml")}
    assert rule in found, f"rule {rule} does not fire; fired: {sorted(found)}"


def test_untrusted_fields_are_named_as_such():
    msgs = [
        v.detail
        for v in wr.check(FIXTURES / "insecure-workflow.yml")
        if v.rule == "no-expressions-in-scripts"
    ]
    assert any("untrusted input" in m and "pull_request.title" in m for m in msgs), msgs


# A small workflow that passes every rule, and one edit per rule that must
# make exactly that rule fire: each rule can fail on its own.
GOOD = """\
name: good
on:
  pull_request:
    paths: ["patches/**"]
permissions: read-all
concurrency:
  group: good-${{ github.event.pull_request.number }}
  cancel-in-progress: true
jobs:
  build:
    runs-on: [self-hosted, linux, x64, phyfarm]
    env:
      TITLE: ${{ github.event.pull_request.title }}
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
      - run: echo "$TITLE"; phyfarm build --series patches/s/v1 --variant rust
  report:
    needs: build
    runs-on: ubuntu-latest
    permissions:
      checks: write
    steps:
      - uses: actions/github-script@ed597411d8f924073f98dfc5c65a23a2325f34cd # v8.0.0
        with:
          script: core.info(context.payload.action)
"""

MUTATIONS = {
    "no-pull-request-target": ("  pull_request:\n", "  pull_request:\n  pull_request_target:\n"),
    "top-level-permissions": ("permissions: read-all", "permissions: write-all"),
    "write-only-without-code": (
        "      checks: write\n    steps:\n",
        "      checks: write\n    steps:\n      - run: make test\n",
    ),
    "pinned-actions": ("checkout@3d3c42e5aac5ba805825da76410c181273ba90b1", "checkout@v7"),
    "no-secrets-with-contributor-code": (
        "      TITLE: ${{ github.event.pull_request.title }}",
        "      TITLE: ${{ github.event.pull_request.title }}\n      KEY: ${{ secrets.KEY }}",
    ),
    "no-expressions-in-scripts": ('echo "$TITLE"', 'echo "${{ github.event.pull_request.title }}"'),
    "pr-concurrency": ("cancel-in-progress: true", "cancel-in-progress: false"),
    "runner-labels": ("[self-hosted, linux, x64, phyfarm]", "[self-hosted, linux, x64]"),
    "checkout-without-credentials": ("persist-credentials: false", "fetch-depth: 0"),
    "trusted-runners-apart": (
        "[self-hosted, linux, x64, phyfarm]",
        "[self-hosted, linux, x64, phyfarm-trusted]",
    ),
}


def test_the_good_template_passes(tmp_path):
    p = tmp_path / "good.yml"
    p.write_text(GOOD)
    assert wr.check(p) == []


def test_every_rule_has_a_mutation():
    assert set(MUTATIONS) == set(wr.RULES)


@pytest.mark.parametrize("rule", wr.RULES)
def test_one_edit_trips_exactly_its_rule(tmp_path, rule):
    old, new = MUTATIONS[rule]
    assert GOOD.count(old) == 1, f"mutation for {rule} does not match the template once"
    p = tmp_path / "mutated.yml"
    p.write_text(GOOD.replace(old, new))
    fired = {v.rule for v in wr.check(p)}
    assert fired == {rule}, f"{rule}: fired {sorted(fired)}"


@pytest.mark.parametrize(
    "expr",
    [
        "github.event.pull_request.title",
        "github.event.pull_request.body",
        "github.event.pull_request.head.ref",
        "github.head_ref",
        "github.event.issue.title",
        "github.event.comment.body",
        "github.event.head_commit.message",
        "github.event.pull_request.head.label",
        "github.event.review.body",
    ],
)
def test_untrusted_event_fields_are_recognised(expr):
    assert wr.UNTRUSTED.search(expr)


def test_a_checkout_of_the_pull_request_head_makes_any_workflow_untrusted(tmp_path):
    p = tmp_path / "wr.yml"
    p.write_text(
        """\
on:
  workflow_run:
    workflows: [pull-request]
    types: [completed]
permissions: {}
jobs:
  j:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          ref: ${{ github.event.workflow_run.head_sha }}
          persist-credentials: false
          token: ${{ secrets.PAT }}
"""
    )
    assert {v.rule for v in wr.check(p)} == {"no-secrets-with-contributor-code"}


def test_the_report_workflow_follows_the_pull_request_workflow():
    pr = wr.load(WORKFLOWS / "pull-request.yml")
    report = wr.load(WORKFLOWS / "pull-request-report.yml")
    on = report.get("on", report.get(True))
    assert on["workflow_run"]["workflows"] == [pr["name"]]
    # The only writer never executes code from the pull request.
    job = report["jobs"]["report"]
    assert wr.may_write(job["permissions"]) and not wr.executes_code(job)


def test_the_pull_request_pipeline_shape():
    pr = wr.load(WORKFLOWS / "pull-request.yml")
    on = pr.get("on", pr.get(True))
    assert set(on) == {"pull_request"}
    assert on["pull_request"]["paths"] == ["patches/**"]
    jobs = pr["jobs"]
    assert list(jobs) == ["detect", "build", "farm", "collect"]
    farm = jobs["farm"]["strategy"]["matrix"]
    assert farm["variant"] == ["rust", "c"]
    # Check families of the plan, from `phyfarm farm plan --json` in detect
    # (test_farm_groups.py runs that step and checks they cover the plan).
    assert farm["group"] == "${{ fromJSON(needs.detect.outputs.groups) }}"
    assert jobs["detect"]["outputs"]["groups"] == "${{ steps.plan.outputs.groups }}"
    for name, job in jobs.items():
        assert job["runs-on"] == wr.PHYFARM_LABELS, name
        assert job.get("permissions") == {"contents": "read"}, (
            f"{name} widens permissions in an untrusted run"
        )
    assert pr["permissions"] == {}
    # No store credential on the runners of pull requests: collect uses a
    # store of its own job.
    collect = " ".join(s.get("run", "") for s in jobs["collect"]["steps"])
    assert 'PHYFARM_STORE="$RUNNER_TEMP/results.sqlite"' in collect
    detect_runs = " ".join(s.get("run", "") for s in jobs["detect"]["steps"])
    assert "series changed" in detect_runs
    # phyfarm runs from the base commit, never from the pull request.
    tool = [s for s in jobs["detect"]["steps"] if (s.get("with") or {}).get("path") == "tool"]
    assert tool and tool[0]["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"


def test_pages_deploy_alone_holds_pages_and_id_token():
    wf = wr.load(WORKFLOWS / "verdicts.yml")
    holders = {
        name
        for name, job in wf["jobs"].items()
        if isinstance(job.get("permissions"), dict)
        and {"pages", "id-token"} & set(job["permissions"])
    }
    assert holders == {"deploy"}
    assert not wr.executes_code(wf["jobs"]["deploy"])
    on = wf.get("on", wf.get(True))
    assert set(on) == {"schedule", "workflow_dispatch"}


def test_a_token_on_the_pull_request_runners_is_refused(tmp_path):
    p = tmp_path / "sched.yml"
    p.write_text(
        """\
on:
  schedule:
    - cron: "0 * * * *"
permissions: {}
jobs:
  j:
    runs-on: [self-hosted, linux, x64, phyfarm]
    permissions:
      pull-requests: read
    steps:
      - run: gh api repos
        env:
          GH_TOKEN: ${{ github.token }}
"""
    )
    assert {v.rule for v in wr.check(p)} == {"trusted-runners-apart"}
    p.write_text(p.read_text().replace("phyfarm]", "phyfarm-trusted]"))
    assert wr.check(p) == []


def test_ci_runs_pull_request_code_on_hosted_runners_only():
    wf = wr.load(WORKFLOWS / "ci.yml")
    for name, job in wf["jobs"].items():
        if wr.self_hosted(job):
            assert job.get("if") == "github.event_name == 'push'", (
                f"ci.yml job {name} runs pull-request code on a self-hosted runner"
            )
    hosted = [j for j in wf["jobs"].values() if not wr.self_hosted(j)]
    assert hosted, "pull requests to phyfarm get no checks at all"


def test_trusted_jobs_run_on_the_trusted_group():
    verdicts = wr.load(WORKFLOWS / "verdicts.yml")["jobs"]["verdicts"]
    assert verdicts["runs-on"] == wr.TRUSTED_LABELS
    record = wr.load(WORKFLOWS / "pull-request-report.yml")["jobs"]["record"]
    assert record["runs-on"] == wr.TRUSTED_LABELS
    assert not wr.checks_out_pr_head(record)


def zizmor() -> str:
    """The zizmor that pytest-tests/requirements.txt pins, beside this Python."""
    venv_bin = Path(sys.executable).parent / "zizmor"
    found = str(venv_bin) if venv_bin.exists() else shutil.which("zizmor")
    assert found, "zizmor is not installed: run containers/host-setup.sh"
    return found


def run_zizmor(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [zizmor(), "--offline", "--persona", "auditor", "--format", "json", *extra, str(WORKFLOWS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_zizmor_finds_nothing_beyond_what_its_config_allows():
    p = run_zizmor("--config", str(REPO / ".github/zizmor.yml"))
    findings = json.loads(p.stdout or "[]")
    assert p.returncode == 0 and findings == [], p.stdout + p.stderr


def test_zizmor_config_allows_only_the_self_hosted_runners():
    # Without the config, what remains is exactly what the config allows
    # (plus the one inline-ignored workflow_run trigger, which stays ignored).
    p = run_zizmor("--no-config")
    idents = {f["ident"] for f in json.loads(p.stdout or "[]")}
    assert idents == {"self-hosted-runner"}, idents
