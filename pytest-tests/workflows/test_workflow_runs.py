"""The fleet path end to end: the workflows' jobs run as written (see
executor.py), with the real phyfarm, a real SQLite store and a git origin
holding the shipped series, for pull requests a maintainer and a stranger
open and for a maintainer's objection.

The build and farm jobs of pull-request.yml need the kbuild container and
QEMU guests; their artifacts are the outputs of a real run kept in
pipeline/tests/fixtures/real-run, split per variant and check group as the
matrix uploads them. Everything after them (collect, the trusted record in
pull-request-report.yml, the verdicts job) runs here. Each scenario asserts
the store's end state; a refusal leaves the store's dump unchanged.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from executor import Executor

from conftest import REPO

WORKFLOWS = REPO / ".github" / "workflows"
REAL_RUN = REPO / "pipeline" / "tests" / "fixtures" / "real-run"
SERIES = "rust-phy-enum-check"
MAINTAINER = "maint"
#: The repository the workflows run in.
BASE_REPO = "phyfarm/phyfarm"


def git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    p = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, f"git {args}: {p.stderr}"
    return p.stdout.strip()


def relabel(src: Path, dest: Path, version: int) -> None:
    """A copy of a revision folder whose subjects say `v<version>`."""
    dest.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        text = f.read_text().replace("net-next v8 ", f"net-next v{version} ")
        (dest / f.name).write_text(text)


class Origin:
    """The repository the workflows check out: the default branch holds
    the series (owned by MAINTAINER) with v7; pull request 1 (the
    maintainer's) adds v8 and was force-pushed once; pull request 2 (a
    stranger's) adds v9."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "origin.git"
        work = root / "seed"
        git(root, "init", "--quiet", "--bare", "-b", "main", str(self.bare))
        git(self.bare, "config", "uploadpack.allowAnySHA1InWant", "true")
        git(root, "init", "--quiet", "-b", "main", str(work))
        # The whole repository as committed (and as edited, when a test runs
        # on a work tree): the trusted record job builds and runs the farm
        # from its checkout. The series folders are the origin's own.
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        for f in (x.decode() for x in files if x):
            src = REPO / f
            if f.startswith("patches/") or not src.is_file() or src.is_symlink():
                continue
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / f)
        series = work / "patches" / SERIES
        series.mkdir(parents=True)
        manifest = (REPO / "patches" / SERIES / "series.toml").read_text()
        assert "\nowners = []\n" in manifest, "the shipped series names its owners"
        manifest = manifest.replace("\nowners = []\n", f'\nowners = ["github:{MAINTAINER}"]\n', 1)
        (series / "series.toml").write_text(manifest)
        shutil.copytree(REPO / "patches" / SERIES / "v7", series / "v7")
        git(work, "add", "-A")
        git(work, "commit", "--quiet", "-m", "the series with v7")
        self.main = git(work, "rev-parse", "HEAD")
        git(work, "push", "--quiet", str(self.bare), "main")
        # Pull request 1: v8, reviewed, then force-pushed (a new commit
        # message), so the reviewed commit is on no ref any more.
        git(work, "checkout", "--quiet", "-b", "pr1")
        shutil.copytree(REPO / "patches" / SERIES / "v8", series / "v8")
        git(work, "add", "-A")
        git(work, "commit", "--quiet", "-m", "v8")
        self.pr1_reviewed = git(work, "rev-parse", "HEAD")
        git(work, "push", "--quiet", str(self.bare), "HEAD:refs/pull/1/head")
        git(work, "commit", "--quiet", "--amend", "-m", "v8, forward-ported to 6.12")
        self.pr1 = git(work, "rev-parse", "HEAD")
        git(work, "push", "--quiet", "--force", str(self.bare), "HEAD:refs/pull/1/head")
        # Pull request 2: a stranger's v9 of the same series.
        git(work, "checkout", "--quiet", "-b", "pr2", "main")
        relabel(REPO / "patches" / SERIES / "v8", series / "v9", 9)
        git(work, "add", "-A")
        git(work, "commit", "--quiet", "-m", "v9")
        self.pr2 = git(work, "rev-parse", "HEAD")
        git(work, "push", "--quiet", str(self.bare), "HEAD:refs/pull/2/head")
        # The pull request's series as it checks it out, for its artifacts.
        shutil.copytree(series, root / "pr2" / SERIES)
        self.v9 = root / "pr2" / SERIES / "v9"
        # Pull request 3: a new series whose series.toml names a path out
        # of the cache and the store's keys.
        git(work, "checkout", "--quiet", "-b", "pr3", "main")
        hostile = work / "patches" / "evil"
        relabel(REPO / "patches" / SERIES / "v8", hostile / "v1", 1)
        (hostile / "series.toml").write_text(
            'name = "../../escape"\ntree = "net-next"\n'
            'base = { package = "linux-source-6.12", distro = "debian trixie" }\n'
        )
        git(work, "add", "-A")
        git(work, "commit", "--quiet", "-m", "a hostile series")
        self.pr3 = git(work, "rev-parse", "HEAD")
        git(work, "push", "--quiet", str(self.bare), "HEAD:refs/pull/3/head")


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Origin:
    for tool in ("git", "jq", "bash"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the workflows' steps need it")
    return Origin(tmp_path_factory.mktemp("origin"))


@pytest.fixture(scope="module")
def binaries(phyfarm, tmp_path_factory) -> Path:
    """A `cargo` that installs, where `cargo build` would leave them, the
    binaries under test: the phyfarm (and the dashboard binary beside it)
    for `-p phyfarm`, and for `--bin NAME` (the emulator, the guest's agent)
    this checkout's build of NAME for the same profile and target."""
    stubs = tmp_path_factory.mktemp("stubs")
    script = f"""#!/usr/bin/env python3
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
assert args[0] == "build", args
def opt(name):
    return args[args.index(name) + 1] if name in args else None
if opt("-p") == "phyfarm":
    pairs = [(Path({str(phyfarm.binary)!r}), Path("target/debug/phyfarm"))]
    dashboard = Path({str(phyfarm.binary.with_name("phyfarm-dashboard"))!r})
    if dashboard.exists():
        pairs.append((dashboard, Path("target/debug/phyfarm-dashboard")))
else:
    rel = Path(*([opt("--target")] if opt("--target") else []))
    rel = rel / ("release" if "--release" in args else "debug") / opt("--bin")
    pairs = [(Path({str(REPO / "target")!r}) / rel, Path("target") / rel)]
for src, dest in pairs:
    if not src.is_file():
        sys.exit(f"cargo (test stub): {{src}} is not built")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
"""
    (stubs / "cargo").write_text(script)
    (stubs / "cargo").chmod(0o755)
    return stubs


def split_real_run(artifacts: Path, name: str, series_json: dict | None = None) -> None:
    """The real run's outputs as the matrix uploads them: one build per
    variant (`build-<name>-<variant>`), one farm result per variant and
    check group (`farm-<name>-<variant>-<group>`)."""
    build = json.loads((REAL_RUN / "series-build.json").read_text())
    if series_json is not None:
        build["series"] = series_json
    for v in ("rust", "c"):
        part = copy.deepcopy(build)
        part["base"] = {v: build["base"][v]}
        part["builds"] = [b for b in build["builds"] if b["variant"] == v]
        part["gates"] = build["gates"] if v == "rust" else []
        d = artifacts / f"build-{name}-{v}" / f"{name}-{v}"
        d.mkdir(parents=True)
        (d / "series-build.json").write_text(json.dumps(part))
    for side, root in (("farm", REAL_RUN), ("basefarm", REAL_RUN / "base")):
        split_farm(artifacts, name, side, root)


def split_farm(artifacts: Path, name: str, side: str, root: Path) -> None:
    """One side's farm results (the revision's or the base's), per variant
    and check group, as `<side>-<name>-<variant>-<group>`."""
    docs = [
        json.loads((root / f / "results.json").read_text()) for f in ("farm", "farm-throughput")
    ]
    groups: dict[tuple[str, str], list] = {}
    for doc in docs:
        for t in doc["tests"]:
            group = t["id"].split("[")[0].split(".")[1]
            groups.setdefault((t["variant"], group), []).append(t)
    order = ["FAIL", "ERROR", "MISS", "PASS", "DONE", "SKIP"]
    for (v, group), tests in groups.items():
        doc = {k: val for k, val in docs[0].items() if k not in ("tests", "counts", "status")}
        counts: dict[str, int] = {}
        for t in tests:
            counts[t["status"]] = counts.get(t["status"], 0) + 1
        doc.update(
            tests=tests,
            counts=counts,
            status=min((t["status"] for t in tests), key=order.index),
        )
        d = artifacts / f"{side}-{name}-{v}-{group}" / f"{name}-{v}-{group}"
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps(doc))


