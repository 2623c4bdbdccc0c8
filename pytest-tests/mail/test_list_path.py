"""The netdev path end to end, from real parts: series posted with
`git send-email` through an SMTP server into a public-inbox archive served by
`public-inbox-httpd`; `phyfarm watch` follows the archive over HTTP, runs the
complete revisions with `phyfarm run`, counts a maintainer's `pw-bot: cr`
and sends report mails that land back in the archive, threaded.

The runs are the real ones, narrowed by the list owner's run arguments to
the rust variant and the link-flap checks (the family the seeded fault
breaks) with five flaps each, so the whole path takes minutes.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import json
import shlex
import shutil
import smtplib
import subprocess
from email.message import EmailMessage
from pathlib import Path

import pytest
from listserver import LIST, ListServer

REPO = Path(__file__).resolve().parents[2]
V7 = REPO / "patches/rust-phy-enum-check/v7"
V8 = REPO / "patches/rust-phy-enum-check/v8"
FAULT = REPO / "patches/selftest/first-bad-patch/v1"
# One patch, no cover letter: builds with one new rustc warning.
WARNING = REPO / "patches/selftest/new-warning/v1"
MAINTAINER = "Jakub Kicinski <kuba@lists.phyfarm.test>"
# Five flaps, not the farm's twenty: the fault shows at the first, and each
# flap waits out the emulated PHY's 1.5-3 s autonegotiation.
RUN_ARGS = ["--variants", "rust", "--checks", "farm.link_flap", "--flaps", "5"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lst(tmp_path_factory):
    for tool in ("public-inbox-init", "public-inbox-mda", "public-inbox-httpd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (run containers/host-setup.sh)")
    if subprocess.run(["git", "send-email", "-h"], capture_output=True).returncode == 128:
        pytest.skip("git send-email is not installed (run containers/host-setup.sh)")
    s = ListServer(tmp_path_factory.mktemp("list")).start()
    yield s
    s.stop()


def send_series(lst: ListServer, folder: Path, sender: str) -> None:
    p = subprocess.run(
        ["git", "send-email", "--smtp-server=127.0.0.1", f"--smtp-server-port={lst.smtp_port}",
         f"--to={LIST}", f"--from={sender}", "--confirm=never", "--suppress-cc=all",
         "--thread", "--no-chain-reply-to", "--quiet",
         *sorted(str(f) for f in folder.glob("*.patch"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr


def reply(lst: ListServer, to_id: str, subject: str, sender: str, text: str) -> None:
    m = EmailMessage()
    m["From"], m["To"], m["Subject"] = sender, LIST, f"Re: {subject}"
    m["Message-ID"] = email.utils.make_msgid("reply", domain="lists.phyfarm.test")
    m["Date"] = email.utils.formatdate()
    m["In-Reply-To"], m["References"] = f"<{to_id}>", f"<{to_id}>"
    m.set_content(text)
    with smtplib.SMTP("127.0.0.1", lst.smtp_port) as s:
        s.send_message(m)


def parsed(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


def reports(lst: ListServer) -> list:
    return [m for m in map(parsed, lst.archived()) if m["X-Phyfarm"] == "report"]


def cover_of(lst: ListServer, subject_part: str):
    for m in map(parsed, lst.archived()):
        if subject_part in str(m["Subject"]) and not str(m["Subject"]).startswith("Re:"):
            return m
    raise AssertionError(f"no mail {subject_part!r} in the archive")


def test_series_by_mail_are_run_reported_threaded_and_a_maintainer_objects(
    lst, phyfarm, podman, tmp_path
):
    store = tmp_path / "results.sqlite"
    maint = tmp_path / "maintainers"
    maint.write_text(f"# netdev maintainers\n{MAINTAINER}\n")
    state = tmp_path / "watch"

    def watch():
        r = phyfarm(
            "--store", str(store), "watch", "--inbox", lst.url, "--state", str(state),
            "--maintainers", str(maint), "--list", LIST,
            "--smtp", f"127.0.0.1:{lst.smtp_port}", "--once", "--", *RUN_ARGS,
        )  # fmt: skip
        assert r.code == 0, r.describe()
        return r

    send_series(lst, V7, "FUJITA Tomonori <fujita.tomonori@lists.phyfarm.test>")
    send_series(lst, V8, "FUJITA Tomonori <fujita.tomonori@lists.phyfarm.test>")
    send_series(lst, FAULT, "Selftest <selftest@lists.phyfarm.test>")
    send_series(lst, WARNING, "Selftest Two <warn@lists.phyfarm.test>")
    first = watch()

    # v7 was posted as 3/5 and 4/5 only: never run, and the log says why.
    assert "[v7 4/5]" in first.stderr and "waiting for 1/5, 2/5, 5/5" in first.stderr, (
        first.describe()
    )
    assert "rust-phy-enum-check/v7" not in first.stderr
    assert "3 revisions run, 3 reports sent" in first.stderr, first.describe()

    v8_cover = cover_of(lst, "[PATCH net-next v8 0/2]")
    fault_cover = cover_of(lst, "[PATCH net-next v1 0/2]")
    got = reports(lst)
    assert len(got) == 3, [str(m["Subject"]) for m in got]
    by_parent = {str(m["In-Reply-To"]): m for m in got}
    v8_report = by_parent[str(v8_cover["Message-ID"])]
    fault_report = by_parent[str(fault_cover["Message-ID"])]
    assert str(v8_report["Subject"]).startswith("Re: [PATCH net-next v8 0/2]")
    assert str(v8_cover["Message-ID"]) in str(v8_report["References"])
    v8_text = v8_report.get_content()
    assert "rust-phy-enum-check/v8: awaiting-review" in v8_text, v8_text
    assert "b4 am -o rust-phy-enum-check" in v8_text
    fault_text = fault_report.get_content()
    assert ": changes-requested" in fault_text, fault_text
    assert "FAIL: farm.link_flap[reset_after_link_loss] (rust)" in fault_text, fault_text
    assert "reproduce: b4 am" in fault_text and "--checks farm.link_flap" in fault_text
    # 1/2 passes link-flap, 2/2 breaks it: found on the kernels of patch 1 alone.
    assert "first bad patch: 2/2 net: phy: ax88796b_rust: skip the PHY reset" in fault_text, (
        fault_text
    )
    # The list and the series' author, nobody else.
    assert {m["To"] for m in got} >= {f"{LIST}, fujita.tomonori@lists.phyfarm.test"}
    assert {r for d in lst.others for r in d.rcpt} == {
        "fujita.tomonori@lists.phyfarm.test",
        "selftest@lists.phyfarm.test",
        "warn@lists.phyfarm.test",
    }

    # A series of one patch without a cover letter: the report answers the
    # patch; a build check has no farm reproducer and no bisection.
    warn_patch = cover_of(lst, "[PATCH net-next v1 1/1] net: phy: ax88796b_rust: read the link")
    warn_text = by_parent[str(warn_patch["Message-ID"])].get_content()
    assert ": changes-requested" in warn_text, warn_text
    assert "FAIL: build.rust.patch1" in warn_text and "unused variable: `lpa`" in warn_text
    assert "on the farm, from this run" not in warn_text and "first bad patch" not in warn_text

    check_the_reports_reproducer(phyfarm, store, fault_text)

    # Nothing changed: no new mail.
    quiet = watch()
    assert "0 revisions run, 0 reports sent" in quiet.stderr, quiet.describe()
    assert len(reports(lst)) == 3

    # Anyone may write pw-bot; only a maintainer's counts.
    subject = str(v8_cover["Subject"])
    drive_by = "Drive By <someone@lists.phyfarm.test>"
    text = f"Looks odd.\n\npw-bot: cr\nReviewed-by: {drive_by}\n"
    reply(lst, str(v8_cover["Message-ID"])[1:-1], subject, drive_by, text)
    shown = watch()
    assert "not a maintainer: shown, not counted" in shown.stderr, shown.describe()
    assert len(reports(lst)) == 3
    v = phyfarm("--store", str(store), "verdict", "rust-phy-enum-check/v8")
    assert v.code == 0 and "awaiting-review" in v.stdout, v.describe()

    text = "> pw-bot: cr\nquoted, not a command\n\nPlease split patch 1.\n\npw-bot: cr\n"
    reply(lst, str(v8_cover["Message-ID"])[1:-1], subject, MAINTAINER, text)
    objected = watch()
    assert "nack by Jakub Kicinski" in objected.stderr, objected.describe()
    v = phyfarm("--store", str(store), "verdict", "rust-phy-enum-check/v8")
    assert v.code == 1 and "changes-requested" in v.stdout, v.describe()
    got = reports(lst)
    assert len(got) == 4, [str(m["Subject"]) for m in got]
    text = got[-1].get_content()
    assert "rust-phy-enum-check/v8: changes-requested" in text, text
    assert "nack by Jakub Kicinski" in text and "pw-bot: cr" in text
    assert "pw-bot: cr from Drive By" in text  # shown, not counted
    assert "Reviewed-by: Drive By <someone@lists.phyfarm.test>" in text


def check_the_reports_reproducer(phyfarm, store: Path, text: str) -> None:
    """The report's `phyfarm repro` line reruns the failing check from the
    run's recorded artifacts, as typed; --shell then lands in its guest; a
    kernel that changed since the run is refused."""
    prefix = "    on the farm, from this run: "
    lines = [ln[len(prefix) :] for ln in text.splitlines() if ln.startswith(prefix)]
    assert lines, text
    argv = shlex.split(lines[0])
    assert argv[:2] == ["phyfarm", "repro"] and "--run" in argv, argv
    assert argv[3].startswith("farm.link_flap["), argv
    run_dir = Path(argv[argv.index("--run") + 1])
    r = phyfarm(*argv[1:])
    assert r.code == 1, r.describe()
    assert "recorded: FAIL in call" in r.stdout and "now:      FAIL in call" in r.stdout, (
        r.describe()
    )
    assert "emulator arguments: as recorded" in r.stdout, r.describe()
    assert "files of the guest plan match the run's SHA-256" in r.stderr, r.describe()
    out = Path(r.stdout.strip().splitlines()[-1])
    assert out.parent == run_dir / "repro" and (out / "results.json").is_file()

    # The verdict and the KCIDB export name the same command (the store
    # finds the run folder without --run).
    ref = argv[2]
    v = phyfarm("--store", str(store), "verdict", ref)
    assert f"    reproduce: {shlex.join(argv[:-2])}" in v.stdout, v.describe()
    # The bisection's finding is in the store: the verdict shows it.
    assert "  first bad patch: 2/2 net: phy: ax88796b_rust: skip the PHY reset" in v.stdout, (
        v.describe()
    )
    k = phyfarm("--store", str(store), "export", "kcidb", ref)
    tests = json.loads(k.stdout)["tests"]
    assert any(t.get("misc", {}).get("reproducer") == shlex.join(argv[:-2]) for t in tests)

    shell = subprocess.run(
        [str(phyfarm.binary), "--store", str(store), *argv[1:-2], "--shell"],
        input="cat /sys/bus/usb/drivers/asix/*/net/*/operstate\n:link down\n:bogus\n:quit\n",
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert shell.returncode == 1, shell.stderr[-3000:]
    assert "phyfarm shell: rust kernel" in shell.stdout, shell.stdout[-3000:]
    assert "rust# " in shell.stdout and "link down\n" in shell.stdout
    assert "unknown command ':bogus'" in shell.stdout

    kernel = run_dir / "rust" / "bzImage"
    built = kernel.read_bytes()
    kernel.write_bytes(built + b"rebuilt")
    try:
        r = phyfarm(*argv[1:])
    finally:
        kernel.write_bytes(built)
    assert r.code == 2 and "bzImage changed since the run" in r.stderr, r.describe()
