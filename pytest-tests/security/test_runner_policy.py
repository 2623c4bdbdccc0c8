"""Runners as GitHub's hardening guide asks (containers/runner/setup-runner.sh):
ephemeral by default, never root, and no persistent runner for a public
repository. The policy is checked before anything is installed, so these
tests run the real script with a stand-in for the GitHub API."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "containers/runner/setup-runner.sh"


def run(tmp_path: Path, api_answer: str | None, *args: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        pytest.skip("setup-runner.sh only runs as root")
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    curl = fake / "curl"
    if api_answer is None:
        curl.write_text("#!/bin/sh\nexit 22\n")
    else:
        curl.write_text(f"#!/bin/sh\ncat <<'JSON'\n{api_answer}\nJSON\n")
    curl.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )


def test_a_persistent_runner_is_refused_for_a_public_repository(tmp_path):
    p = run(tmp_path, '{"private": false}', "--persistent", "--url", "https://github.com/o/r")
    assert p.returncode == 2, p.stderr
    assert "persistent runners are refused for public repositories" in p.stderr
    assert "host prerequisites" not in p.stderr, "refused before installing anything"


def test_a_persistent_runner_needs_proof_the_repository_is_private(tmp_path):
    p = run(tmp_path, None, "--persistent", "--url", "https://github.com/o/r")
    assert p.returncode == 2, p.stderr
    assert "cannot tell whether o/r is public" in p.stderr
    p = run(tmp_path, '{"private": true}', "--persistent", "--url", "https://github.com/o")
    assert p.returncode == 2 and "needs --url https://github.com/OWNER/REPO" in p.stderr


def test_runners_are_ephemeral_and_not_root_by_default():
    text = SCRIPT.read_text()
    assert "ephemeral=1 " in text, "ephemeral is the default"
    assert "args+=(--ephemeral)" in text
    assert "RUNNER_ALLOW_RUNASROOT" not in text, "the runner never runs as root"
    assert 'runuser -u "$runner_user" -- ./config.sh' in text
    assert './svc.sh install "$runner_user"' in text


def test_a_trusted_runner_needs_an_organisations_runner_group_of_its_own(tmp_path):
    """Labels are no boundary (a pull request's workflow file picks any), so a
    trusted runner registers only at an organisation, into a named group
    that is not Default; each refusal comes before anything is installed."""
    role = tmp_path / "role"
    os.environ["PHYFARM_RUNNER_ROLE_FILE"] = str(role)
    try:
        p = run(tmp_path, None, "--trusted", "--url", "https://github.com/o/r")
        assert p.returncode == 2, p.stderr
        assert "--trusted needs --url https://github.com/ORG" in p.stderr
        p = run(tmp_path, None, "--trusted", "--url", "https://github.com/o")
        assert p.returncode == 2 and "--trusted needs --runner-group GROUP" in p.stderr
        p = run(
            tmp_path,
            None,
            "--trusted",
            "--url",
            "https://github.com/o",
            "--runner-group",
            "default",
        )
        assert p.returncode == 2 and "--runner-group Default" in p.stderr, p.stderr
        p = run(tmp_path, None, "--runner-group", "a;rm -rf /", "--url", "https://github.com/o")
        assert p.returncode == 2 and "--runner-group: letters" in p.stderr, p.stderr
        assert "host prerequisites" not in p.stderr
        assert not role.exists(), "a refused registration wrote the host's role"
    finally:
        del os.environ["PHYFARM_RUNNER_ROLE_FILE"]


@pytest.mark.parametrize(("had", "args"), [("pull-request", ["--trusted"]), ("trusted", [])])
def test_a_host_never_changes_role(tmp_path, had, args):
    """A host that registered a pull-request runner never gets a trusted one
    (a pull-request job there could have left anything behind), nor the
    other way round (a trusted host holds the store's credential)."""
    role = tmp_path / "role"
    role.write_text(had + "\n")
    os.environ["PHYFARM_RUNNER_ROLE_FILE"] = str(role)
    try:
        group = ["--runner-group", "phyfarm-trusted"]
        p = run(tmp_path, None, *args, *group, "--url", "https://github.com/o")
    finally:
        del os.environ["PHYFARM_RUNNER_ROLE_FILE"]
    assert p.returncode == 2, p.stderr
    assert f"this host already runs a {had} runner ({role})" in p.stderr, p.stderr
    assert "host prerequisites" not in p.stderr
    assert role.read_text() == had + "\n"
