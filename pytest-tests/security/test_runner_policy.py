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


#: The organisation's runner groups as GET /orgs/o/actions/runner-groups
#: returns them (the shape of GitHub's documented response).
GROUPS = {
    "total_count": 2,
    "runner_groups": [
        {
            "id": 1,
            "name": "Default",
            "visibility": "all",
            "default": True,
            "allows_public_repositories": False,
            "restricted_to_workflows": False,
            "selected_workflows": [],
        },
        {
            "id": 7,
            "name": "phyfarm-trusted",
            "visibility": "selected",
            "default": False,
            "selected_repositories_url": "https://api.github.com/orgs/o/actions/runner-groups/7/repositories",
            "allows_public_repositories": False,
            "restricted_to_workflows": True,
            "selected_workflows": [
                "o/r/.github/workflows/verdicts.yml@refs/heads/main",
                "o/r/.github/workflows/pull-request-report.yml@refs/heads/main",
            ],
        },
    ],
}


def run_trusted(tmp_path: Path, groups: dict, repos: list[str], token="ghp_" + "a" * 36):
    """setup-runner.sh --trusted against a stand-in for the API that answers
    the runner groups and the group's repositories by path."""
    import json

    if os.geteuid() != 0:
        pytest.skip("setup-runner.sh only runs as root")
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (tmp_path / "groups.json").write_text(json.dumps(groups))
    repo_doc = {"total_count": len(repos), "repositories": [{"full_name": r} for r in repos]}
    (tmp_path / "repos.json").write_text(json.dumps(repo_doc))
    # The token arrives on standard input (curl --config -), never in argv.
    curl = fake / "curl"
    curl.write_text(
        "#!/bin/sh\n"
        f'cat > "{tmp_path}/curl-stdin"; echo "$@" >> "{tmp_path}/curl-argv"\n'
        'case "$*" in\n'
        f'  */runner-groups/7/repositories*) cat "{tmp_path}/repos.json" ;;\n'
        f'  */actions/runner-groups*) cat "{tmp_path}/groups.json" ;;\n'
        "  *) exit 22 ;;\n"
        "esac\n"
    )
    curl.chmod(0o755)
    tf = tmp_path / "token"
    tf.write_text(token + "\n")
    role = tmp_path / "role"
    args = ["--trusted", "--url", "https://github.com/o", "--runner-group", "phyfarm-trusted"]
    args += ["--repo", "r", "--admin-token-file", str(tf), "--policy-only"]
    p = subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PATH": f"{fake}:{os.environ['PATH']}",
            "PHYFARM_RUNNER_ROLE_FILE": str(role),
        },
    )
    return p, tmp_path


def group_with(**changes) -> dict:
    import copy

    g = copy.deepcopy(GROUPS)
    g["runner_groups"][1].update(changes)
    return g


@pytest.mark.parametrize(
    ("groups", "repos", "says"),
    [
        (group_with(name="other"), ["o/r"], "runner group 'phyfarm-trusted': not among o's"),
        (group_with(default=True), ["o/r"], "is o's default group"),
        (group_with(visibility="all"), ["o/r"], 'visibility all, not "selected"'),
        (group_with(restricted_to_workflows=False), ["o/r"], "is not restricted to selected"),
        (group_with(selected_workflows=[]), ["o/r"], "may run workflows other than"),
        (
            group_with(
                selected_workflows=["o/r/.github/workflows/pull-request.yml@refs/heads/main"]
            ),
            ["o/r"],
            "pull-request.yml@refs/heads/main",
        ),
        (
            group_with(
                selected_workflows=["o/other/.github/workflows/verdicts.yml@refs/heads/main"]
            ),
            ["o/r"],
            "o/other/.github/workflows/verdicts.yml",
        ),
        (GROUPS, ["o/r", "o/forks-welcome"], "is open to o/r, o/forks-welcome, not to o/r alone"),
        (GROUPS, [], "is open to no repository"),
    ],
)
def test_a_trusted_runners_group_is_checked_through_the_api(tmp_path, groups, repos, says):
    """The group's own settings, read with the admin token: a group open to
    other repositories or workflows is refused before anything is installed,
    and the token never reaches a command line."""
    p, d = run_trusted(tmp_path, groups, repos)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr, p.stderr
    assert not (d / "role").exists()
    assert "ghp_" not in (d / "curl-argv").read_text()
    assert "Authorization: Bearer ghp_" in (d / "curl-stdin").read_text()


def test_a_well_kept_group_passes_the_check_and_a_bad_token_is_named(tmp_path):
    p, d = run_trusted(tmp_path, GROUPS, ["o/r"])
    assert p.returncode == 0, p.stderr
    assert "runner group 'phyfarm-trusted': o/r only" in p.stderr, p.stderr
    assert "policy: a trusted runner for https://github.com/o may be registered" in p.stderr
    assert "host prerequisites" not in p.stderr
    (tmp_path / "b").mkdir()
    p, _ = run_trusted(tmp_path / "b", GROUPS, ["o/r"], token="x;$(id)")
    assert p.returncode == 2 and "not a GitHub token" in p.stderr, p.stderr
