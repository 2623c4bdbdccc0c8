"""A mailing list on loopback, from real parts: an SMTP server (aiosmtpd)
that delivers the list's mail into a public-inbox v2 archive with
`public-inbox-mda`, and `public-inbox-httpd` serving that archive, as lore
does. Mail to anyone else is kept in `others` (the series' author's copy).

`python listserver.py DIR` runs one by hand and prints its ports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiosmtpd.controller import Controller

LIST = "netdev@lists.phyfarm.test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Delivered:
    mail_from: str
    rcpt: list[str]
    data: bytes


@dataclass
class ListServer:
    root: Path
    smtp_port: int = 0
    http_port: int = 0
    others: list[Delivered] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PI_CONFIG": str(self.root / "pi-config"), "HOME": str(self.root)}

    @property
    def inbox_dir(self) -> Path:
        return self.root / "netdev"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/netdev"

    def start(self) -> ListServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.http_port = free_port()
        subprocess.run(
            ["public-inbox-init", "-V2", "netdev", str(self.inbox_dir), self.url, LIST],
            env=self.env, check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["git", "config", "-f", str(self.root / "pi-config"),
             "publicinboxmda.spamcheck", "none"],
            check=True,
        )  # fmt: skip
        self.httpd = subprocess.Popen(
            ["public-inbox-httpd", "-l", f"http://127.0.0.1:{self.http_port}"],
            env=self.env, stdout=open(self.root / "httpd.log", "wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.smtp_port = free_port()
        self.controller = Controller(Handler(self), hostname="127.0.0.1", port=self.smtp_port)
        self.controller.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.http_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return self

    def deliver_to_list(self, data: bytes) -> None:
        env = {**self.env, "ORIGINAL_RECIPIENT": LIST}
        p = subprocess.run(
            ["public-inbox-mda", "--no-precheck"], input=data, env=env, capture_output=True
        )
        if p.returncode != 0:
            self.refused.append(p.stderr.decode(errors="replace"))

    def archived(self) -> list[bytes]:
        """Every mail in the archive, oldest first (read from its git epochs)."""
        out = []
        for epoch in sorted((self.inbox_dir / "git").glob("*.git")):
            head = subprocess.run(
                ["git", f"--git-dir={epoch}", "rev-list", "--reverse", "HEAD"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            for c in head.stdout.split():
                blob = subprocess.run(
                    ["git", f"--git-dir={epoch}", "show", f"{c}:m"],
                    capture_output=True, check=False,
                )  # fmt: skip
                if blob.returncode == 0:
                    out.append(blob.stdout)
        return out

    def stop(self) -> None:
        self.controller.stop()
        self.httpd.terminate()
        self.httpd.wait(timeout=10)


class Handler:
    def __init__(self, server: ListServer) -> None:
        self.server = server

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        rcpts = [r.lower() for r in envelope.rcpt_tos]
        # As an MTA delivering to a pipe does: the wire's CRLF becomes LF.
        data = (envelope.original_content or envelope.content).replace(b"\r\n", b"\n")
        if LIST in rcpts:
            self.server.deliver_to_list(data)
        others = [r for r in rcpts if r != LIST]
        if others:
            self.server.others.append(Delivered(envelope.mail_from, others, data))
        return "250 OK"


if __name__ == "__main__":
    s = ListServer(Path(sys.argv[1])).start()
    print(f"smtp 127.0.0.1:{s.smtp_port}  archive {s.url}  list {LIST}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        s.stop()
