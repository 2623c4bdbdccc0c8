"""Hostile pull requests, part 1: what a pull request can put in front of
phyfarm without running anything. Each test is one attack; each asserts
the attack fails, the refusal names what was refused, the exit code is 2
(bad input) or 1 (the code under test), and nothing of the runner leaks.

Part 2 (test_hostile_builds.py) runs hostile Makefiles in the build sandbox.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from conftest import REPO

SECRET = "runner-password-8c1f0e3a"

PATCH = """\
From 1111111111111111111111111111111111111111 Mon Sep 17 00:00:00 2001
From: A U Thor <author@example.org>
Date: Mon, 1 Jun 2026 10:00:00 +0000
Subject: [PATCH net-next v1 1/1] net: phy: ax88796b: {subject}
Message-Id: <hostile-1@example.org>

Body.

Signed-off-by: A U Thor <author@example.org>
---
 drivers/net/phy/ax88796b_rust.rs | 1 +
 1 file changed, 1 insertion(+)

diff --git a/drivers/net/phy/ax88796b_rust.rs b/drivers/net/phy/ax88796b_rust.rs
index 1111111..2222222 100644
--- a/drivers/net/phy/ax88796b_rust.rs
+++ b/drivers/net/phy/ax88796b_rust.rs
@@ -1,3 +1,4 @@
 a
 b
+c
 d
--\x20
2.47.0
"""

MANIFEST = """\
name = "hostile"
tree = "net-next"

[base]
package = "linux-source-6.12"
distro = "debian trixie"
"""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A runner file the attacks try to read (like ~/.pgpass)."""
    p = tmp_path / "runner-home" / ".pgpass"
    p.parent.mkdir()
    p.write_text(f"localhost:5432:phyfarm:ci:{SECRET}\n")
    return p


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """patches/hostile/ with series.toml and v1/0001-fix.patch, all regular."""
    s = tmp_path / "patches" / "hostile"
    (s / "v1").mkdir(parents=True)
    (s / "series.toml").write_text(MANIFEST)
    (s / "v1" / "0001-fix.patch").write_text(PATCH.format(subject="fix a thing"))
    return s


def no_leak(r) -> None:
    assert SECRET not in r.stdout and SECRET not in r.stderr, r.describe()


def test_the_series_fixture_loads_when_nothing_is_linked(phyfarm, series):
    r = phyfarm("series", "show", str(series / "v1"))
    assert r.code == 0, r.describe()
    assert "fix a thing" in r.stdout


def test_a_symlinked_series_toml_is_refused_unread(phyfarm, series, secret):
    (series / "series.toml").unlink()
    (series / "series.toml").symlink_to(secret)
    r = phyfarm("series", "show", str(series / "v1"))
    assert r.code == 2, r.describe()
    assert "series.toml" in r.stderr and "symbolic link" in r.stderr, r.describe()
    no_leak(r)


def test_a_symlinked_patch_is_refused_not_skipped(phyfarm, series, secret):
    (series / "v1" / "0002-more.patch").symlink_to(secret)
    r = phyfarm("series", "show", str(series / "v1"))
    assert r.code == 2, r.describe()
    assert "0002-more.patch" in r.stderr and "symbolic link" in r.stderr, r.describe()
    no_leak(r)


