"""Security rules for phyfarm's GitHub Actions workflows.

Contributor code (the patches of a pull request, and for phyfarm's own CI
the whole pull request) runs on our self-hosted runners, so every workflow
is checked for the mistakes that hand a contributor a write token, a secret
or a shell:

no-pull-request-target
    `pull_request_target` runs with the base repository's write token and
    secrets; phyfarm uses `pull_request` only.
top-level-permissions
    The workflow's `permissions` is `read-all` or `{}`; jobs widen it.
write-only-without-code
    A job that may write (any `write` scope, or `write-all`) executes no
    code: no `run:` step, no `actions/checkout`, no self-hosted runner. It
    may only move data with pinned actions (download an artifact, call the
    API from an inline github-script, deploy Pages).
pinned-actions
    Every `uses:` names a full 40-hex commit (local `./` actions and
    `docker://...@sha256:` aside), with a `# vX.Y.Z` comment saying which
    release that commit is.
no-secrets-with-contributor-code
    A job that runs contributor code references no `secrets.*`, no
    `github.token` and no `secrets: inherit` (nor does the workflow's
    top-level `env`). A job runs contributor code when its workflow is
    triggered by a pull request and the job executes anything (a `run:`
    step, a checkout, a self-hosted runner), or when any job checks out a
    pull request's head.
no-expressions-in-scripts
    No `${{ ... }}` inside a `run:` script or a github-script `script:`:
    values (pull-request titles and branch names, and also matrix values and
    job outputs that come from file names in the pull request) reach a
    script through `env:` only, so they are never parsed as code.
pr-concurrency
    A workflow triggered by pull requests has a top-level `concurrency`
    whose group names `github.event.pull_request.number` and
    `cancel-in-progress: true`, so a push cancels the superseded run.
runner-labels
    A self-hosted `runs-on` is exactly `[self-hosted, linux, x64, phyfarm]`
    (the ephemeral runners that run pull requests) or `[self-hosted, linux,
    x64, phyfarm-trusted]` (the trusted runner group), and `runs-on` is never
    computed by an expression.
trusted-runners-apart
    A workflow triggered by pull requests never runs on the trusted group;
    a job outside such a workflow that holds a token or a write permission
    and runs on our own runners runs on the trusted group, never beside
    pull-request jobs.
checkout-without-credentials
    Every `actions/checkout` sets `persist-credentials: false`, so no token
    is left in `.git/config` for the code that runs next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES = (
    "no-pull-request-target",
    "top-level-permissions",
    "write-only-without-code",
    "pinned-actions",
    "no-secrets-with-contributor-code",
    "no-expressions-in-scripts",
    "pr-concurrency",
    "runner-labels",
    "checkout-without-credentials",
    "trusted-runners-apart",
)

PHYFARM_LABELS = ["self-hosted", "linux", "x64", "phyfarm"]
TRUSTED_LABELS = ["self-hosted", "linux", "x64", "phyfarm-trusted"]
PR_TRIGGERS = {"pull_request", "pull_request_target"}
SHA_PIN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[^@\s]+)?@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+){0,2}\b")
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*['\"]?([^'\"\s#]+)['\"]?\s*(#.*)?$")
SECRET_REF = re.compile(r"\bsecrets\.|\bgithub\.token\b|\bsecrets\s*\[")
PR_HEAD_REF = re.compile(
    r"github\.event\.(pull_request|workflow_run)\.head|github\.head_ref|refs/pull/"
)
# Fields of an event that anyone opening a pull request or an issue controls.
UNTRUSTED = re.compile(
    r"github\.head_ref|github\.event\.[\w.*\[\]']*"
    r"(title|body|head_ref|label|message|name|email|ref|default_branch|page_name)\b"
)


@dataclass(frozen=True)
class Violation:
    rule: str
    file: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}: {self.where}: [{self.rule}] {self.detail}"


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a workflow (top level is not a mapping)")
    return doc


def triggers(wf: dict[str, Any]) -> set[str]:
    # YAML 1.1 reads the key `on` as the boolean True.
    on = wf.get("on", wf.get(True))
    if isinstance(on, str):
        return {on}
    if isinstance(on, list):
        return {str(x) for x in on}
    if isinstance(on, dict):
        return {str(k) for k in on}
    return set()


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in job.get("steps") or [] if isinstance(s, dict)]


def action(step: dict[str, Any]) -> str:
    """`actions/checkout` for `actions/checkout@<sha>`; '' for a run step."""
    return str(step.get("uses", "")).split("@", 1)[0]


def labels(job: dict[str, Any]) -> list[str] | None:
    """The runs-on labels, or None when they are an expression or a group."""
    runs_on = job.get("runs-on")
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels")
    if isinstance(runs_on, str):
        runs_on = [runs_on]
    if not isinstance(runs_on, list) or any("${{" in str(x) for x in runs_on):
        return None
    return [str(x) for x in runs_on]


def self_hosted(job: dict[str, Any]) -> bool:
    lab = labels(job)
    return lab is None or "self-hosted" in lab


def executes_code(job: dict[str, Any]) -> bool:
    return (
        self_hosted(job)
        or "uses" in job  # a reusable workflow runs whatever it contains
        or any("run" in s or action(s) == "actions/checkout" for s in steps(job))
    )


def checks_out_pr_head(job: dict[str, Any]) -> bool:
    return any(
        action(s) == "actions/checkout" and PR_HEAD_REF.search(yaml.safe_dump(s.get("with") or {}))
        for s in steps(job)
    )


def may_write(perms: Any) -> bool:
    if isinstance(perms, str):
        return perms == "write-all"
    if isinstance(perms, dict):
        return any(str(v) == "write" for v in perms.values())
    return False


def check(path: Path, name: str | None = None) -> list[Violation]:
    """Every rule against one workflow file."""
    name = name or path.name
    wf = load(path)
    out: list[Violation] = []

    def v(rule: str, where: str, detail: str) -> None:
        out.append(Violation(rule, name, where, detail))

    on = triggers(wf)
    pr_triggered = bool(on & PR_TRIGGERS)
    jobs: dict[str, Any] = wf.get("jobs") or {}

    if "pull_request_target" in on:
        v(
            "no-pull-request-target",
            "on",
            "pull_request_target runs with write token and secrets; use pull_request",
        )

    perms = wf.get("permissions", "<missing>")
    if not (perms == "read-all" or perms == {}):
        v("top-level-permissions", "permissions", f"is {perms!r}, must be read-all or {{}}")

    if pr_triggered:
        conc = wf.get("concurrency")
        group = str(conc.get("group", "")) if isinstance(conc, dict) else ""
        cancel = conc.get("cancel-in-progress") if isinstance(conc, dict) else None
        if "github.event.pull_request.number" not in group or cancel is not True:
            v(
                "pr-concurrency",
                "concurrency",
                "needs a group per pull request (github.event.pull_request.number) "
                "and cancel-in-progress: true",
            )

    workflow_env_secret = bool(SECRET_REF.search(yaml.safe_dump(wf.get("env") or {})))

    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        m = USES_LINE.match(line)
        if not m:
            continue
        ref = m.group(1)
        if ref.startswith("./"):
            continue
        if ref.startswith("docker://"):
            if "@sha256:" not in ref:
                v("pinned-actions", f"line {lineno}", f"{ref} is not pinned by digest")
            continue
        if not SHA_PIN.match(ref):
            v("pinned-actions", f"line {lineno}", f"{ref} is not pinned to a 40-hex commit")
        elif not (m.group(2) and VERSION_COMMENT.search(m.group(2))):
            v("pinned-actions", f"line {lineno}", f"{ref} has no '# vX.Y.Z' comment")

    for job_id, job in jobs.items():
        if not isinstance(job, dict):
            continue
        where = f"jobs.{job_id}"
        code = executes_code(job)

        if may_write(job.get("permissions")) and code:
            v(
                "write-only-without-code",
                where,
                "may write but executes code (run steps, checkout or a self-hosted runner)",
            )

        contributor = (pr_triggered and code) or checks_out_pr_head(job)
        if contributor:
            if SECRET_REF.search(yaml.safe_dump(job)) or workflow_env_secret:
                v(
                    "no-secrets-with-contributor-code",
                    where,
                    "runs contributor code and references secrets or github.token",
                )
            if job.get("secrets") == "inherit":
                v("no-secrets-with-contributor-code", where, "secrets: inherit")

        lab = labels(job)
        if lab is None:
            v("runner-labels", where, "runs-on is an expression or a runner group")
        elif "self-hosted" in lab and sorted(lab) not in (
            sorted(PHYFARM_LABELS),
            sorted(TRUSTED_LABELS),
        ):
            v(
                "runner-labels",
                where,
                f"runs-on {lab}, must be exactly {PHYFARM_LABELS} or {TRUSTED_LABELS}",
            )
        if lab is not None and "self-hosted" in lab:
            trusted = "phyfarm-trusted" in lab
            if pr_triggered and trusted:
                v(
                    "trusted-runners-apart",
                    where,
                    "a pull-request workflow runs on the trusted runner group",
                )
            perms = job.get("permissions")
            extra = perms == "write-all" or (
                isinstance(perms, dict)
                and any(k != "contents" or str(val) != "read" for k, val in perms.items())
            )
            holds_token = extra or bool(SECRET_REF.search(yaml.safe_dump(job)))
            if not pr_triggered and holds_token and not trusted:
                v(
                    "trusted-runners-apart",
                    where,
                    "holds a token or extra permissions on the pull-request runners "
                    "(use phyfarm-trusted)",
                )

        for i, step in enumerate(steps(job)):
            swhere = f"{where}.steps[{i}]" + (f" ({step['name']})" if "name" in step else "")
            scripts = [str(step["run"])] if "run" in step else []
            if action(step) == "actions/github-script":
                scripts.append(str((step.get("with") or {}).get("script", "")))
            for script in scripts:
                for expr in re.findall(r"\$\{\{(.*?)\}\}", script, flags=re.S):
                    kind = "untrusted input" if UNTRUSTED.search(expr) else "an expression"
                    v(
                        "no-expressions-in-scripts",
                        swhere,
                        f"{kind} ${{{{{expr}}}}} interpolated into a script; pass it via env:",
                    )
            if action(step) == "actions/checkout":
                pc = (step.get("with") or {}).get("persist-credentials")
                if pc is not False and str(pc).lower() != "false":
                    v(
                        "checkout-without-credentials",
                        swhere,
                        "actions/checkout without persist-credentials: false",
                    )
    return out
