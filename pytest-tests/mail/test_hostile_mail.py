"""Hostile and broken mail through `phyfarm watch`: each is ignored with its
reason logged, nothing is run or recorded for it, the watcher does not crash,
and the archive keeps being followed.

The archive here is a public-inbox v2 epoch written with `git fast-import`
(one commit per mail, the mail as the blob `m`, as public-inbox writes it):
a thousand mails take a second to make, where `public-inbox-mda` would take
minutes. The HTTP path is tested with the real public-inbox in
test_list_path.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

DATE = "Date: Sat, 05 Dec 2026 10:00:00 +0000"


def epoch(root: Path, mails: list[bytes], n: int = 0) -> Path:
    """Append mails to epoch `n` of a v2 inbox at `root`."""
    git = root / "git" / f"{n}.git"
    if not git.exists():
        subprocess.run(["git", "init", "-q", "--bare", str(git)], check=True)
    parent = subprocess.run(
        ["git", f"--git-dir={git}", "rev-parse", "--verify", "-q", "refs/heads/master"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    stream = bytearray()
    for i, m in enumerate(mails):
        stream += b"commit refs/heads/master\ncommitter a <a@b> 1764928800 +0000\n"
        stream += b"data 4\nmail\n"
        if i == 0 and parent:
            stream += f"from {parent}\n".encode()
        stream += f"M 100644 inline m\ndata {len(m)}\n".encode() + m + b"\n"
    subprocess.run(["git", f"--git-dir={git}", "fast-import", "--quiet"],
                   input=bytes(stream), check=True)  # fmt: skip
    subprocess.run(["git", f"--git-dir={git}", "symbolic-ref", "HEAD", "refs/heads/master"],
                   check=True)  # fmt: skip
    return root


def mail(subject: str, mid: str, body: str = "text\n", headers: str = "",
         sender: str = "A <a@lists.phyfarm.test>") -> bytes:  # fmt: skip
    return (
        f"From: {sender}\nSubject: {subject}\nMessage-ID: <{mid}>\n{DATE}\n{headers}\n{body}"
    ).encode()


@pytest.fixture
def watch(phyfarm, tmp_path):
    maint = tmp_path / "maintainers"
    maint.write_text("Jakub Kicinski <kuba@lists.phyfarm.test>\n")
    store = tmp_path / "results.sqlite"

    def run(inbox: Path, *extra: str):
        return phyfarm(
            "--store", str(store), "watch", "--inbox", str(inbox), "--state",
            str(tmp_path / "state"), "--maintainers", str(maint), "--once", *extra,
        )  # fmt: skip

    run.state = lambda: json.loads((tmp_path / "state/state.json").read_text())
    run.store = store
    return run


def test_broken_forged_and_oversized_mails_are_ignored_with_reasons(watch, tmp_path):
    big = b"x" * (50 * 1024 * 1024)
    mails = [
        # Broken MIME: a multipart without its boundary's parts.
        mail("[PATCH net-next 1/1] broken mime", "mime@x",
             headers='MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="zz"\n',
             body="no parts here\n"),
        # A charset that does not exist.
        mail("[PATCH net-next 1/1] charset", "cs@x",
             headers="Content-Type: text/plain; charset=x-no-such-charset\n", body="diff\n"),
        # Bytes that are not the declared charset.
        (mail("[PATCH net-next 1/1] bad utf8", "utf@x",
              headers="Content-Type: text/plain; charset=utf-8\n", body="")
         + b"\xff\xfe\xfa\n"),
        mail("[PATCH net-next 1/1] html", "html@x",
             headers="Content-Type: text/html\n", body="<p>diff</p>\n"),
        # Two From lines: which one wrote it cannot be told.
        mail("Re: [PATCH net-next v8 0/2] x", "forged@x",
             headers="From: Jakub Kicinski <kuba@lists.phyfarm.test>\n", body="pw-bot: cr\n"),
        mail("[PATCH net-next 1/1] no date", "nodate@x").replace(DATE.encode(), b"Date: soon"),
        b"From: a@b\nSubject: no message id\n" + DATE.encode() + b"\n\nx\n",
        mail("[PATCH net-next 1/1] big", "big@x", body="") + big,
        # A thread mixing two series: 1/3 in the thread of a 0/2 cover.
        mail("[PATCH net-next v2 0/2] first", "c2@x"),
        mail("[PATCH net-next v2 1/3] other", "o1@x", headers="In-Reply-To: <c2@x>\n"),
        # After all of it, the archive is still followed: a plain mail.
        mail("hello", "last@x"),
    ]  # fmt: skip
    r = watch(epoch(tmp_path / "inbox", mails))
    assert r.code == 0, r.describe()
    err = r.stderr
    for reason in [
        "no text/plain body",  # the broken multipart: parsed as far as it goes
        "x-no-such-charset",
        "does not decode as its declared charset 'utf-8'",
        "HTML-only mail",
        "2 From headers",
        "Date 'soon' is not an RFC 5322 date",
        "no Message-ID",
        "over the 10485760 byte limit",
        "(a thread mixing two series): ignored",
    ]:
        assert reason in err, f"{reason!r} not logged\n{r.describe()}"
    assert "<last@x>: not a patch or a reply to one: ignored" in err
    assert "11 mails (1 patches, 0 replies, 10 ignored), 0 revisions run" in err, err
    assert "Traceback" not in err
    assert not watch.store.exists() or "revisions" not in watch.state()

    # A later poll reads only what is new.
    epoch(tmp_path / "inbox", [mail("hello again", "later@x")])
    again = watch(tmp_path / "inbox")
    assert "1 mails (0 patches, 0 replies, 1 ignored)" in again.stderr, again.describe()


def test_a_mail_bomb_is_read_in_bounded_polls_and_never_run(watch, tmp_path):
    bomb = [
        mail(f"[PATCH net-next v1 {i % 7 + 1}/9] spam {i}", f"bomb{i}@x",
             sender=f"Bot{i} <bot{i}@spam.test>")
        for i in range(1000)
    ]  # fmt: skip
    inbox = epoch(tmp_path / "inbox", bomb)
    polls = []
    for _ in range(3):
        r = watch(inbox, "--max-mails", "400", "--max-runs", "2")
        assert r.code == 0, r.describe()
        polls.append(r.stderr)
    assert "600 more mails wait in the archive (--max-mails 400)" in polls[0]
    assert "200 more mails wait" in polls[1]
    assert "more mails wait" not in polls[2]
    assert "200 mails (200 patches" in polls[2], polls[2]
    # Every series is missing 8/9 and 9/9: nothing ran, nothing was recorded.
    assert all("0 revisions run" in p for p in polls)
    assert "1000 incomplete revisions, not run: [v1] spam 0 by bot0@spam.test" in polls[2]
    assert not watch.store.exists()


def test_bad_options_and_a_missing_archive_exit_2(watch, tmp_path):
    r = watch(tmp_path / "nowhere")
    assert r.code == 2 and "not a public-inbox archive" in r.stderr, r.describe()
    r = watch(tmp_path, "--max-mails", "0")
    assert r.code == 2 and "--max-mails must be at least 1" in r.stderr, r.describe()
    r = watch(tmp_path, "--smtp", "localhost")
    assert r.code == 2 and "--smtp needs --list" in r.stderr, r.describe()
