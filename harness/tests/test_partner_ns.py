"""The host-side link partner's namespace without privilege: a user that is
not root gets a network namespace inside a user namespace of its own
(`unshare -Urn`), with the emulator's tap and the partner's address in it,
gone with the check. No guest needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from phyfarm_farm import partner
from phyfarm_farm.errors import SetupError

HARNESS = Path(__file__).resolve().parents[1]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

#: Run as nobody: make the partner, look inside, tear it down.
SCRIPT = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from phyfarm_farm.partner import PARTNER_IP, TAP, HostPartner, host_partner_unavailable
why = host_partner_unavailable()
p = HostPartner(Path(sys.argv[2]))
p.create()
p.configure()
inside = p.run(["ip", "-br", "addr", "show", "dev", TAP])
ping = p.run(["ping", "-c", "1", "-W", "2", PARTNER_IP])
pid = p.holder.pid
net = os.readlink(f"/proc/{pid}/ns/net")
p.destroy()
print(json.dumps({"uid": os.getuid(), "why": why, "method": p.method, "ns": p.ns,
                  "pid": pid, "net": net, "inside": inside.stdout, "ping": ping.exit,
                  "gone": not os.path.exists(f"/proc/{pid}")}))
"""


@pytest.fixture
def public_dir():
    """A folder nobody can read and write (pytest's tmp_path is root's)."""
    d = Path(tempfile.mkdtemp(prefix="phyfarm-partner-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_user_that_is_not_root_gets_a_host_partner(public_dir):
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun")
    probe = subprocess.run([*NOBODY, "unshare", "-Urn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.strip()}")
    shutil.copytree(HARNESS / "phyfarm_farm", public_dir / "phyfarm_farm")
    logs = public_dir / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k != "PHYFARM_PARTNER_NS"}
    r = subprocess.run(
        [*NOBODY, "/usr/bin/python3", "-c", SCRIPT, str(public_dir), str(logs)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=public_dir,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["uid"], got["why"], got["method"]) == (65534, None, "user"), got
    assert got["ns"] == f"user:{got['pid']}", got
    assert got["net"] != os.readlink("/proc/self/ns/net")
    assert partner.TAP in got["inside"] and f"{partner.PARTNER_IP}/24" in got["inside"], got
    assert got["ping"] == 0, got
    assert got["gone"], "the namespace's holder outlived the partner"
    # Nothing of it on the host: no tap, no named namespace.
    host = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert partner.TAP not in host.split(), host


def test_the_namespace_method_is_chosen_by_user_or_by_name(monkeypatch):
    monkeypatch.delenv("PHYFARM_PARTNER_NS", raising=False)
    assert partner.namespace_method() == ("netns" if os.geteuid() == 0 else "user")
    monkeypatch.setenv("PHYFARM_PARTNER_NS", "user")
    assert partner.namespace_method() == "user"
    monkeypatch.setenv("PHYFARM_PARTNER_NS", "bridge")
    with pytest.raises(SetupError, match="PHYFARM_PARTNER_NS='bridge': expected netns or user"):
        partner.namespace_method()


def test_the_partners_commands_enter_its_namespace_by_method(tmp_path):
    named = partner.HostPartner(tmp_path, method="netns")
    assert named.wrap(["iperf3", "-s"])[:4] == [partner.IP, "netns", "exec", named.ns]
    user = partner.HostPartner(tmp_path, method="user")
    with pytest.raises(AssertionError, match="not made yet"):
        user.wrap(["true"])
