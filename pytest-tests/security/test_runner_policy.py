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