def test_a_symlinked_revision_folder_is_refused(phyfarm, series, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(series / "v1", elsewhere)
    (series / "v2").symlink_to(elsewhere)
    r = phyfarm("series", "show", str(series / "v2"))
    assert r.code == 2, r.describe()
    assert "v2" in r.stderr and "symbolic link" in r.stderr, r.describe()


def test_series_changed_refuses_a_link_committed_under_patches(phyfarm, series, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(series.parent, repo / "patches")

    def git(*args: str) -> str:
        p = subprocess.run(
            ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@example.org", *args],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
        )
        return p.stdout.strip()

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD")
    (repo / "patches" / "hostile" / "v1" / "0002-leak.patch").symlink_to("/etc/shadow")
    git("add", "-A")
    git("commit", "-q", "-m", "link")
    r = phyfarm("series", "changed", "--repo", str(repo), "--base", base, "--head", "HEAD")
    assert r.code == 2, r.describe()
    assert "patches/hostile/v1/0002-leak.patch" in r.stderr, r.describe()
    assert "symbolic link" in r.stderr, r.describe()


# -- reviews -----------------------------------------------------------------

OBJECTIONS = REPO / ".github" / "scripts" / "objections.jq"


def review(i: int, login: str, role: str, state: str = "CHANGES_REQUESTED") -> dict:
    return {
        "id": i,
        "user": {"login": login},
        "author_association": role,
        "state": state,
        "commit_id": f"{i:040x}",
        "body": f"review {i}\nsecond line",
    }


def test_only_maintainers_reviews_count_as_objections(tmp_path):
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (containers/runner/setup-runner.sh installs it)")
    reviews = [
        review(1, "drive-by", "NONE"),
        review(2, "first-timer", "FIRST_TIME_CONTRIBUTOR"),
        review(3, "contributor", "CONTRIBUTOR"),
        review(4, "maintainer", "MEMBER"),
        review(5, "owner", "OWNER"),
        review(6, "collaborator", "COLLABORATOR"),
        review(7, "happy-member", "MEMBER", state="APPROVED"),
    ]
    page = tmp_path / "reviews.json"
    # gh api --paginate writes one array per page.
    page.write_text(json.dumps(reviews[:3]) + json.dumps(reviews[3:]))
    out = subprocess.run(
        ["jq", "-r", "-f", str(OBJECTIONS), str(page)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    assert [r[1] for r in rows] == ["maintainer", "owner", "collaborator"], out
    assert all(r[3] == f"review {r[0]}" for r in rows), "only the first line of the text"


def test_verdicts_workflow_counts_reviews_only_through_the_role_filter():
    wf = yaml.safe_load((REPO / ".github/workflows/verdicts.yml").read_text())
    script = " ".join(s.get("run", "") for s in wf["jobs"]["verdicts"]["steps"])
    assert "jq -r -f .github/scripts/objections.jq" in script
    assert "CHANGES_REQUESTED" not in script, "a second, unfiltered review query"
    assert "--nack" in script
    # The reviewed commit's files are data: phyfarm reads them from git's
    # objects (`series changed` refuses a link or submodule), nothing of the
    # commit is checked out or extracted, and a refusal records nothing.
    assert '"$PHYFARM" series changed --base "$base" --head "$commit" --json' in script
    assert "tar " not in script and "git checkout" not in script
    assert '--nack "$series/v$version"' in script


def test_the_build_job_never_uploads_a_link():
    wf = yaml.safe_load((REPO / ".github/workflows/pull-request.yml").read_text())
    steps = wf["jobs"]["build"]["steps"]
    names = [s.get("name", "") for s in steps]
    guard = names.index("Refuse to publish anything but regular files")
    upload = next(i for i, s in enumerate(steps) if "upload-artifact" in s.get("uses", ""))
    assert guard < upload
    assert steps[guard]["if"] == "always()" and "find out -type l" in steps[guard]["run"]


def test_every_python_tool_is_pinned():
    lines = (REPO / "pytest-tests/requirements.txt").read_text().splitlines()
    reqs = [x.strip() for x in lines if x.strip() and not x.lstrip().startswith("#")]
    assert reqs
    unpinned = [r for r in reqs if not re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.+-]*", r)]
    assert not unpinned, unpinned
    assert any(r.startswith("zizmor==") for r in reqs)


# -- what gets posted --------------------------------------------------------

HOSTILE = (
    "ping @torvalds and @netdev/maintainers: https://evil.example/x www.evil.example "
    "![t](https://evil.example/t.png) [click](https://evil.example) <img src=x>"
)
FIXTURES = REPO / "pipeline/tests/fixtures/results"


def test_the_markdown_summary_neutralises_mentions_and_links(phyfarm, tmp_path):
    store = tmp_path / "results.sqlite"
    v8 = json.loads((FIXTURES / "v8.json").read_text())
    v8["revision"]["patches"][0]["subject"] = HOSTILE
    hostile = tmp_path / "v8.json"
    hostile.write_text(json.dumps(v8))
    for f in (FIXTURES / "base.json", hostile):
        r = phyfarm("--store", str(store), "store", "import", str(f))
        assert r.code == 0, r.describe()
    r = phyfarm(
        "--store", str(store), "export", "markdown", "rust-phy-enum-check/v8",
        "--now", "2026-06-16T00:00:00Z",
    )  # fmt: skip
    assert r.code in (0, 1), r.describe()
    md = r.stdout
    assert "torvalds" in md, "the subject is in the summary"
    assert not re.search(r"(?<![\w])@(torvalds|netdev)", md), md
    assert "https://evil" not in md and "www.evil" not in md, md
    assert "![t](" not in md and "](https://evil" not in md and "<img" not in md, md


def report_script() -> str:
    wf = yaml.safe_load((REPO / ".github/workflows/pull-request-report.yml").read_text())
    steps = wf["jobs"]["report"]["steps"]
    return next(s["with"]["script"] for s in steps if "github-script" in s.get("uses", ""))


def run_node(snippet: str, name: str, arg: str):
    if shutil.which("node") is None:
        pytest.skip("node is not installed: cannot run the report workflow's script")
    script = report_script()
    m = re.search(rf"// BEGIN {name}\n(.*?)// END {name}", script, re.S)
    assert m, f"the report script has no {name} block"
    prog = m.group(1) + f"\nprocess.stdout.write(JSON.stringify({snippet}));"
    p = subprocess.run(
        ["node", "-e", prog, "--", arg], capture_output=True, text=True, check=True, timeout=30
    )
    return json.loads(p.stdout)


def test_the_report_job_neutralises_what_the_untrusted_run_wrote():
    out = run_node("neutralise(process.argv[1])", "neutralise", HOSTILE + "\x1b]0;title\x07")
    assert "torvalds" in out
    assert not re.search(r"@(torvalds|netdev)", out), out
    assert "://" not in out and "www.evil" not in out, out
    assert "![" not in out and "](" not in out and "<img" not in out, out
    assert "\x1b" not in out and "\x07" not in out


def test_the_report_job_validates_the_summary_it_is_handed():
    forged = {
        "pr": "7; rm -rf /",
        "head_sha": "HEAD",
        "revisions": [
            {"dir": "patches/ok/v2", "status": "added"},
            {"dir": "patches/../../etc/v1", "status": "added"},
            {"dir": "patches/x/v1", "status": "success"},
        ],
        "conclusion": "success",
    }
    out = run_node("validate(process.argv[1])", "validate", json.dumps(forged))
    assert out == {
        "pr": None,
        "head_sha": None,
        "revisions": [{"dir": "patches/ok/v2", "status": "added"}],
    }
    script = report_script()
    assert "conclusion: 'neutral'" in script
    assert "run.conclusion === 'success'" not in script and "conclusion," not in script
    # The pull request is taken by number and confirmed by its head commit.
    assert "pulls.get" in script and "pr.head.sha !== run.head_sha" in script


# -- the guest agent ---------------------------------------------------------


def test_an_endless_agent_line_is_cut_off_not_buffered(tmp_path, monkeypatch):
    from phyfarm_farm import agent as agent_mod
    from phyfarm_farm.errors import AgentError

    monkeypatch.setattr(agent_mod, "MAX_LINE", 1 << 20)
    path = tmp_path / "agent.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def hostile_guest():
        conn, _ = srv.accept()
        conn.sendall(b'{"ready": true}\n')
        conn.recv(4096)  # the request
        chunk = b"x" * 65536
        try:
            for _ in range(64):  # 4 MiB, no newline
                conn.sendall(chunk)
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=hostile_guest, daemon=True)
    t.start()
    a = agent_mod.Agent(path, lambda: None)
    a.connect(deadline=__import__("time").monotonic() + 5)
    a.wait_ready(5)
    with pytest.raises(AgentError) as e:
        a.run(["true"], timeout=5)
    assert "longer than 1048576 bytes" in str(e.value)
    t.join(5)
    srv.close()


# -- QEMU ------------------------------------------------------------------------


def test_the_farm_guest_runs_qemu_sandboxed_and_unprivileged(monkeypatch):
    """The farm's guests are confined as phyfarm decides (`phyfarm guest
    machine`): the seccomp sandbox and, as root, the drop to the QEMU user
    spelled for the installed QEMU. The harness adds nothing of its own."""
    from phyfarm_farm import guest

    if os.geteuid() != 0:
        pytest.skip("the drop to another user is decided only for a root harness")
    monkeypatch.setenv("PHYFARM_QEMU_USER", "nobody")
    monkeypatch.setattr(guest, "_MACHINES", {})
    cfg = guest.GuestConfig(kernel=Path("/k"), initrd=Path("/i"), accel="tcg")
    argv = guest.qemu_argv(cfg, Path("/c"), Path("/s"))
    assert argv.count("-sandbox") == 1, argv
    i = argv.index("-sandbox")
    assert argv[i + 1].startswith("on,obsolete=deny,"), argv
    assert "spawn=deny" in argv[i + 1] and "resourcecontrol=deny" in argv[i + 1]
    assert "elevateprivileges=allow" in argv[i + 1]
    if guest.qemu_version() >= (9, 1):
        assert argv[argv.index("-run-with") + 1] == "user=nobody"
    else:
        assert argv[argv.index("-runas") + 1] == "nobody"
    assert guest.qemu_user().name == "nobody"


def test_qemu_drops_root_and_keeps_its_seccomp_filter(monkeypatch):
    """The confinement the farm uses, on the real QEMU: the process that
    would run the kernel is not root, has no capabilities, no_new_privs and
    a seccomp filter."""
    import time

    from phyfarm_farm import guest

    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("qemu-system-x86_64 is not installed")
    if os.geteuid() != 0:
        pytest.skip("the harness is not root: QEMU is unprivileged already")
    monkeypatch.setattr(guest, "_MACHINES", {})
    if guest.qemu_user() is None:
        monkeypatch.setenv("PHYFARM_QEMU_USER", "nobody")
        monkeypatch.setattr(guest, "_MACHINES", {})
    desc = guest.machine("tcg")
    user = desc["qemu_user"]
    argv = [
        "qemu-system-x86_64", "-M", "none", "-display", "none", "-nodefaults", "-S",
        *desc["confinement"],
    ]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        status = ""
        for _ in range(100):
            time.sleep(0.05)
            assert p.poll() is None, p.stdout.read().decode()
            status = Path(f"/proc/{p.pid}/status").read_text()
            if re.search(r"^Uid:\s+[1-9]", status, re.M):
                break
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Uid"].split()[0] == str(user["uid"]), status
        assert int(fields["CapEff"].strip(), 16) == 0, status
        assert fields["NoNewPrivs"].strip() == "1", status
        assert fields["Seccomp"].strip() == "2", status
    finally:
        p.kill()
        p.wait()


# -- the dashboard's static export ---------------------------------------------


def test_the_static_dashboard_export_carries_a_content_security_policy(phyfarm, tmp_path):
    store = tmp_path / "results.sqlite"
    v8 = json.loads((FIXTURES / "v8.json").read_text())
    v8["revision"]["patches"][0]["subject"] = '<script>alert(1)</script><img src=x onerror="x()">'
    hostile = tmp_path / "v8.json"
    hostile.write_text(json.dumps(v8))
    for f in (FIXTURES / "base.json", hostile):
        r = phyfarm("--store", str(store), "store", "import", str(f))
        assert r.code == 0, r.describe()
    site = tmp_path / "site"
    r = phyfarm(
        "--store", str(store), "dashboard", "export", str(site), "--now", "2026-06-16T00:00:00Z"
    )  # fmt: skip
    assert r.code == 0, r.describe()
    pages = sorted(site.rglob("*.html"))
    assert pages
    for p in pages:
        html = p.read_text()
        head = html[: html.index("</head>")]
        m = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)"', head)
        assert m, f"{p}: no CSP"
        csp = m.group(1).replace("&#39;", "'")
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, csp
        assert "unsafe-inline" not in csp, csp
        # The policy comes before anything it governs.
        assert head.index("Content-Security-Policy") < head.index("<link"), p
        assert "<script>alert(1)" not in html


def test_qemu_gets_its_peer_sockets_and_not_the_control_socket(tmp_path):
    import pwd

    from phyfarm_farm import guest

    if os.geteuid() != 0:
        pytest.skip("handing sockets to another group needs root")
    sockdir = tmp_path / "socks"
    sockdir.mkdir(mode=0o700)
    socks = []
    for name in ("usb.sock", "emu.sock", "ctl.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sockdir / name))
        socks.append(s)
    user = pwd.getpwnam("nobody")
    cfg = guest.GuestConfig(
        kernel=Path("/k"),
        initrd=Path("/i"),
        accel="tcg",
        usb=("unix", sockdir / "usb.sock"),
        wire=(sockdir / "partner.sock", sockdir / "emu.sock"),
    )
    guest.share_with_qemu(sockdir, user.pw_gid, guest.peer_sockets(cfg))
    st = {p.name: p.lstat() for p in sockdir.iterdir()}
    assert st["usb.sock"].st_gid == user.pw_gid and st["usb.sock"].st_mode & 0o020
    assert st["emu.sock"].st_gid == user.pw_gid and st["emu.sock"].st_mode & 0o020
    assert st["ctl.sock"].st_gid == 0 and not st["ctl.sock"].st_mode & 0o020
    assert sockdir.stat().st_mode & 0o777 == 0o710
    for s in socks:
        s.close()


HARNESS = """
const fs = require('fs');
const [script, dir, prJson] = process.argv.slice(1);
process.chdir(dir);
const calls = [];
const pr = JSON.parse(prJson);
const github = {
  rest: {
    checks: { create: async (a) => calls.push(['check', a]) },
    pulls: { get: async (a) => ({ data: { number: a.pull_number, ...pr } }) },
    issues: {
      listComments: 'list',
      updateComment: async (a) => calls.push(['update', a]),
      createComment: async (a) => calls.push(['comment', a]),
    },
  },
  paginate: async () => [],
};
const context = {
  repo: { owner: 'o', repo: 'r' },
  payload: { workflow_run: {
    head_sha: 'a'.repeat(40), conclusion: 'success',
    html_url: 'https://github.com/o/r/actions/runs/1',
    head_repository: { full_name: 'fork/r' },
  } },
};
const core = { info: (m) => calls.push(['info', m]) };
eval('(async function(){\\n' + fs.readFileSync(script, 'utf8') + '\\n})')()
  .then(() => process.stdout.write(JSON.stringify(calls)));
"""


@pytest.mark.parametrize(
    "pr, comments",
    [
        ({"state": "open", "head": {"sha": "a" * 40, "repo": {"full_name": "fork/r"}}}, True),
        ({"state": "open", "head": {"sha": "b" * 40, "repo": {"full_name": "fork/r"}}}, False),
        ({"state": "open", "head": {"sha": "a" * 40, "repo": {"full_name": "evil/r"}}}, False),
        ({"state": "closed", "head": {"sha": "a" * 40, "repo": {"full_name": "fork/r"}}}, False),
    ],
    ids=["matching", "other-head", "other-fork", "closed"],
)
def test_the_report_job_comments_only_on_the_matching_pull_request(tmp_path, pr, comments):
    if shutil.which("node") is None:
        pytest.skip("node is not installed: cannot run the report workflow's script")
    (tmp_path / "summary").mkdir()
    (tmp_path / "summary/summary.json").write_text(
        json.dumps({"pr": 7, "head_sha": "a" * 40, "revisions": [], "conclusion": "success"})
    )
    (tmp_path / "summary/summary.md").write_text(HOSTILE)
    script = tmp_path / "report.js"
    script.write_text(report_script())
    p = subprocess.run(
        ["node", "-e", HARNESS, "--", str(script), str(tmp_path), json.dumps(pr)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    calls = json.loads(p.stdout)
    checks = [c[1] for c in calls if c[0] == "check"]
    assert len(checks) == 1 and checks[0]["conclusion"] == "neutral", checks
    assert "@torvalds" not in checks[0]["output"]["summary"]
    posted = [c[1] for c in calls if c[0] in ("comment", "update")]
    if comments:
        assert len(posted) == 1 and posted[0]["issue_number"] == 7, calls
        assert "@torvalds" not in posted[0]["body"] and "https://evil" not in posted[0]["body"]
    else:
        assert posted == [], calls
