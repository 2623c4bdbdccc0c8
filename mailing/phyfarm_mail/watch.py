"""`phyfarm watch`: a mailing list's archive in, verdicts and report mails out.

Each poll reads the mails the archive gained (at most --max-mails), files
patches into revisions, runs every complete revision with `phyfarm run`
(at most --max-runs a poll; the rest wait for the next), turns maintainers'
`pw-bot:` replies and NAKs into review records dated by their mail, and
sends one report mail per series whose verdict changed. What is skipped is
printed with its reason. The state (cursors, open revisions, what was
reported) is a JSON file written atomically after every mail, so a watcher
that is killed goes on where it stopped.
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import os
import signal
import smtplib
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .bisect import AGREE, RUNS_PER_STEP, Bisect, failing
from .group import Grouper, slug
from .inbox import Inbox, InboxError
from .mail import Refused, clean, parse
from .report import body, compose, send

REPO = Path(__file__).resolve().parents[2]
NACKS = {"changes-requested", "cr", "reject", "rejected", "rfc", "deferred", "not-applicable"}
ACKS = {"accept", "accepted", "applied"}
DEFAULT_BASE = {"package": "linux-source-6.12", "distro": "debian trixie"}


def log(level: str, text: str) -> None:
    print(f"{level}: {clean(text, 1000)}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    run_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, run_args = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(
        prog="phyfarm watch",
        description=(
            "Follow a public-inbox archive: run every new complete series revision with "
            "`phyfarm run`, record maintainers' pw-bot replies and NAKs as reviews, and "
            "send one report mail per verdict change. Arguments after `--` go to "
            "`phyfarm run` (e.g. -- --variants rust --checks FAMILY, a family that "
            "`phyfarm farm plan` lists)."
        ),
    )
    ap.add_argument(
        "--inbox",
        required=True,
        metavar="URL|PATH",
        help="the archive: public-inbox-httpd's inbox URL or a v1/v2 inbox folder",
    )
    ap.add_argument(
        "--state",
        type=Path,
        metavar="DIR",
        help="where the watcher keeps its state, mails and revision folders "
        "[default: <cache>/mail/<inbox>]",
    )
    ap.add_argument(
        "--maintainers",
        type=Path,
        metavar="FILE",
        help="one address per line (Name <addr> or addr; # comments): whose "
        "pw-bot commands and NAKs count [default: nobody's]",
    )
    ap.add_argument("--list", metavar="ADDR", help="the list's address: reports go there")
    ap.add_argument(
        "--smtp",
        metavar="HOST:PORT",
        help="SMTP server for report mails [default: reports are printed only]",
    )
    ap.add_argument(
        "--from",
        dest="sender",
        default="phyfarm <phyfarm@localhost>",
        metavar="ADDR",
        help="From of report mails [default: %(default)s]",
    )
    ap.add_argument(
        "--no-cc-author",
        action="store_true",
        help="send reports to the list only, not to the series' author",
    )
    ap.add_argument(
        "--dashboard-url",
        default=os.environ.get("PHYFARM_DASHBOARD_URL", "http://127.0.0.1:8080"),
        metavar="URL",
        help="dashboard base URL for the report's link",
    )
    ap.add_argument("--once", action="store_true", help="one poll, then exit")
    ap.add_argument(
        "--interval",
        type=int,
        default=300,
        metavar="SECS",
        help="seconds between polls [default: %(default)s]",
    )
    ap.add_argument(
        "--max-mails",
        type=int,
        default=500,
        metavar="N",
        help="mails read per poll; the rest wait for the next [default: %(default)s]",
    )
    ap.add_argument(
        "--max-runs",
        type=int,
        default=4,
        metavar="N",
        help="revisions run per poll [default: %(default)s]",
    )
    ap.add_argument(
        "--max-reports-per-hour",
        type=int,
        default=30,
        metavar="N",
        help="report mails sent in any hour [default: %(default)s]",
    )
    a = ap.parse_args(argv)
    a.run_args = run_args
    for opt in ("interval", "max_mails", "max_runs", "max_reports_per_hour"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1")
    if a.smtp and not a.list:
        ap.error("--smtp needs --list (the list the reports go to)")
    if a.smtp and not a.smtp.rpartition(":")[2].isdigit():
        ap.error(f"--smtp {a.smtp!r}: expected HOST:PORT")
    return a


def load_maintainers(path: Path | None) -> set[str]:
    if path is None:
        return set()
    out = set()
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"E: --maintainers {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        addr = email.utils.parseaddr(line)[1].lower()
        if "@" not in addr:
            raise SystemExit(f"E: {path}:{n}: {line!r} is not an address")
        out.add(addr)
    return out


class Watcher:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.phyfarm = os.environ.get("PHYFARM_BIN", "phyfarm")
        cache = Path(os.environ.get("PHYFARM_CACHE", Path.home() / ".cache/phyfarm"))
        self.dir = a.state or cache / "mail" / slug(a.inbox.split("://")[-1], 80)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "mail").mkdir(exist_ok=True)
        self.state_file = self.dir / "state.json"
        self.state = self._load()
        self.maintainers = load_maintainers(a.maintainers)
        self.inbox = Inbox(a.inbox, self.dir / "mirror")
        self.grouper = Grouper(self.state, REPO)

    def _load(self) -> dict:
        if not self.state_file.exists():
            return {}
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"E: {self.state_file}: unreadable watch state: {e}") from None

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_file)

    # --- one poll -------------------------------------------------------

    def poll(self) -> dict[str, int]:
        st = self.state
        cursors = st.setdefault("cursors", {})
        st.setdefault("replies", [])
        n = {"mails": 0, "patches": 0, "replies": 0, "ignored": 0, "runs": 0, "reports": 0}
        for e in self.inbox.new_entries(cursors, self.a.max_mails):
            n["mails"] += 1
            where = f"mail {e.epoch}:{e.commit[:12]}"
            if e.raw is None:
                log("W", f"{where}: skipped: {e.skipped}")
                n["ignored"] += 1
            else:
                kind = self.take(where, e.raw)
                n[kind] += 1
            cursors[e.epoch] = e.commit
            if n["mails"] % 50 == 0:
                self.save()  # the cursor and what it read, together
        left = self.inbox.pending(cursors)
        if left:
            log("W", f"{left} more mails wait in the archive (--max-mails {self.a.max_mails})")
        touched = set()
        for key in self.grouper.complete():
            if n["runs"] >= self.a.max_runs:
                waiting = len(self.grouper.complete())
                log("I", f"{waiting} complete revisions wait for the next poll")
                break
            ref = self.run(key)
            if ref:
                touched.add(ref)
                n["runs"] += 1
        touched |= self.replies()
        self.incomplete()
        n["reports"] = self.reports()
        self.save()
        return n

    def incomplete(self) -> None:
        """Says which revisions still wait for patches (the first few)."""
        waiting = [
            g for g in self.state["groups"].values() if not g.get("done") and Grouper.missing(g)
        ]
        if not waiting:
            return
        shown = "; ".join(
            f"[v{g['version']}] {clean(g['title'], 60)} by {g['author']}: "
            f"waiting for {', '.join(Grouper.missing(g)[:5])}"
            for g in waiting[:3]
        )
        more = f" (and {len(waiting) - 3} more)" if len(waiting) > 3 else ""
        log("I", f"{len(waiting)} incomplete revisions, not run: {shown}{more}")

    def take(self, where: str, raw: bytes) -> str:
        try:
            mail = parse(raw)
        except Refused as r:
            log("W", f"{where}: ignored: {r}")
            return "ignored"
        name = hashlib.sha256(raw).hexdigest()[:32] + ".eml"
        path = self.dir / "mail" / name
        if not path.exists():
            path.write_bytes(raw)
        own = email.utils.parseaddr(self.a.sender)[1].lower()
        if mail.from_addr == own:
            log("I", f"{where} <{mail.message_id}>: phyfarm's own report: skipped")
            return "ignored"
        if mail.prefix:
            self.state.setdefault("msgs_title", {})[mail.message_id] = mail.title
            key, what = self.grouper.add(mail, str(path))
            log("I" if key else "W", f"{where} <{mail.message_id}>: {what}")
            return "patches" if key else "ignored"
        if mail.thread_ids:
            self.state["replies"].append({"file": str(path), "id": mail.message_id})
            if len(self.state["replies"]) > 2000:
                dropped = self.state["replies"].pop(0)
                log("W", f"reply <{dropped['id']}>: its thread never arrived: dropped")
            return "replies"
        log("I", f"{where} <{mail.message_id}>: not a patch or a reply to one: ignored")
        return "ignored"

    def run(self, key: str) -> str | None:
        g = self.state["groups"][key]
        patchset = self.grouper.patchset(g)
        seen = self.state.setdefault("patchsets", {})
        if patchset in seen:
            g["done"] = True
            g["ref"] = seen[patchset]
            log(
                "I",
                f"[v{g['version']}] {clean(g['title'], 80)}: the same patches as "
                f"{seen[patchset]} (posted twice): not run again",
            )
            return None
        try:
            ref, rev_dir = self.grouper.write_revision(key, self.dir / "series", DEFAULT_BASE)
        except FileExistsError as e:
            g["done"] = True
            log("W", f"[v{g['version']}] {clean(g['title'], 80)}: {e}: not run")
            return None
        seen[patchset] = ref
        for m in [g["cover"]] + list(g["patches"].values()):
            if m:
                self.state["msgs"][m["id"]] = {"group": key}
        cover = g["cover"] or {"id": g["patches"]["1"]["id"], "subject": g["title"]}
        self.state.setdefault("revisions", {})[ref] = {
            "cover_id": cover["id"],
            "cover_subject": cover["subject"],
            "author": g["author"],
            "dir": str(rev_dir),
            "notes": [],
        }
        self.save()
        argv = [self.phyfarm, "run", str(rev_dir), *self.a.run_args]
        if not {"-o", "--out"} & set(self.a.run_args):
            # Its own run folder: a series of the same name run from
            # patches/ keeps its own.
            argv += ["-o", self.run_dir(ref)]
        log("I", f"{ref}: running {' '.join(argv[1:])}")
        started = time.monotonic()
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, check=False).returncode
        log("I", f"{ref}: phyfarm run exited {code} after {time.monotonic() - started:.0f} s")
        self.state["revisions"][ref]["exit"] = code
        if code == 1 and g["total"] > 1:
            self.first_bad(ref, g, rev_dir)
        return ref

    def run_dir(self, ref: str) -> str | None:
        """The revision's run folder (None: the owner's `-o` decides)."""
        if {"-o", "--out"} & set(self.a.run_args):
            return None
        return str((self.dir / "runs" / ref.replace("/", "-")).resolve())

    def first_bad(self, ref: str, g: dict, rev_dir: Path) -> None:
        p = subprocess.run([self.phyfarm, "verdict", ref, "--json"],
                           capture_output=True, text=True, check=False)  # fmt: skip
        try:
            verdict = json.loads(p.stdout)
        except ValueError:
            return
        if not failing(verdict):
            return
        log("I", f"{ref}: a farm check FAILs where the base PASSes: finding the first bad patch")
        b = Bisect(self.phyfarm, self.dir, log, self.a.run_args)
        name = ref.partition("/")[0]
        found = b.find(rev_dir, name, g["version"], g["total"], verdict)
        if found and found[0].isdigit():
            k = found.partition("/")[0]
            subject = self.state["msgs_title"].get(g["patches"][k]["id"], "")
            found = f"{found} {subject}".strip()
        if found:
            log("I", f"{ref}: first bad patch: {found}")
            self.state["revisions"][ref]["first_bad"] = found
        if found and found[0].isdigit() and b.check:
            # In the store too: the verdict, the exports and the pages show it.
            path, variant = b.check
            how = (
                f"{RUNS_PER_STEP} runs at most per step, {AGREE} agreeing decide; "
                f"the base passes, patches 1..{g['total']} fail; " + "; ".join(b.steps)
            )
            argv = [self.phyfarm, "first-bad", ref, path, "--patch", found.partition("/")[0],
                    "--how", how[:1900]]  # fmt: skip
            if variant:
                argv += ["--variant", variant]
            p = subprocess.run(argv, capture_output=True, text=True, check=False)
            if p.returncode != 0:
                log("W", f"{ref}: first bad patch not recorded: {p.stderr.strip()[-300:]}")
        self.save()

    def replies(self) -> set[str]:
        touched = set()
        keep = []
        for r in self.state["replies"]:
            try:
                mail = parse(Path(r["file"]).read_bytes())
            except (OSError, Refused) as e:
                log("W", f"reply <{r['id']}>: {e}: dropped")
                continue
            ref = self.ref_of(mail)
            if ref is None:
                keep.append(r)
                continue
            self.review(ref, mail)
            touched.add(ref)
        self.state["replies"] = keep
        return touched

    def ref_of(self, mail) -> str | None:
        for mid in mail.thread_ids:
            known = self.state["msgs"].get(mid)
            if known:
                g = self.state["groups"].get(known["group"], {})
                return g.get("ref") if g.get("ref") in self.state.get("revisions", {}) else None
        return None

    def review(self, ref: str, mail) -> None:
        info = self.state["revisions"][ref]
        maintainer = mail.from_addr in self.maintainers
        for k, v in mail.trailers:
            log("I", f"{ref}: {k}: {v} (from <{mail.message_id}>): shown, not counted")
            info["notes"].append(f"{k}: {v}")
        commands = list(mail.pw_bot) + (["nak"] if mail.nak else [])
        for cmd in commands:
            if not maintainer:
                note = f"pw-bot: {cmd} from {mail.who}: not a maintainer"
                log("I", f"{ref}: {note}: shown, not counted")
                info["notes"].append(note)
                continue
            if cmd in ACKS:
                kind = "--ack"
            elif cmd in NACKS or cmd == "nak":
                kind = "--nack"
            else:
                log("I", f"{ref}: pw-bot: {cmd} from {mail.who}: no verdict meaning: shown only")
                info["notes"].append(f"pw-bot: {cmd} from {mail.who}")
                continue
            reason = f"{'NAK' if cmd == 'nak' else 'pw-bot: ' + cmd} (mail <{mail.message_id}>)"
            at = mail.date.strftime("%Y-%m-%dT%H:%M:%SZ")
            argv = [self.phyfarm, "review", kind, ref, "--by", mail.who, "--reason", reason]
            p = subprocess.run([*argv, "--now", at], capture_output=True, text=True, check=False)
            if p.returncode != 0 and "before" in p.stderr:
                # Dated before the revision's last transition (the mail was
                # written before phyfarm ran it): recorded now, dated in the reason.
                argv[-1] = f"{reason}, dated {at}"
                p = subprocess.run(argv, capture_output=True, text=True, check=False)
            if p.returncode != 0:
                log("E", f"{ref}: recording {reason}: {p.stderr.strip()[-300:]}")
            else:
                log("I", f"{ref}: {kind[2:]} by {mail.who} recorded at {at}: {reason}")

    def reports(self) -> int:
        sent = 0
        hour_ago = time.time() - 3600
        stamps = [t for t in self.state.get("sent", []) if t > hour_ago]
        for ref, info in sorted(self.state.get("revisions", {}).items()):
            try:
                sent += self.report(ref, info, stamps)
            except Exception as e:  # one revision's report never stops the others
                log("E", f"{ref}: report not made: {type(e).__name__}: {e}")
        self.state["sent"] = stamps
        return sent

    def report(self, ref: str, info: dict, stamps: list[float]) -> int:
        """Mails the revision's verdict if it changed since the last report: 1 if sent."""
        p = subprocess.run(
            [self.phyfarm, "verdict", ref, "--json"], capture_output=True, text=True, check=False
        )
        try:
            verdict = json.loads(p.stdout)
        except ValueError:
            log("W", f"{ref}: no verdict ({p.stderr.strip()[-200:]})")
            return 0
        state = verdict.get("state")
        if state == info.get("reported"):
            return 0
        if len(stamps) >= self.a.max_reports_per_hour:
            held = f"{len(stamps)} sent this hour"
            log("W", f"{ref}: report held: {held} (--max-reports-per-hour)")
            return 0
        text = body(
            verdict,
            ref,
            (ref.partition("/")[0], info["cover_id"], self.a.run_args),
            f"{self.a.dashboard_url.rstrip('/')}/series/{ref}",
            info.get("notes", []),
            info.get("first_bad"),
            self.run_dir(ref),
        )
        to = [self.a.list or "list@localhost"]
        if not self.a.no_cc_author and info["author"] not in to:
            to.append(info["author"])
        domain = self.a.sender.rpartition("@")[2].strip("> ") or "localhost"
        msg = compose(
            sender=self.a.sender,
            to=to,
            cover_subject=info["cover_subject"],
            cover_id=info["cover_id"],
            references=[],
            text=text,
            domain=domain,
        )
        if self.a.smtp:
            try:
                send(msg, self.a.smtp)
            except (OSError, smtplib.SMTPException) as e:
                log("E", f"{ref}: report mail not sent ({e}); tried again next poll")
                return 0
            log("I", f"{ref}: report mail sent to {', '.join(to)}: {state}")
        else:
            print(msg.as_string(), flush=True)
            log("I", f"{ref}: report ({state}) printed (no --smtp)")
        info["reported"] = state
        stamps.append(time.time())
        self.save()
        return 1


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        w = Watcher(a)
        while True:
            started = datetime.now(UTC).strftime("%H:%M:%S")
            n = w.poll()
            log(
                "I",
                f"poll at {started}: {n['mails']} mails ({n['patches']} patches, "
                f"{n['replies']} replies, {n['ignored']} ignored), {n['runs']} revisions run, "
                f"{n['reports']} reports sent",
            )
            if a.once:
                return 0
            time.sleep(a.interval)
    except InboxError as e:
        log("E", str(e))
        return 2
    except (OSError, subprocess.SubprocessError) as e:
        log("E", f"{type(e).__name__}: {e} (the state is saved; run again to go on)")
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        log("I", "stopped; the state is saved")
        return 130
