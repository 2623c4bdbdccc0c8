"""A small executor for phyfarm's GitHub Actions workflows.

It reads a workflow file and runs its jobs in dependency order: matrices
expanded, `if:` conditions and `${{ }}` expressions evaluated (the subset
the workflows use), each `run:` step executed with `bash -e` as a runner
does, with GITHUB_OUTPUT, GITHUB_ENV, GITHUB_STEP_SUMMARY and RUNNER_TEMP.
`uses:` steps are mapped to their documented effect:

- actions/checkout: a clone of the origin repository at the ref asked for
  (the event's commit by default), in `with.path`;
- actions/upload-artifact, actions/upload-pages-artifact: a copy into the
  run's artifact folder, rooted where GitHub roots it (the common folder
  of the paths given);
- actions/download-artifact: a copy back, by `name` into `path`, or by
  `pattern` into `path/<artifact name>/`.

Actions that only talk to GitHub's API (github-script, deploy-pages) are
not run: a job using them is reported as not runnable, so a test must name
the jobs it runs. Nothing here is phyfarm: the test supplies the binaries
(a `cargo` on PATH that installs the built phyfarm) and the event.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}", re.S)


class NotRunnable(Exception):
    """A step whose effect this executor does not model."""


@dataclass
class JobResult:
    name: str
    conclusion: str  # success, failure, skipped
    outputs: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join(self.log)


def lookup(ctx: dict, path: str):
    cur = ctx
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return ""
    return cur


def split_top(expr: str, op: str) -> list[str]:
    """Split on `op` outside parentheses and quotes."""
    parts, depth, quote, start, i = [], 0, False, 0, 0
    while i < len(expr):
        c = expr[i]
        if c == "'":
            quote = not quote
        elif not quote and c == "(":
            depth += 1
        elif not quote and c == ")":
            depth -= 1
        elif not quote and depth == 0 and expr.startswith(op, i):
            parts.append(expr[start:i])
            start = i + len(op)
            i += len(op)
            continue
        i += 1
    parts.append(expr[start:])
    return [p.strip() for p in parts]


def evaluate(expr: str, ctx: dict):
    expr = expr.strip()
    if len(ors := split_top(expr, "||")) > 1:
        return any(truthy(evaluate(p, ctx)) for p in ors)
    if len(ands := split_top(expr, "&&")) > 1:
        return all(truthy(evaluate(p, ctx)) for p in ands)
    for op in ("==", "!="):
        if len(sides := split_top(expr, op)) == 2:
            a, b = (evaluate(s, ctx) for s in sides)
            same = str(a).lower() == str(b).lower()
            return same if op == "==" else not same
    if expr.startswith("!"):
        return not truthy(evaluate(expr[1:], ctx))
    if expr.startswith("(") and expr.endswith(")"):
        return evaluate(expr[1:-1], ctx)
    if expr in ("always()", "success()", "failure()", "cancelled()"):
        return {
            "always()": True,
            "success()": ctx["_ok"],
            "failure()": not ctx["_ok"],
            "cancelled()": False,
        }[expr]
    if m := re.fullmatch(r"fromJSON\((.*)\)", expr, re.S):
        return json.loads(evaluate(m.group(1), ctx))
    if m := re.fullmatch(r"'(.*)'", expr, re.S):
        return m.group(1).replace("''", "'")
    if re.fullmatch(r"-?\d+", expr):
        return int(expr)
    if expr in ("true", "false"):
        return expr == "true"
    return lookup(ctx, expr)


def truthy(v) -> bool:
    return v not in ("", 0, False, None, [], {})


def render(value, ctx: dict):
    """Evaluate the `${{ }}` in a value from the workflow."""
    if isinstance(value, dict):
        return {k: render(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, ctx) for v in value]
    if not isinstance(value, str):
        return value
    m = EXPR.fullmatch(value.strip())
    if m:
        return evaluate(m.group(1), ctx)
    return EXPR.sub(lambda m: str(evaluate(m.group(1), ctx)), value)


def condition(cond, ctx: dict) -> bool:
    if isinstance(cond, bool):
        return cond
    text = str(cond).strip()
    m = EXPR.fullmatch(text)
    text = m.group(1) if m else text
    status = any(f in text for f in ("always()", "success()", "failure()", "cancelled()"))
    # Without a status function, GitHub adds `success() &&`.
    return truthy(evaluate(text, ctx)) and (status or ctx["_ok"])


def brace_patterns(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out += brace_patterns(pattern[: m.start()] + alt + pattern[m.end() :])
    return out


def env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines and `KEY<<DELIM` blocks of GITHUB_OUTPUT/GITHUB_ENV."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delim = line.split("<<", 1)
            body = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                body.append(lines[i])
                i += 1
            out[key] = "\n".join(body)
        elif "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
        i += 1
    return out


class Executor:
    """Runs one workflow run: its jobs, their artifacts, their outputs."""

    def __init__(
        self,
        workflow: Path,
        *,
        root: Path,
        origin: Path,
        event: dict,
        sha: str,
        artifacts: Path,
        env: dict[str, str],
        github: dict | None = None,
    ) -> None:
        self.doc = yaml.safe_load(workflow.read_text())
        self.name = workflow.stem
        self.root = root
        self.origin = origin
        self.event = event
        self.sha = sha
        self.artifacts = artifacts
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.github = {"event": event, "token": "token-not-used", **(github or {})}
        self.results: dict[str, JobResult] = {}

    # -- jobs -------------------------------------------------------------

    def order(self) -> list[str]:
        jobs = self.doc["jobs"]
        done: list[str] = []
        while len(done) < len(jobs):
            for name, job in jobs.items():
                needs = job.get("needs", [])
                needs = [needs] if isinstance(needs, str) else needs
                if name not in done and all(n in done for n in needs):
                    done.append(name)
        return done

    def run(self, only: list[str], replaced: dict[str, str] | None = None) -> dict:
        """Run the jobs named in `only` (in dependency order); a job in
        `replaced` is not run and counts as succeeded (the test supplies
        its artifacts, and says why in the reason)."""
        replaced = replaced or {}
        for name in self.order():
            if name in replaced:
                self.results[name] = JobResult(name, "success", log=[f"replaced: {replaced[name]}"])
            elif name in only:
                self.results[name] = self.run_job(name)
        return self.results

    def needs_ctx(self, job: dict) -> dict:
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        return {
            n: {"result": self.results[n].conclusion, "outputs": self.results[n].outputs}
            for n in needs
            if n in self.results
        }

    def run_job(self, name: str) -> JobResult:
        job = self.doc["jobs"][name]
        needs = self.needs_ctx(job)
        ok = all(n["result"] == "success" for n in needs.values())
        ctx = {"github": self.github, "needs": needs, "_ok": ok, "env": {}}
        if "if" in job:
            run = condition(job["if"], ctx)
        else:
            run = ok
        if not run:
            return JobResult(name, "skipped")
        matrix = (job.get("strategy") or {}).get("matrix")
        combos: list[dict] = [{}]
        if matrix:
            axes = {k: render(v, ctx) for k, v in matrix.items() if k not in ("include", "exclude")}
            keys = list(axes)
            combos = [
                dict(zip(keys, vals, strict=True)) for vals in itertools.product(*axes.values())
            ]
        result = JobResult(name, "success")
        for i, combo in enumerate(combos):
            one = self.run_one(name, job, {**ctx, "matrix": combo}, i)
            result.log += one.log
            result.outputs.update(one.outputs)
            if one.conclusion != "success":
                result.conclusion = "failure"
        return result

    def run_one(self, name: str, job: dict, ctx: dict, index: int) -> JobResult:
        result = JobResult(name, "success")
        ws = self.root / "runner" / self.name / f"{name}-{index}"
        temp = self.root / "runner-temp" / self.name / f"{name}-{index}"
        for d in (ws, temp):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        self.github["workspace"] = str(ws)
        ctx["github"] = self.github
        files = {k: temp / f"{k.lower()}.txt" for k in ("GITHUB_OUTPUT", "GITHUB_ENV")}
        summary = temp / "step-summary.md"
        env = dict(self.env)
        env.update(
            GITHUB_WORKSPACE=str(ws),
            RUNNER_TEMP=str(temp),
            GITHUB_STEP_SUMMARY=str(summary),
            GITHUB_ENV=str(files["GITHUB_ENV"]),
        )
        wf_env = render(self.doc.get("env") or {}, ctx)
        ctx["env"] = dict(wf_env)
        job_env = render(job.get("env") or {}, ctx)
        ctx["env"].update(job_env)
        steps: dict[str, dict] = {}
        ctx["steps"] = steps
        ok = True
        for n, step in enumerate(job.get("steps", [])):
            ctx["_ok"] = ok
            if "if" in step:
                if not condition(step["if"], ctx):
                    continue
            elif not ok:
                continue
            step_env = render(step.get("env") or {}, ctx)
            run_env = {**env, **{k: str(v) for k, v in ctx["env"].items()}}
            run_env.update({k: str(v) for k, v in step_env.items()})
            label = step.get("name") or step.get("uses") or f"step {n}"
            files["GITHUB_OUTPUT"].write_text("")
            run_env["GITHUB_OUTPUT"] = str(files["GITHUB_OUTPUT"])
            try:
                if "uses" in step:
                    code, out = self.uses(step, render(step.get("with") or {}, ctx), ws)
                else:
                    code, out = self.bash(step, ctx, run_env, ws)
            except NotRunnable as e:
                raise NotRunnable(f"{self.name}/{name}: {label}: {e}") from None
            result.log.append(f"--- {name}[{index}] {label}: exit {code}\n{out}")
            if "id" in step:
                steps[step["id"]] = {"outputs": env_file(files["GITHUB_OUTPUT"])}
            ctx["env"].update(env_file(files["GITHUB_ENV"]))
            files["GITHUB_ENV"].write_text("")
            if code != 0 and not step.get("continue-on-error"):
                ok = False
        ctx["_ok"] = ok
        result.outputs = {k: str(v) for k, v in render(job.get("outputs") or {}, ctx).items()}
        result.conclusion = "success" if ok else "failure"
        return result

    # -- steps ------------------------------------------------------------

    def bash(self, step: dict, ctx: dict, env: dict, ws: Path) -> tuple[int, str]:
        script = step["run"]
        assert not EXPR.search(script), "an expression inside a run: script"
        cwd = ws / render(step.get("working-directory", "."), ctx)
        p = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            # A hang guard only: the trusted runner's step builds and runs the
            # whole farm on the base and the revision (10 min on a 2-core TCG host).
            timeout=1800,
            check=False,
        )
        return p.returncode, p.stdout + p.stderr

    def uses(self, step: dict, args: dict, ws: Path) -> tuple[int, str]:
        action = step["uses"].split("@")[0]
        if action == "actions/checkout":
            return self.checkout(args, ws)
        if action in ("actions/upload-artifact", "actions/upload-pages-artifact"):
            name = args.get("name", "github-pages")
            return self.upload(name, args["path"], args.get("if-no-files-found", "warn"), ws)
        if action == "actions/download-artifact":
            return self.download(args, ws)
        raise NotRunnable(f"{action} talks to GitHub only; not run here")

    def git(self, *args: str, cwd: Path) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)

    def checkout(self, args: dict, ws: Path) -> tuple[int, str]:
        dest = ws / args.get("path", ".")
        dest.mkdir(parents=True, exist_ok=True)
        ref = str(args.get("ref") or self.sha)
        self.git("clone", "--quiet", "--no-local", str(self.origin), str(dest), cwd=ws)
        self.git("fetch", "--quiet", "origin", ref, cwd=dest)
        self.git("checkout", "--quiet", "--detach", "FETCH_HEAD", cwd=dest)
        return 0, f"checked out {ref} in {dest}"

    def upload(self, name: str, paths: str, missing: str, ws: Path) -> tuple[int, str]:
        listed = [ws / p.strip() for p in str(paths).splitlines() if p.strip()]
        present = [p for p in listed if p.exists()]
        if not present:
            return (1 if missing == "error" else 0), f"no files for artifact {name}"
        dest = self.artifacts / name
        shutil.rmtree(dest, ignore_errors=True)
        if len(present) == 1 and present[0].is_dir():
            shutil.copytree(present[0], dest, symlinks=True)
            return 0, f"uploaded {name}"
        top = Path(os.path.commonpath([p if p.is_dir() else p.parent for p in present]))
        for p in present:
            target = dest / p.relative_to(top)
            if p.is_dir():
                shutil.copytree(p, target, symlinks=True, dirs_exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, target, follow_symlinks=False)
        return 0, f"uploaded {name}"

    def download(self, args: dict, ws: Path) -> tuple[int, str]:
        dest = ws / args.get("path", ".")
        dest.mkdir(parents=True, exist_ok=True)
        if "name" in args:
            src = self.artifacts / args["name"]
            if not src.is_dir():
                return 1, f"artifact {args['name']} not found"
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
            return 0, f"downloaded {args['name']}"
        pats = brace_patterns(args["pattern"])
        names = sorted(
            a.name
            for a in self.artifacts.iterdir()
            if any(fnmatch.fnmatchcase(a.name, p) for p in pats)
        )
        for n in names:
            shutil.copytree(self.artifacts / n, dest / n, symlinks=True, dirs_exist_ok=True)
        return 0, f"downloaded {names}"
