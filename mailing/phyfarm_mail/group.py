"""Mails into series revisions: by thread, version and change-id, as b4 does.

A patch or cover letter joins the revision whose thread it is in (its
In-Reply-To / References name a mail of it) when version and patch count
agree; a series posted without threading, or in two parts, joins the open
revision of the same author, version, count and change-id. A revision is
complete when every patch 1..m has arrived (the cover letter is optional);
a patch that arrives late completes it on a later poll. Nothing here trusts
the mail: names become `[A-Za-z0-9._-]`, files are written by index only.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

from .mail import Mail, clean

SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str, limit: int = 48) -> str:
    s = SAFE.sub("-", text).strip("-._")[:limit].strip("-._")
    return s or "series"


class Grouper:
    """Keeps the open revisions in the watch state (plain JSON-able dicts)."""

    def __init__(self, state: dict, repo: Path) -> None:
        self.state = state
        state.setdefault("groups", {})
        state.setdefault("msgs", {})
        self.repo = repo

    def add(self, mail: Mail, mail_file: str) -> tuple[str | None, str]:
        """Files a patch or cover; returns (group key or None, what happened)."""
        p = mail.prefix
        assert p is not None
        groups = self.state["groups"]
        if mail.message_id in self.state["msgs"]:
            return None, f"{mail.message_id} was already taken (the same mail twice)"
        key = None
        for ref in mail.thread_ids:
            known = self.state["msgs"].get(ref)
            if not known or known.get("group") not in groups:
                continue
            g = groups[known["group"]]
            if g["version"] == p.version and g["total"] == p.total:
                key = known["group"]
                break
            if g["version"] == p.version and not g.get("done"):
                return None, (
                    f"[v{p.version} {p.index}/{p.total}] is in the thread of "
                    f"[v{g['version']} x/{g['total']}] (a thread mixing two series): ignored"
                )
        if key is None:
            for k, g in groups.items():
                if (
                    not g.get("done")
                    and g["author"] == mail.from_addr
                    and g["version"] == p.version
                    and g["total"] == p.total
                    and (not mail.change_id or g.get("change_id") in (None, mail.change_id))
                    and str(p.index) not in g["patches"]
                    and not (p.index == 0 and g.get("cover"))
                ):
                    key = k
                    break
        if key is None:
            key = mail.message_id
            groups[key] = {
                "version": p.version,
                "total": p.total,
                "tree": p.tree,
                "rfc": p.rfc,
                "resend": p.resend,
                "author": mail.from_addr,
                "author_who": mail.who,
                "patches": {},
                "cover": None,
                "change_id": None,
                "title": "",
                "first": mail.date.isoformat(),
            }
        g = groups[key]
        if g.get("done"):
            late = f"[v{p.version} {p.index}/{p.total}]"
            return None, f"{late} arrived after its revision ran: ignored"
        slot = "cover" if p.index == 0 else None
        if slot:
            if g["cover"]:
                return None, f"a second cover letter for [v{p.version}]: ignored"
            g["cover"] = {"file": mail_file, "id": mail.message_id, "subject": mail.subject}
            g["title"] = mail.title
        else:
            if str(p.index) in g["patches"]:
                return None, f"[v{p.version} {p.index}/{p.total}] arrived twice: the first is kept"
            diff = mail.body[mail.body.find("diff --git") :] if "diff --git" in mail.body else ""
            g["patches"][str(p.index)] = {
                "file": mail_file,
                "id": mail.message_id,
                "diff": hashlib.sha256(diff.encode()).hexdigest(),
            }
            if p.index == 1 and not g["title"]:
                g["title"] = mail.title
            if p.total == 1:
                g["cover"] = g["cover"] or {
                    "file": None,
                    "id": mail.message_id,
                    "subject": mail.subject,
                }
        if mail.change_id and not g["change_id"]:
            g["change_id"] = mail.change_id
        self.state["msgs"][mail.message_id] = {"group": key}
        missing = self.missing(g)
        what = f"[v{p.version} {p.index}/{p.total}] {clean(mail.title, 80)}"
        if missing:
            return key, f"{what}: waiting for {', '.join(missing)}"
        return key, f"{what}: the revision is complete"

    @staticmethod
    def missing(g: dict) -> list[str]:
        return [f"{i}/{g['total']}" for i in range(1, g["total"] + 1) if str(i) not in g["patches"]]

    def complete(self) -> list[str]:
        return [
            k for k, g in self.state["groups"].items() if not g.get("done") and not self.missing(g)
        ]

    @staticmethod
    def patchset(g: dict) -> str:
        """The revision's changes, whatever the mails around them say."""
        diffs = [g["patches"][str(i)]["diff"] for i in range(1, g["total"] + 1)]
        return hashlib.sha256("\n".join(diffs).encode()).hexdigest()

    def known_series(self) -> dict[str, dict]:
        """change-id → the repository's series.toml (name, tree, base)."""
        out = {}
        for f in sorted((self.repo / "patches").glob("*/series.toml")):
            try:
                m = tomllib.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if m.get("change-id"):
                out[m["change-id"]] = m
        return out

    def name_of(self, g: dict) -> tuple[str, dict | None]:
        """The series name (and the repository's manifest when it knows it)."""
        cid = g.get("change_id")
        if cid:
            known = self.known_series().get(cid)
            if known:
                return known["name"], known
            return slug(cid, 100), None
        who = hashlib.sha256(g["author"].encode()).hexdigest()[:8]
        return f"{slug(g['title'])}-{who}", None

    def write_revision(self, key: str, root: Path, default_base: dict) -> tuple[str, Path]:
        """The revision's folder: series.toml beside v<N>/ of the mails as posted."""
        g = self.state["groups"][key]
        name, manifest = self.name_of(g)
        series_dir = root / name
        rev_dir = series_dir / f"v{g['version']}"
        if rev_dir.exists():
            raise FileExistsError(
                f"{name}/v{g['version']} was already posted with other patches; "
                "a changed revision needs a new version"
            )
        rev_dir.mkdir(parents=True)
        files = []
        if g["cover"] and g["cover"]["file"]:
            files.append((0, g["cover"]["file"]))
        files += [(int(i), p["file"]) for i, p in g["patches"].items()]
        for index, src in sorted(files):
            # Line ends as `git mailsplit` leaves them (it drops the CR of CRLF).
            raw = Path(src).read_bytes().replace(b"\r\n", b"\n")
            (rev_dir / f"{index:04d}.patch").write_bytes(raw)
        base = (manifest or {}).get("base") or default_base
        tree = (manifest or {}).get("tree") or g.get("tree") or "net-next"
        lines = [
            "# Written by phyfarm watch from the mails as the archive has them.",
            f"name = {_toml(name)}",
        ]
        if g.get("change_id"):
            lines.append(f"change-id = {_toml(g['change_id'])}")
        lines.append(f"tree = {_toml(tree)}")
        lines.append(
            "base = { "
            + ", ".join(f"{k} = {_toml(str(v))}" for k, v in base.items() if v is not None)
            + " }"
        )
        versions = sorted(
            int(d.name[1:])
            for d in series_dir.iterdir()
            if d.is_dir() and re.fullmatch(r"v\d+", d.name)
        )
        for v in versions:
            lines += ["", "[[revision]]", f"version = {v}", f'dir = "v{v}"']
        (series_dir / "series.toml").write_text("\n".join(lines) + "\n")
        g["done"] = True
        g["ref"] = f"{name}/v{g['version']}"
        return g["ref"], rev_dir


def _toml(s: str) -> str:
    """A TOML basic string."""
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", out)
    return f'"{out}"'
