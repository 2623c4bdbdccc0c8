"""Following a public-inbox archive through its git epochs, as lore readers do.

A v2 inbox is a folder of epochs, `git/0.git`, `git/1.git`, ...; each commit
adds one mail as the blob `m` (a deletion commit has `d` instead). A local
inbox is read in place; an HTTP one (`public-inbox-httpd`, lore) is
mirrored with `git clone --mirror URL/git/N.git` and `git fetch` after.
Git is always called with an argument list, never through a shell.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .mail import MAX_MAIL_BYTES

MAX_EPOCHS = 64


class InboxError(Exception):
    """The archive cannot be read at all (exit 2)."""


@dataclass
class Entry:
    epoch: str
    commit: str
    raw: bytes | None
    # Why the mail was not read (too large, a deletion).
    skipped: str | None = None


def _git(git_dir: Path, *args: str, check: bool = True, timeout: float = 600):
    p = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if check and p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise InboxError(f"git {' '.join(args[:2])} in {git_dir}: {err[0]}")
    return p


def is_url(source: str) -> bool:
    return bool(re.match(r"^https?://", source))


class Inbox:
    def __init__(self, source: str, mirror_dir: Path) -> None:
        self.source = source.rstrip("/")
        self.mirror_dir = mirror_dir

    def epochs(self) -> list[tuple[str, Path]]:
        """(name, git dir) of every epoch, mirrored first when remote."""
        found = []
        if is_url(self.source):
            self.mirror_dir.mkdir(parents=True, exist_ok=True)
            for n in range(MAX_EPOCHS):
                local = self.mirror_dir / f"{n}.git"
                url = f"{self.source}/git/{n}.git"
                if local.exists():
                    _git(local, "fetch", "--quiet", "--prune", "origin")
                else:
                    p = subprocess.run(
                        ["git", "clone", "--quiet", "--mirror", url, str(local)],
                        capture_output=True,
                        timeout=600,
                        check=False,
                    )
                    if p.returncode != 0:
                        if n == 0:
                            msg = p.stderr.decode(errors="replace").strip()
                            raise InboxError(f"cannot clone {url}: {msg.splitlines()[-1:]}")
                        break
                found.append((f"{n}", local))
            return found
        root = Path(self.source)
        if (root / "git").is_dir():
            for n in range(MAX_EPOCHS):
                d = root / "git" / f"{n}.git"
                if not d.is_dir():
                    break
                found.append((f"{n}", d))
        elif (root / "objects").is_dir():
            found.append(("v1", root))  # a v1 inbox is one bare repository
        if not found:
            raise InboxError(f"{root}: not a public-inbox archive (no git/0.git, no objects/)")
        return found

    def new_entries(self, cursors: dict[str, str], limit: int) -> Iterator[Entry]:
        """Mails after each epoch's cursor, oldest first, at most `limit`."""
        left = limit
        for name, git_dir in self.epochs():
            if left <= 0:
                return
            head = _git(git_dir, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
            if head.returncode != 0:
                continue  # an empty epoch
            since = cursors.get(name)
            spec = f"{since}..HEAD" if since else "HEAD"
            commits = _git(git_dir, "rev-list", "--reverse", spec).stdout.decode().split()
            for commit in commits[:left]:
                left -= 1
                yield self._entry(name, git_dir, commit)

    def pending(self, cursors: dict[str, str]) -> int:
        """How many mails are still unread after the cursors."""
        total = 0
        for name, git_dir in self.epochs():
            if _git(git_dir, "rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode:
                continue
            since = cursors.get(name)
            spec = f"{since}..HEAD" if since else "HEAD"
            total += int(_git(git_dir, "rev-list", "--count", spec).stdout.decode().strip() or 0)
        return total

    def _entry(self, epoch: str, git_dir: Path, commit: str) -> Entry:
        size = _git(git_dir, "cat-file", "-s", f"{commit}:m", check=False)
        if size.returncode != 0:
            return Entry(epoch, commit, None, "not a mail (a deletion or another file)")
        n = int(size.stdout.decode().strip() or 0)
        if n > MAX_MAIL_BYTES:
            return Entry(epoch, commit, None, f"{n} bytes, over the {MAX_MAIL_BYTES} byte limit")
        blob = _git(git_dir, "cat-file", "blob", f"{commit}:m")
        return Entry(epoch, commit, blob.stdout)
