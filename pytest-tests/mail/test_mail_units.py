"""The mail path's rules one by one: grouping mails into revisions the way
b4 does, what counts as a pw-bot command, the report's threading and
escaping, and the renumbered prefixes of the first-bad-patch search."""

from __future__ import annotations

import email
import email.policy
from pathlib import Path

import pytest
from phyfarm_mail.bisect import failing, renumber
from phyfarm_mail.group import Grouper
from phyfarm_mail.mail import Refused, parse
from phyfarm_mail.report import body, compose

REPO = Path(__file__).resolve().parents[2]
DIFF = "---\n f | 1 +\n\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+{}\n"


def raw(subject, mid, *, sender="A <a@x.test>", reply_to=None, body="text\n") -> bytes:
    head = f"From: {sender}\nSubject: {subject}\nMessage-ID: <{mid}>\n"
    head += "Date: Sat, 05 Dec 2026 10:00:00 +0000\n"
    if reply_to:
        head += f"In-Reply-To: <{reply_to}>\nReferences: <{reply_to}>\n"
    return (head + "\n" + body).encode()


def patch(n, m, mid, v=2, **kw):
    return parse(raw(f"[PATCH net-next v{v} {n}/{m}] change {n}", mid,
                     body="msg\n" + DIFF.format(f"{mid}"), **kw))  # fmt: skip


@pytest.fixture
def g():
    return Grouper({}, REPO)


def test_a_threaded_series_completes_when_its_last_patch_arrives_late(g):
    cover = parse(
        raw("[PATCH net-next v2 0/2] two", "c@x", body="change-id: 20261205-two-0123456789ab\n")
    )
    assert g.add(cover, "c")[0] == "c@x"
    key, what = g.add(patch(2, 2, "p2@x", reply_to="c@x"), "p2")
    assert key == "c@x" and "waiting for 1/2" in what
    assert g.complete() == []
    key, what = g.add(patch(1, 2, "p1@x", reply_to="c@x"), "p1")
    assert what.endswith("the revision is complete") and g.complete() == ["c@x"]
    assert g.state["groups"]["c@x"]["change_id"] == "20261205-two-0123456789ab"


def test_a_series_posted_unthreaded_in_two_parts_joins_its_authors_open_revision(g):
    g.add(patch(1, 3, "a1@x"), "a1")
    g.add(patch(2, 3, "a2@x"), "a2")
    # Somebody else's v2 x/3 does not join it.
    other = patch(3, 3, "b3@x", sender="B <b@x.test>")
    assert g.add(other, "b3")[0] == "b3@x"
    assert g.add(patch(3, 3, "a3@x"), "a3")[0] == "a1@x"
    assert g.complete() == ["a1@x"]


def test_the_same_patch_twice_and_a_mixed_thread_are_ignored_with_reasons(g):
    g.add(parse(raw("[PATCH net-next v2 0/3] three", "c@x")), "c")
    g.add(patch(1, 3, "p1@x", reply_to="c@x"), "p1")
    assert "already taken" in g.add(patch(1, 3, "p1@x", reply_to="c@x"), "p1")[1]
    again = patch(1, 3, "p1b@x", reply_to="c@x")
    assert "arrived twice: the first is kept" in g.add(again, "p1b")[1]
    mixed = g.add(patch(1, 4, "m1@x", reply_to="c@x"), "m1")
    assert mixed[0] is None and "a thread mixing two series" in mixed[1]


def test_a_new_version_in_reply_to_the_old_one_is_a_revision_of_its_own(g):
    g.add(patch(1, 1, "v1@x", v=1), "v1")
    key, _ = g.add(patch(1, 1, "v2@x", v=2, reply_to="v1@x"), "v2")
    assert key == "v2@x" and sorted(g.complete()) == ["v1@x", "v2@x"]


def test_a_revision_posted_twice_has_the_same_patchset_whatever_its_mails_say(g):
    g.add(patch(1, 1, "x1@x"), "x1")
    g.add(parse(raw("[PATCH RESEND net-next v2 1/1] change 1", "x2@x", sender="C <c@x.test>",
                    body="other words\n" + DIFF.format("x1@x"))), "x2")  # fmt: skip
    a, b = (g.state["groups"][k] for k in ("x1@x", "x2@x"))
    assert b["resend"] and Grouper.patchset(a) == Grouper.patchset(b)


