"""The report mail: one per series and verdict change, netdev's plain style.

It answers the cover letter (In-Reply-To / References), goes to the list and,
unless told otherwise, the series' author — nobody else — and carries what
ran, what failed with its evidence line, how to run it again, and the
dashboard link. Every line taken from a run or a mail is cleaned of control
characters and cut to length before it is written.
"""

from __future__ import annotations

import email.utils
import re
import shlex
import smtplib
import textwrap
from email.message import EmailMessage

from .mail import clean

MAX_LISTED = 20


def _count(checks: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in checks:
        out[c.get("status", "?")] = out.get(c.get("status", "?"), 0) + 1
    return out


def family(path: str) -> str | None:
    """`farm.link_flap[plain]` → `farm.link_flap`: what `phyfarm run --checks` takes."""
    m = re.match(r"^(farm\.[a-z0-9_]+)", path)
    return m.group(1) if m else None


def run_hint(name: str, cover_id: str, run_args: list[str], check: str | None = None) -> str:
    """The command that runs the revision again, as b4 fetches it from the list."""
    args = list(run_args)
    if check:
        if "--checks" in args:
            i = args.index("--checks")
            del args[i : i + 2]
        args += ["--checks", check]
    tail = f" {shlex.join(args)}" if args else ""
    return f"b4 am -o {name} {shlex.quote(cover_id)} && phyfarm run {name}/*.mbx{tail}"


def reproducer(verdict: dict, check: dict) -> str | None:
    """The verdict's `phyfarm repro` command for one of its checks."""
    for r in verdict.get("reproducers", []):
        if (
            isinstance(r, dict)
            and r.get("path") == check.get("path")
            and r.get("variant") == check.get("variant")
        ):
            return clean(str(r.get("command", "")), 300) or None
    return None


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 72, initial_indent=indent, subsequent_indent=indent + "  ") or [
        indent
    ]


def body(
    verdict: dict,
    ref: str,
    hint: tuple[str, str, list[str]],
    dashboard: str,
    notes: list[str],
    first_bad: str | None = None,
    run_dir: str | None = None,
) -> str:
    """The report's text; `hint` is (series name, cover Message-ID, run
    arguments); `run_dir` is the run folder `phyfarm repro` reruns from."""
    state = clean(str(verdict.get("state") or "testing"), 40)
    checks = [c for c in verdict.get("checks", []) if isinstance(c, dict)]
    counts = _count(checks)
    lines = [
        "Hello,",
        "",
        f"phyfarm tested {ref}: {state}.",
        "",
    ]
    lines += _wrap(f"why: {clean(str(verdict.get('reason', '')), 600)}", "  ")
    if verdict.get("ready_at") and state == "awaiting-review":
        lines.append(f"  ready to merge at {clean(str(verdict['ready_at']), 40)} unless objected")
    lines.append("")
    lines += _wrap(
        "What ran: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f" ({len(checks)} checks, against the unpatched base run "
        + f"{clean(str(verdict.get('base_run') or 'none'), 60)})",
        "",
    )
    bad = [c for c in checks if c.get("status") in ("FAIL", "ERROR", "MISS")]
    if bad:
        lines += ["", "Not passed:"]
        for c in bad[:MAX_LISTED]:
            variant = f" ({clean(str(c['variant']), 10)})" if c.get("variant") else ""
            path = clean(str(c.get("path", "?")), 120)
            lines.append(f"  {c.get('status')}: {path}{variant}")
            excerpt = str(c.get("log_excerpt") or "").strip().splitlines()
            if excerpt:
                lines.append(f"    {clean(excerpt[0], 200)}")
            fam = family(path)
            if fam:
                lines.append(f"    reproduce: {run_hint(hint[0], hint[1], hint[2], fam)}")
            repro = reproducer(verdict, c)
            if repro:
                where = f" --run {shlex.quote(run_dir)}" if run_dir else ""
                lines.append(f"    on the farm, from this run: {repro}{where}")
        if len(bad) > MAX_LISTED:
            lines.append(f"  ... and {len(bad) - MAX_LISTED} more on the dashboard")
    if first_bad and state == "changes-requested":
        lines += ["", f"first bad patch: {clean(first_bad, 200)}"]
    reviews = [r for r in verdict.get("reviews", []) if isinstance(r, dict)]
    if reviews:
        lines += ["", "Reviews counted:"]
        for r in reviews[-10:]:
            lines.append(
                f"  {clean(str(r.get('kind', '')), 10)} by {clean(str(r.get('by', '')), 100)}"
                f" at {clean(str(r.get('at', '')), 30)}: {clean(str(r.get('reason', '')), 200)}"
            )
    if notes:
        lines += ["", "Seen, not counted:"] + [f"  {clean(n, 300)}" for n in notes[-10:]]
    lines += [
        "",
        "To run it again on your machine (the series as b4 fetches it):",
        f"  {run_hint(*hint)}",
        "",
        f"Details: {dashboard}",
        "",
        "-- ",
        "phyfarm: the Rust PHY CI (reply with `pw-bot: cr` if you are a maintainer)",
    ]
    return "\n".join(lines) + "\n"


def compose(
    *,
    sender: str,
    to: list[str],
    cover_subject: str,
    cover_id: str,
    references: list[str],
    text: str,
    domain: str,
) -> EmailMessage:
    msg = EmailMessage()
    subject = clean(cover_subject, 300)
    msg["Subject"] = subject if subject.lower().startswith("re:") else f"Re: {subject}"
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = email.utils.formatdate(localtime=False)
    msg["Message-ID"] = email.utils.make_msgid("phyfarm", domain=domain)
    msg["In-Reply-To"] = f"<{cover_id}>"
    refs = [r for r in references if r != cover_id][-20:] + [cover_id]
    msg["References"] = " ".join(f"<{r}>" for r in refs)
    msg["X-Phyfarm"] = "report"
    msg.set_content(text, charset="utf-8", cte="8bit")
    return msg


def send(msg: EmailMessage, server: str, timeout: float = 60) -> None:
    host, _, port = server.rpartition(":")
    with smtplib.SMTP(host or "127.0.0.1", int(port or 25), timeout=timeout) as s:
        s.send_message(msg)
