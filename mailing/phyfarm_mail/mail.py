"""One mail from the archive: parsed, classified, or refused with a reason.

Every byte of a mail is untrusted. Parsing never raises anything but
`Refused`; headers are bounded, a mail is at most MAX_MAIL_BYTES, and the
text we keep is plain str (no control characters) ready to be logged.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

# The largest mail taken, as `phyfarm series show` takes a patch (10 MiB).
MAX_MAIL_BYTES = 10 * 1024 * 1024
MAX_HEADER_CHARS = 2000

# `[PATCH net-next v3 2/5]`, `[RFC PATCH v2 0/3]`, `[PATCH RESEND net 1/1]`.
PREFIX = re.compile(r"^\s*(?:(?:re|fwd?|aw)\s*:\s*)*\[([^\]]*\bPATCH\b[^\]]*)\]\s*(.*)$", re.I)
REPLY = re.compile(r"^\s*(?:re|aw)\s*:", re.I)
COUNTER = re.compile(r"^(\d{1,4})/(\d{1,4})$")
VERSION = re.compile(r"^v(\d{1,4})$", re.I)
CHANGE_ID = re.compile(r"^change-id:\s*(\d{8}-[A-Za-z0-9._-]{1,80}-[0-9a-f]{12})\s*$", re.M)
PW_BOT = re.compile(r"^\s*pw-bot\s*:\s*([A-Za-z-]{1,40})\s*$", re.M | re.I)
NAK = re.compile(r"^\s*(?:NAK|NACK|Nacked-by:.*)\s*$", re.M)
TRAILER = re.compile(r"^\s*(Reviewed-by|Acked-by|Tested-by|Nacked-by):\s*(.{1,200})$", re.M)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class Refused(Exception):
    """A mail that is not taken, and why (one line)."""


def clean(text: str, limit: int = MAX_HEADER_CHARS) -> str:
    """A header value as plain one-line text: control characters replaced."""
    text = CONTROL.sub("?", " ".join(text.split()))
    return text[:limit]


@dataclass
class Prefix:
    version: int = 1
    index: int = 0
    total: int = 0
    tree: str | None = None
    rfc: bool = False
    resend: bool = False


@dataclass
class Mail:
    raw: bytes
    message_id: str
    in_reply_to: str | None
    references: list[str]
    from_name: str
    from_addr: str
    date: datetime
    subject: str
    body: str
    # Set for `[PATCH ...]` mails that are not replies.
    prefix: Prefix | None = None
    # The subject without its `[PATCH ...]` prefix.
    title: str = ""
    is_reply: bool = False
    change_id: str | None = None
    pw_bot: list[str] = field(default_factory=list)
    nak: bool = False
    trailers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def who(self) -> str:
        return f"{self.from_name} <{self.from_addr}>" if self.from_name else self.from_addr

    @property
    def thread_ids(self) -> list[str]:
        """Message-IDs this mail answers, nearest first."""
        ids = [self.in_reply_to] if self.in_reply_to else []
        return ids + [r for r in reversed(self.references) if r not in ids]


def _msgid(value: str | None) -> str | None:
    if not value:
        return None
    m = re.search(r"<([^<>\s]{1,250})>", value)
    return m.group(1) if m else None


def _header(msg: email.message.Message, name: str) -> str | None:
    values = msg.get_all(name) or []
    if len(values) > 1 and name.lower() in ("from", "message-id", "subject", "date"):
        raise Refused(f"{len(values)} {name} headers (a forged or broken mail)")
    if not values:
        return None
    try:
        return clean(str(values[0]))
    except Exception as e:  # the email package raises many kinds on bad encodings
        raise Refused(f"unreadable {name} header: {type(e).__name__}") from None


def _text_body(msg: email.message.Message) -> str:
    """The first text/plain part, decoded; HTML-only mails are refused."""
    html = False
    for part in msg.walk() if msg.is_multipart() else [msg]:
        ctype = part.get_content_type()
        if part.is_multipart():
            continue
        if ctype == "text/html":
            html = True
            continue
        if ctype != "text/plain":
            continue
        if part.get_content_disposition() == "attachment" and msg.is_multipart():
            # git send-email sends inline text; an attached patch is still text.
            pass
        payload = part.get_payload(decode=True)
        if payload is None:
            continue
        charset = part.get_content_charset() or "utf-8"
        try:
            return payload.decode(charset)
        except (LookupError, UnicodeDecodeError):
            raise Refused(f"body does not decode as its declared charset {charset!r}") from None
    if html:
        raise Refused("HTML-only mail (no text/plain part)")
    raise Refused("no text/plain body")


def parse_prefix(inside: str) -> Prefix:
    p = Prefix()
    for word in inside.split():
        w = word.strip(",")
        if w.upper() == "PATCH":
            continue
        if w.upper() == "RFC":
            p.rfc = True
        elif w.upper() == "RESEND":
            p.resend = True
        elif m := VERSION.match(w):
            p.version = int(m.group(1))
        elif m := COUNTER.match(w):
            p.index, p.total = int(m.group(1)), int(m.group(2))
        elif re.fullmatch(r"[a-z][a-z0-9.-]{0,40}", w) and p.tree is None:
            p.tree = w
    if p.total == 0:
        p.index, p.total = 1, 1
    if p.version < 1 or p.total < 1 or p.index > p.total or p.total > 200:
        raise Refused(f"subject prefix [{clean(inside, 80)}] has no valid n/m or version")
    return p


def parse(raw: bytes) -> Mail:
    if len(raw) > MAX_MAIL_BYTES:
        raise Refused(f"{len(raw)} bytes, over the {MAX_MAIL_BYTES} byte limit")
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    except Exception as e:
        raise Refused(f"not a mail: {type(e).__name__}") from None
    message_id = _msgid(_header(msg, "Message-ID"))
    if not message_id:
        raise Refused("no Message-ID")
    from_value = _header(msg, "From")
    if not from_value:
        raise Refused("no From")
    name, addr = email.utils.parseaddr(from_value)
    if not re.fullmatch(r"[^@\s<>\"]{1,100}@[A-Za-z0-9.-]{1,150}", addr or ""):
        raise Refused(f"From {clean(from_value, 80)!r} has no valid address")
    date_value = _header(msg, "Date")
    try:
        date = email.utils.parsedate_to_datetime(date_value or "")
    except (TypeError, ValueError):
        raise Refused(f"Date {date_value!r} is not an RFC 5322 date") from None
    if date.tzinfo is None:
        date = date.replace(tzinfo=UTC)
    subject = _decoded_subject(_header(msg, "Subject") or "")
    body = _text_body(msg)
    refs = re.findall(r"<([^<>\s]{1,250})>", _header(msg, "References") or "")[-50:]
    mail = Mail(
        raw=raw,
        message_id=message_id,
        in_reply_to=_msgid(_header(msg, "In-Reply-To")),
        references=refs,
        from_name=clean(name, 100),
        from_addr=addr.lower(),
        date=date.astimezone(UTC),
        subject=subject,
        body=body,
    )
    mail.is_reply = bool(REPLY.match(subject))
    m = PREFIX.match(subject)
    if m and not mail.is_reply:
        mail.prefix = parse_prefix(m.group(1))
        mail.title = clean(m.group(2), 300)
    cid = CHANGE_ID.search(body)
    mail.change_id = cid.group(1) if cid else None
    unquoted = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith(">"))
    mail.pw_bot = [c.lower() for c in PW_BOT.findall(unquoted)]
    mail.nak = bool(NAK.search(unquoted))
    mail.trailers = [(k, clean(v, 200)) for k, v in TRAILER.findall(unquoted)]
    return mail


def _decoded_subject(value: str) -> str:
    try:
        parts = email.header.decode_header(value)
        text = "".join(
            p.decode(c or "utf-8", errors="replace") if isinstance(p, bytes) else p
            for p, c in parts
        )
    except (LookupError, ValueError):
        text = value
    return clean(text, 400)