def test_a_revision_folder_is_named_safely_whatever_the_subject_says(g, tmp_path):
    src = tmp_path / "m.eml"
    src.write_bytes(b"From: a\r\nSubject: x\r\n\r\nbody\r\n")
    m = parse(raw("[PATCH v1 1/1] ../../etc/passwd $(id) `x`", "evil@x", body=DIFF.format(1)))
    key, _ = g.add(m, str(src))
    ref, d = g.write_revision(key, tmp_path / "series", {"package": "p", "distro": "d"})
    name = ref.split("/")[0]
    assert d.parent.parent == tmp_path / "series"
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert (d / "0001.patch").read_bytes() == b"From: a\nSubject: x\n\nbody\n"
    assert 'name = "' + name + '"' in (d.parent / "series.toml").read_text()
    with pytest.raises(FileExistsError):
        g.state["groups"][key]["done"] = False
        g.write_revision(key, tmp_path / "series", {"package": "p", "distro": "d"})


def test_pw_bot_commands_are_unquoted_lines_only():
    m = parse(raw("Re: [PATCH v1 1/1] x", "r@x", reply_to="p@x",
                  body="> pw-bot: accept\nsee pw-bot: cr inline\n\npw-bot: cr\nNAK\n"
                  "Reviewed-by: Someone <s@x.test>\n"))  # fmt: skip
    assert m.pw_bot == ["cr"] and m.nak and m.trailers == [("Reviewed-by", "Someone <s@x.test>")]
    assert m.prefix is None and m.is_reply


def test_headers_with_control_characters_are_cleaned_and_bad_dates_refused():
    m = parse(raw("[PATCH v1 1/1] a\x1b[31mred", "e@x", sender="Ev\x07il <e@x.test>"))
    assert "\x1b" not in m.title and "\x07" not in m.who
    with pytest.raises(Refused, match="not an RFC 5322 date"):
        parse(raw("x", "d@x").replace(b"Sat, 05 Dec 2026 10:00:00 +0000", b"yesterday"))


def test_the_report_answers_the_cover_letter_and_cleans_what_it_quotes():
    verdict = {
        "state": "changes-requested",
        "reason": "new failures against the base: farm.link_flap[plain] (rust) FAIL",
        "base_run": "b1",
        "checks": [
            {"path": "farm.link_flap[plain]", "variant": "rust", "status": "FAIL",
             "log_excerpt": "no carrier\x1b[2J after 10s\nsecond line"},
            {"path": "boot.drivers", "variant": "rust", "status": "PASS"},
        ],
        "reproducers": [
            {"path": "farm.link_flap[plain]", "variant": "c", "command": "wrong variant"},
            {"path": "farm.link_flap[plain]", "variant": "rust",
             "command": "phyfarm repro s/v2 'farm.link_flap[plain]' --variant rust\x1b[2J"},
        ],
    }  # fmt: skip
    text = body(verdict, "s/v2", ("s", "c@x", ["--variants", "rust"]), "http://d/series/s/v2",
                ["pw-bot: cr from X: not a maintainer"], "2/3 net: broke it",
                "/var/lib/phyfarm/runs/s v2")  # fmt: skip
    assert (
        "    on the farm, from this run: phyfarm repro s/v2 'farm.link_flap[plain]' "
        "--variant rust?[2J --run '/var/lib/phyfarm/runs/s v2'\n"
    ) in text, text
    assert "wrong variant" not in text
    assert "FAIL: farm.link_flap[plain] (rust)" in text and "\x1b" not in text
    assert "second line" not in text
    assert "first bad patch: 2/3 net: broke it" in text
    assert "phyfarm run s/*.mbx --variants rust --checks farm.link_flap" in text
    msg = compose(sender="phyfarm <ci@x>", to=["l@x", "a@x"], cover_subject="[PATCH v2 0/3] t",
                  cover_id="c@x", references=[], text=text, domain="x")  # fmt: skip
    back = email.message_from_bytes(msg.as_bytes(), policy=email.policy.default)
    assert back["In-Reply-To"] == "<c@x>" and back["References"] == "<c@x>"
    assert back["Subject"] == "Re: [PATCH v2 0/3] t" and back["To"] == "l@x, a@x"


def test_prefixes_are_renumbered_and_only_new_farm_failures_are_bisected():
    m = b"From: a\nSubject: [PATCH net-next v3 2/5] x\n\n[PATCH 2/5] in the body\n"
    assert (
        renumber(m, 2)
        == b"From: a\nSubject: [PATCH net-next v3 2/2] x\n\n[PATCH 2/5] in the body\n"
    )
    finding = {
        "kind": "new-failure",
        "check": {"path": "farm.probe", "variant": "c"},
        "status": "FAIL",
    }
    still = {**finding, "kind": "still-failing"}
    build = {**finding, "check": {"path": "build.rust.patch2", "variant": None}}
    assert failing({"vs_base": [finding, still, build]}) == [("farm.probe", "c")]