class Fleet:
    """One scenario: the trusted runner's store, and runs of workflows."""

    def __init__(self, root: Path, origin: Origin, stubs: Path, pg: tuple[str, str] | None) -> None:
        self.root = root
        self.origin = origin
        # SQLite: a file. PostgreSQL: a schema of its own on the test server.
        self.pg = pg
        if pg:
            url, schema = pg
            self.store = f"{url}?options=-csearch_path%3D{schema}"
        else:
            self.store = root / "fleet.sqlite"
        self.env = {
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "HOME": str(root / "home"),
            "PHYFARM_CACHE": str(root / "cache"),
            "LANG": "C.UTF-8",
        }
        (root / "home").mkdir()

    def executor(self, workflow: str, run: str, event: dict, sha: str, **kw) -> Executor:
        return Executor(
            WORKFLOWS / workflow,
            root=self.root / run,
            origin=self.origin.bare,
            event=event,
            sha=sha,
            artifacts=self.root / run / "artifacts",
            env=kw.pop("env", self.env),
            **kw,
        )

    def pull_request(self, number: int, head: str, forge=None) -> Executor:
        """pull-request.yml for pull request `number` at `head`; the build
        and farm jobs' artifacts come from the real run, then `forge` may
        edit them (the pull request controls them)."""
        event = {
            "pull_request": {
                "number": number,
                "base": {"sha": self.origin.main},
                "head": {"sha": head},
            }
        }
        pr = self.executor("pull-request.yml", f"pr{number}", event, head)
        pr.run(["detect"])
        assert pr.results["detect"].conclusion == "success", pr.results["detect"].text()
        revisions = json.loads(pr.results["detect"].outputs["revisions"])
        for r in revisions:
            name = f"{r['series']}-v{r['version']}"
            series = None
            if r["version"] == 9:
                series = json.loads(
                    subprocess.run(
                        [self.env_phyfarm(), "series", "show", "--json", str(self.origin.v9)],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                )
            split_real_run(pr.artifacts, name, series)
        if forge:
            forge(pr.artifacts)
        pr.run(["collect"], replaced={"build": "real-run fixture", "farm": "real-run fixture"})
        return pr

    def env_phyfarm(self) -> str:
        return os.environ.get("PHYFARM_BIN", str(REPO / "target/debug/phyfarm"))

    def trusted_record(
        self,
        pr: Executor,
        author: str,
        cache: Path | None = None,
        actor: str | None = None,
        head_repo: str | None = None,
    ) -> dict:
        """pull-request-report.yml's record job for that run, on the
        trusted runner (PHYFARM_STORE is the fleet's; `cache` its phyfarm
        cache, this scenario's own, empty one by default). The pull request
        comes from `author`'s fork unless `head_repo` says otherwise; the
        event's actor is `actor`, else the author."""
        event = {
            "workflow_run": {
                "id": 4242,
                "event": "pull_request",
                "head_sha": pr.sha,
                "actor": {"login": actor or author},
                "head_repository": {
                    "full_name": head_repo or f"{author}/phyfarm",
                    "owner": {"login": author},
                },
            },
            "repository": {"default_branch": "main", "full_name": BASE_REPO},
        }
        report = Executor(
            WORKFLOWS / "pull-request-report.yml",
            root=self.root / f"report-{pr.name}-{pr.event['pull_request']['number']}",
            origin=self.origin.bare,
            event=event,
            sha=self.origin.main,
            artifacts=pr.artifacts,
            env={
                **self.env,
                "PHYFARM_STORE": str(self.store),
                **({"PHYFARM_CACHE": str(cache)} if cache else {}),
            },
        )
        self.report = report
        # `report` posts a neutral check with github-script: GitHub only.
        return report.run(["record"])

    def seed_v8(self, tmp: Path) -> None:
        """The store as the maintainers' v8 left it: the real run's results
        recorded as the pull-request matrix uploads them (`phyfarm record`,
        not the workflow: the scenarios that start from it test what comes
        after)."""
        parts = tmp / "seed"
        split_real_run(parts, f"{SERIES}-v8")
        args = [f"--build={d}" for d in sorted(parts.glob("build-*/*"))]
        args += [f"--farm={d}" for d in sorted(parts.glob("farm-*/*"))]
        args += [f"--base-farm={d}" for d in sorted(parts.glob("basefarm-*/*"))]
        p = self.phyfarm(
            "record", "--series", str(REPO / "patches" / SERIES / "v8"),
            "-o", str(tmp / "seed-out"), *args,
        )  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        assert self.verdict(f"{SERIES}/v8")["state"] == "awaiting-review"

    def phyfarm(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.env_phyfarm(), "--store", str(self.store), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    def verdict(self, revision: str) -> dict:
        p = self.phyfarm("verdict", revision, "--json")
        assert p.returncode in (0, 1, 2), p.stderr
        return json.loads(p.stdout)


@pytest.fixture(params=["sqlite", "postgres"])
def fleet(request, tmp_path, origin, binaries):
    if request.param == "sqlite":
        yield Fleet(tmp_path, origin, binaries, None)
        return
    url = os.environ.get("PHYFARM_TEST_POSTGRES")
    if not url:
        pytest.skip(
            "PHYFARM_TEST_POSTGRES is not set (`make unit` starts a server with "
            "containers/postgres-test.sh): the PostgreSQL fleet store cannot be tested"
        )
    schema = re.sub(r"\W", "_", f"wf_{os.getpid()}_{tmp_path.name}").lower()[:60]
    psql(url, f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")
    yield Fleet(tmp_path, origin, binaries, (url, schema))
    psql(url, f"DROP SCHEMA {schema} CASCADE")


def psql(url: str, sql: str) -> str:
    p = subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


REVISIONS_SQL = (
    "SELECT s.name, r.version, r.patchset_hash FROM {s}revisions r"
    " JOIN {s}series s ON s.id = r.series_id ORDER BY 1, 2"
)


def recorded_revisions(fleet: Fleet) -> list[tuple[str, int, str]]:
    if fleet.pg:
        url, schema = fleet.pg
        rows = psql(url, REVISIONS_SQL.format(s=f"{schema}."))
        return [
            (n, int(v), h) for n, v, h in (line.split("|") for line in rows.splitlines() if line)
        ]
    if not Path(fleet.store).exists():
        return []
    with sqlite3.connect(fleet.store) as con:
        return con.execute(REVISIONS_SQL.format(s="")).fetchall()


def dump(fleet: Fleet) -> str:
    """Everything the store holds, to compare before and after."""
    if fleet.pg:
        url, schema = fleet.pg
        p = subprocess.run(
            ["pg_dump", "--schema", schema, "--no-owner", url],
            capture_output=True,
            text=True,
            check=False,
        )
        assert p.returncode == 0, p.stderr
        # \restrict and \unrestrict carry a random key per dump.
        return "\n".join(x for x in p.stdout.splitlines() if "restrict " not in x)
    if not Path(fleet.store).exists():
        return "<no store>"
    with sqlite3.connect(fleet.store) as con:
        return "\n".join(con.iterdump())


def shared_cache() -> Path:
    """The phyfarm cache `make test` uses (the kernel source, the base's
    builds, the images): the trusted runner's cache of these scenarios."""
    if os.environ.get("PHYFARM_CACHE"):
        return Path(os.environ["PHYFARM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "phyfarm"


@pytest.fixture(scope="module")
def emulator_built() -> None:
    """The emulator's release build of this checkout, which the trusted
    run's `cargo build --release -p ax88772` installs (see `binaries`)."""
    p = subprocess.run(
        ["cargo", "build", "--quiet", "--release", "-p", "ax88772", "--bin", "ax88772-emu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stderr


def forge_series_build(artifacts: Path) -> None:
    for f in artifacts.glob(f"build-{SERIES}-v8-*/*/series-build.json"):
        doc = json.loads(f.read_text())
        doc["series"]["version"] = 99
        f.write_text(json.dumps(doc))


def forge_results_counts(artifacts: Path) -> None:
    """A FAIL, and the summary fields claiming it passed."""
    f = next(artifacts.glob(f"farm-{SERIES}-v8-rust-probe/*/results.json"))
    doc = json.loads(f.read_text())
    doc["tests"][0]["status"] = "FAIL"
    f.write_text(json.dumps(doc))


def forge_results_verdict(artifacts: Path) -> None:
    """A verdict of its own, in a field phyfarm does not read."""
    f = next(artifacts.glob(f"farm-{SERIES}-v8-c-dmesg/*/results.json"))
    doc = json.loads(f.read_text())
    doc["verdict"] = "ready-to-merge"
    f.write_text(json.dumps(doc))


def forge_everything(artifacts: Path) -> None:
    for forge in (forge_series_build, forge_results_counts, forge_results_verdict):
        forge(artifacts)


@pytest.mark.slow
@pytest.mark.parametrize("fleet", ["postgres"], indirect=True)
def test_the_trusted_runner_builds_and_tests_the_revision_itself(
    fleet, origin, podman, emulator_built
):
    """A maintainer's pull request adding v8, whose run uploaded forged
    artifacts: the trusted record job reads none of them. It parses the
    patches, builds the revision and the base, runs the whole farm plan
    on its own kernels and records that, in the fleet's PostgreSQL store.
    (One store: the run takes minutes; SQLite takes the same path in
    `make run`.)"""
    pr = fleet.pull_request(1, origin.pr1, forge=forge_everything)
    # The pull request's own run refuses its forged artifacts.
    assert pr.results["collect"].conclusion == "failure", pr.results["collect"].text()
    record = fleet.trusted_record(pr, MAINTAINER, cache=shared_cache())["record"]
    v8 = REPO / "patches" / SERIES / "v8"
    parsed = json.loads(
        subprocess.run(
            [fleet.env_phyfarm(), "series", "show", "--json", str(v8)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert recorded_revisions(fleet) == [(SERIES, 8, parsed["patchset_hash"])], record.text()
    v = fleet.verdict(f"{SERIES}/v8")
    # Every planned check reported and judged against the base measured
    # here: the revision awaits review and the job passes.
    assert v["state"] == "awaiting-review", (v["reason"], record.text())
    assert record.conclusion == "success", record.text()
    # What the store holds is this runner's run: its run id and results
    # are those the job's `phyfarm run` wrote, not the pull request's.
    ws = fleet.report.root / "runner" / "pull-request-report" / "record-0"
    own = json.loads((ws / "records" / f"{SERIES}-v8" / "results.json").read_text())
    base = json.loads((ws / "records" / f"{SERIES}-v8" / "results-base.json").read_text())
    assert (v["runs"], v["base_run"]) == ([own["id"]], base["id"]), v
    probes = [c for c in v["checks"] if c["path"].startswith("farm.probe")]
    assert probes and {c["status"] for c in probes} == {"PASS"}, probes
    assert "farm.link_flap" in {c["path"].split("[")[0] for c in v["checks"]}, v["checks"]
    assert "I: link partner:" in record.text(), record.text()


@pytest.mark.parametrize(
    ("forge", "names"),
    [
        (forge_series_build, "series-build.json: series.version: the artifact claims v99"),
        (forge_results_counts, "results.json: counts:"),
        (forge_results_verdict, "unknown field `verdict`"),
    ],
    ids=["series-build.json", "results.json-counts", "results.json-field"],
)
def test_a_forged_artifact_fails_the_pull_requests_own_run(fleet, origin, forge, names):
    """The pull request's summary is built from its artifacts: a forged one
    is refused there, naming the file and field (the trusted side never
    reads them: test_the_trusted_runner_builds_and_tests_the_revision_itself)."""
    pr = fleet.pull_request(1, origin.pr1, forge=forge)
    collect = pr.results["collect"]
    assert collect.conclusion == "failure", collect.text()
    assert names in collect.text(), collect.text()


def test_the_trusted_record_job_reads_no_artifact_of_the_pull_requests_run():
    wf = yaml.safe_load((WORKFLOWS / "pull-request-report.yml").read_text())
    job = wf["jobs"]["record"]
    uses = [s.get("uses", "").split("@")[0] for s in job["steps"]]
    assert "actions/download-artifact" not in uses, uses
    assert "actions" not in job.get("permissions", {}), job["permissions"]
    script = "\n".join(s.get("run", "") for s in job["steps"])
    assert '"$phyfarm" run "pr/$dir"' in script and "--owners-from patches" in script
    assert "results/" not in script and " record " not in script, script


def test_a_stranger_cannot_add_a_revision_to_a_series_they_do_not_own(fleet, origin, tmp_path):
    fleet.seed_v8(tmp_path)
    before = dump(fleet)
    pr = fleet.pull_request(2, origin.pr2)
    record = fleet.trusted_record(pr, "mallory")["record"]
    assert record.conclusion == "failure", record.text()
    assert "owners: github:mallory is not an owner of series" in record.text(), record.text()
    # Refused before anything was built: the runner's cache is untouched.
    assert not (fleet.root / "cache" / "trees").exists(), record.text()
    assert dump(fleet) == before
    assert fleet.verdict(f"{SERIES}/v8")["state"] != "superseded"


def test_a_strangers_pull_request_stays_theirs_whoever_reopens_it(fleet, origin, tmp_path):
    """The author is the fork's owner, not the event's actor: a maintainer
    reopening (or re-running) a stranger's pull request lends it nothing."""
    fleet.seed_v8(tmp_path)
    before = dump(fleet)
    pr = fleet.pull_request(2, origin.pr2)
    record = fleet.trusted_record(pr, "mallory", actor=MAINTAINER)["record"]
    assert record.conclusion == "failure", record.text()
    assert "the revision's author: github:mallory (head repository mallory/phyfarm)" in (
        record.text()
    ), record.text()
    assert "owners: github:mallory is not an owner of series" in record.text(), record.text()
    assert not (fleet.root / "cache" / "trees").exists(), record.text()
    assert dump(fleet) == before


def test_on_a_branch_of_the_repository_the_author_is_the_one_who_pushed(fleet, origin, tmp_path):
    """A branch of the base repository (only its writers push there): the
    run's actor is the author, and a writer who does not own the series is
    refused as a stranger's fork would be."""
    fleet.seed_v8(tmp_path)
    before = dump(fleet)
    pr = fleet.pull_request(2, origin.pr2)
    record = fleet.trusted_record(pr, "phyfarm", actor="mallory", head_repo=BASE_REPO)
    text = record["record"].text()
    assert record["record"].conclusion == "failure", text
    assert "the revision's author: github:mallory (head repository phyfarm/phyfarm)" in text
    assert "owners: github:mallory is not an owner of series" in text, text
    assert dump(fleet) == before


def test_a_series_whose_name_escapes_is_refused_naming_the_field(fleet, origin, tmp_path):
    fleet.seed_v8(tmp_path)
    before = dump(fleet)
    pr = fleet.pull_request(3, origin.pr3)
    assert pr.results["collect"].conclusion == "failure", pr.results["collect"].text()
    record = fleet.trusted_record(pr, "mallory")["record"]
    assert record.conclusion == "failure", record.text()
    assert 'series.toml: name "../../escape"' in record.text(), record.text()
    assert dump(fleet) == before
    assert not list(fleet.root.rglob("escape")), "something was written under the hostile name"


def test_a_superseded_revision_is_refused_before_it_is_built(fleet, origin, tmp_path):
    """The maintainer's pull request edits v7 once v8 is in the store."""
    fleet.seed_v8(tmp_path)
    before = dump(fleet)
    work = tmp_path / "work"
    git(tmp_path, "clone", "--quiet", str(origin.bare), str(work))
    patch = sorted((work / "patches" / SERIES / "v7").glob("*.patch"))[-1]
    patch.write_text(patch.read_text() + "\n")
    git(work, "commit", "--quiet", "-am", "v7, touched")
    head = git(work, "rev-parse", "HEAD")
    git(work, "push", "--quiet", "--force", str(origin.bare), "HEAD:refs/pull/4/head")
    pr = fleet.pull_request(4, head)
    record = fleet.trusted_record(pr, MAINTAINER)["record"]
    assert record.conclusion == "failure", record.text()
    want = f"{SERIES}/v7 is superseded by {SERIES}/v8 in the store"
    assert want in record.text(), record.text()
    assert not (fleet.root / "cache" / "trees").exists(), record.text()
    assert dump(fleet) == before


def gh_stub(stubs: Path, responses: dict[str, object]) -> None:
    """`gh api [--paginate] ENDPOINT [--jq EXPR]` answering from
    `responses` (endpoint prefix -> JSON); an endpoint it does not know
    fails as an API error does."""
    data = stubs / "gh-responses.json"
    data.write_text(json.dumps(responses))
    script = f"""#!/usr/bin/env python3
import json, subprocess, sys
args = [a for a in sys.argv[1:] if a != "--paginate"]
assert args[0] == "api", args
endpoint, jq = args[1], None
if "--jq" in args:
    jq = args[args.index("--jq") + 1]
responses = json.load(open({str(data)!r}))
hit = [v for k, v in responses.items() if endpoint.startswith(k)]
if not hit:
    print(f"gh: HTTP 502: {{endpoint}}", file=sys.stderr)
    sys.exit(1)
text = json.dumps(hit[0])
if jq:
    p = subprocess.run(["jq", "-r", jq], input=text, capture_output=True, text=True, check=True)
    text = p.stdout
sys.stdout.write(text if text.endswith("\\n") else text + "\\n")
"""
    (stubs / "gh").write_text(script)
    (stubs / "gh").chmod(0o755)


def review(id_: int, login: str, role: str, commit: str, body: str) -> dict:
    return {
        "id": id_,
        "state": "CHANGES_REQUESTED",
        "author_association": role,
        "user": {"login": login},
        "commit_id": commit,
        "body": body,
    }


def pull(number: int, origin: Origin, closed: str | None = None, merged: bool = False) -> dict:
    """A pull request as GET /repos/{owner}/{repo}/pulls lists it: open, or
    closed at `closed` (merged or not)."""
    return {
        "number": number,
        "base": {"sha": origin.main},
        "state": "closed" if closed else "open",
        "closed_at": closed,
        "merged_at": closed if merged else None,
        "user": {"login": MAINTAINER},
    }


def verdicts_run(fleet: Fleet, origin: Origin, run: str) -> dict:
    event: dict = {}
    ex = fleet.executor(
        "verdicts.yml",
        run,
        event,
        origin.main,
        env={**fleet.env, "PHYFARM_STORE": str(fleet.store)},
        github={"repository": "phyfarm/phyfarm"},
    )
    # `deploy` publishes the export with deploy-pages: GitHub only.
    return ex.run(["verdicts"])


def test_a_maintainers_nack_on_a_force_pushed_commit_is_recorded_once(fleet, origin, tmp_path):
    fleet.seed_v8(tmp_path)
    stubs = Path(fleet.env["PATH"].split(":")[0])
    gh_stub(
        stubs,
        {
            "repos/phyfarm/phyfarm/pulls?": [pull(1, origin)],
            "repos/phyfarm/phyfarm/pulls/1/reviews": [
                review(11, MAINTAINER, "MEMBER", origin.pr1_reviewed, "the enum check\tmisses"),
                review(12, "passer-by", "NONE", origin.pr1, "I object too"),
            ],
        },
    )
    try:
        for attempt in ("first", "again"):
            jobs = verdicts_run(fleet, origin, f"verdicts-{attempt}")
            job = jobs["verdicts"]
            reviews = fleet.verdict(f"{SERIES}/v8")["reviews"]
            nacks = [r for r in reviews if r["kind"] == "nack"]
            assert [r["by"] for r in nacks] == [f"github:{MAINTAINER}"], (reviews, job.text())
            assert "review 11" in nacks[0]["reason"], nacks
            assert job.conclusion == "success", job.text()
        assert fleet.verdict(f"{SERIES}/v8")["state"] == "changes-requested"
        # Reviews that cannot be read fail the job loudly.
        gh_stub(stubs, {"repos/phyfarm/phyfarm/pulls?": [pull(1, origin)]})
        job = verdicts_run(fleet, origin, "verdicts-broken")["verdicts"]
        assert job.conclusion == "failure", job.text()
        assert "HTTP 502" in job.text()
    finally:
        for f in ("gh", "gh-responses.json"):
            (stubs / f).unlink(missing_ok=True)


@pytest.mark.parametrize("merged", [False, True], ids=["closed", "merged"])
def test_a_pull_request_closed_without_being_merged_withdraws_its_revision(
    fleet, origin, merged, tmp_path
):
    """A closed pull request's revision is withdrawn (an objection, recorded
    once); a merged one's is not."""
    fleet.seed_v8(tmp_path)
    assert fleet.verdict(f"{SERIES}/v8")["state"] == "awaiting-review"
    stubs = Path(fleet.env["PATH"].split(":")[0])
    closed = "2026-12-05T10:00:00Z"
    gh_stub(
        stubs,
        {
            "repos/phyfarm/phyfarm/pulls?": [pull(1, origin, closed, merged)],
            "repos/phyfarm/phyfarm/pulls/1/reviews": [],
        },
    )
    try:
        for attempt in ("first", "again"):
            job = verdicts_run(fleet, origin, f"verdicts-{attempt}")["verdicts"]
            assert job.conclusion == "success", job.text()
            v = fleet.verdict(f"{SERIES}/v8")
            nacks = [r for r in v["reviews"] if r["kind"] == "nack"]
            if merged:
                assert nacks == [] and v["state"] == "awaiting-review", (v["reviews"], job.text())
                continue
            assert [r["by"] for r in nacks] == [f"github:{MAINTAINER} (pull request #1)"], nacks
            want = f"withdrawn: pull request #1 was closed at {closed} without being merged"
            assert nacks[0]["reason"] == want, nacks
            assert v["state"] == "changes-requested", v["reason"]
    finally:
        for f in ("gh", "gh-responses.json"):
            (stubs / f).unlink(missing_ok=True)


def test_no_workflow_step_swallows_a_failure():
    """A failing command fails its step: no `|| echo`, `|| true` or `|| :`
    turns it into a message."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split(" #", 1)[0]
            assert not re.search(r"\|\|\s*(echo|true|:)(\s|$)", code), f"{path.name}:{i}: {line}"
