"""Unit tests of the farm guest's parts: QEMU command lines and the machine
phyfarm defines, the guest plan and a run's variants, the exporter, hang
evidence, the console log and the repro shell. No guest needed."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from phyfarm_farm.errors import HarnessError, SetupError
from phyfarm_farm.farm_env import validate_plan
from phyfarm_farm.guest import (
    GuestConfig,
    machine,
    machine_argv,
    machine_template,
    qemu_argv,
)


def test_qemu_reconnect_option_is_phyfarms():
    """The reconnecting chardev is spelled as phyfarm says for this QEMU
    (the version rule is tested in pipeline/src/guest/boot/tests.rs)."""
    from phyfarm_farm import guest

    d = guest.machine("tcg")
    assert d["chardev_reconnect"] in ("reconnect=1", "reconnect-ms=1000"), d
    assert guest.chardev_reconnect() == d["chardev_reconnect"]
    cfg = GuestConfig(kernel=Path("k"), initrd=Path("i"), accel="tcg", usb=("unix", "/s/u"))
    argv = qemu_argv(cfg, Path("/c"), Path("/a"))
    assert f"socket,id=ur0,path=/s/u,{d['chardev_reconnect']}" in argv


def test_the_farm_spells_its_devices_from_the_machines_templates(tmp_path):
    """Every device of a farm guest is one of the machine's named templates
    (guest::machine::device_templates), its slots filled once: a value is
    never read for slots itself, a missing one or an unknown name is a
    SetupError; a plan written before it carried devices gets today's."""
    from phyfarm_farm import guest

    d = guest.machine("tcg")
    cfg = GuestConfig(
        kernel=Path("k"),
        initrd=Path("i"),
        accel="tcg",
        usb=("tcp", "192.0.2.1", 4000),
        wire=(tmp_path / "{usb_path}", tmp_path / "r"),
    )
    argv = qemu_argv(cfg, tmp_path / "c", tmp_path / "agent.sock")
    tail = argv[len(machine_template("tcg")) :]
    expect = [
        *d["devices"]["agent"],
        *d["devices"]["xhci"],
        *d["devices"]["usb_redir_tcp"],
        *d["devices"]["partner_nic"],
    ]
    assert len(tail) == len(expect), tail
    assert f"socket,id=agent,path={tmp_path / 'agent.sock'},server=on,wait=off" in tail
    assert f"socket,id=ur0,host=192.0.2.1,port=4000,{d['chardev_reconnect']}" in tail
    nic = next(a for a in tail if a.startswith("dgram,"))
    assert f"local.path={tmp_path / '{usb_path}'}," in nic, nic
    with pytest.raises(SetupError, match="no devices named 'sound'"):
        guest.devices("tcg", "sound")
    with pytest.raises(SetupError, match="no value for {usb_path}"):
        guest.devices("tcg", "usb_redir_unix")
    # An older plan's machine, without devices: today's are asked for.
    kept = dict(d)
    try:
        guest.use_machine("tcg", {k: v for k, v in d.items() if k != "devices"})
        assert guest.devices("tcg", "xhci") == ["-device", "qemu-xhci,id=xhci"]
    finally:
        guest.use_machine("tcg", kept)


def test_qemu_usb_net_is_wired_back_to_back_with_the_partner_nic(tmp_path):
    cfg = GuestConfig(kernel=Path("bzImage"), initrd=Path("i"), accel="tcg", usb_net=True)
    argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
    joined = " ".join(argv)
    assert argv.count("qemu-xhci,id=xhci") == 1
    assert "usb-net,netdev=u0,bus=xhci.0" in argv and "virtio-net-pci,netdev=n0" in argv
    # One hub inside QEMU joins the two: no socket QEMU must reach as its user.
    assert "hubport,id=u0,hubid=0" in argv and "hubport,id=n0,hubid=0" in argv
    assert "dgram" not in joined and "usb-redir" not in joined
    from phyfarm_farm.guest import peer_sockets

    assert peer_sockets(cfg) == []


def test_the_farm_guest_is_the_machine_phyfarm_defines(tmp_path):
    """The machine comes from `phyfarm guest machine` (the one `phyfarm boot`
    runs); the harness only fills its slots, each once, never re-reading a
    value for slots."""
    tcg = machine_template("tcg")
    assert tcg[:3] == ("qemu-system-x86_64", "-accel", "tcg"), tcg
    for slot in ("{kernel}", "{initrd}", "{memory}", "{append}"):
        assert tcg.count(slot) == 1, (slot, tcg)
    assert "file,id=con,path={console}" in tcg
    assert machine_template("kvm")[:5] == ("qemu-system-x86_64", "-accel", "kvm", "-cpu", "host")
    append = "console=ttyS0 {console} {kernel}"
    argv = machine_argv(Path("/k/bzImage"), Path("/i.cpio"), "tcg", 384, append, tmp_path / "c")
    assert argv[argv.index("-kernel") + 1] == "/k/bzImage"
    assert argv[argv.index("-initrd") + 1] == "/i.cpio"
    assert argv[argv.index("-m") + 1] == "384"
    assert argv[argv.index("-append") + 1] == append
    assert f"file,id=con,path={tmp_path / 'c'}" in argv
    assert len(argv) == len(tcg)
    # The whole guest: the machine first, then the farm's devices.
    cfg = GuestConfig(kernel=Path("/k/bzImage"), initrd=Path("/i.cpio"), accel="tcg", memory_mb=384)
    full = qemu_argv(cfg, tmp_path / "c", tmp_path / "agent.sock")
    assert full[: tcg.index("-append")] == argv[: tcg.index("-append")]
    # Its kernel command line is phyfarm's for that accelerator (no TSC rate given).
    from phyfarm_farm import guest

    cmdline = full[full.index("-append") + 1]
    assert cmdline == guest.machine("tcg")["kernel_args"], cmdline
    assert "noapictimer" in cmdline.split() and "tsc_early_khz" not in cmdline


def test_the_guest_plan_resolves_image_accelerator_and_machine_once(tmp_path):
    """`phyfarm guest plan`, as the plugin's farm_env calls it: a requested
    accelerator is taken as is, a given image is kept, and the machine is the
    one of `phyfarm guest machine`. Bad input is exit 2 with the option named."""
    from phyfarm_farm.guest import phyfarm_binary

    image = tmp_path / "farm.cpio"
    image.write_bytes(b"070701")
    argv = [str(phyfarm_binary()), "guest", "plan", "--accel", "tcg", "--image", str(image)]
    p = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["guest_image"] == str(image)
    assert (plan["accel"], plan["accel_reason"]) == ("tcg", "requested")
    assert tuple(plan["machine"]["argv"]) == machine_template("tcg")
    assert (plan["kernels"], plan["variants"], plan["emulator"]) == ({}, [], None), (
        "nothing asked, nothing resolved"
    )
    art = tmp_path / "out"
    (art / "c").mkdir(parents=True)
    (art / "c" / "bzImage").write_bytes(b"k")
    p = subprocess.run(
        [*argv, "--artifacts", str(art), "--emulator", "/bin/true", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    plan2 = json.loads(p.stdout)
    assert plan2["kernels"] == {"c": str(art / "c" / "bzImage")}
    assert plan2["variants"] == ["c"]
    assert plan2["emulator"] == "/bin/true"
    # What the guests run, by content: `phyfarm repro` checks these.
    assert plan2["sha256"][str(art / "c" / "bzImage")] == hashlib.sha256(b"k").hexdigest()
    assert plan2["sha256"][str(image)] == hashlib.sha256(b"070701").hexdigest()
    assert (
        plan2["sha256"]["/bin/true"] == hashlib.sha256(Path("/bin/true").read_bytes()).hexdigest()
    )
    assert plan2["exporter_kernel"] is None, "no forwarded-gadget path asked for"
    p = subprocess.run(
        [*argv, "--exporter-kernel", str(art / "c" / "bzImage"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["exporter_kernel"] == str(art / "c" / "bzImage")
    # A forwarded adapter needs neither the emulator nor an exporter guest.
    p = subprocess.run(
        [*argv, "--device", "forwarded:127.0.0.1:4000", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    fwd = json.loads(p.stdout)
    assert (fwd["emulator"], fwd["exporter_kernel"]) == (None, None)
    assert plan["machine"]["confinement"] == list(
        machine_template("tcg")[-len(plan["machine"]["confinement"]) :]
    )
    for bad, says in (
        (["--accel", "auto", "--image", str(image)], "--accel auto needs --kernel"),
        (["--accel", "tcg", "--image", str(tmp_path / "none")], "--image"),
        (["--accel", "quick"], "--accel"),
        (
            ["--accel", "tcg", "--image", str(image), "--artifacts", str(tmp_path / "no")],
            "--artifacts",
        ),
        (
            ["--accel", "tcg", "--image", str(image), "--emulator", str(tmp_path / "no")],
            "--emulator",
        ),
        (["--kernel", str(image), "--artifacts", str(tmp_path)], "--artifacts"),
        (
            ["--accel", "tcg", "--image", str(image), "--exporter-kernel", str(tmp_path / "no")],
            "--exporter-kernel",
        ),
        (["--exporter-kernel", str(image), "--build-exporter-kernel"], "--exporter-kernel"),
        (["--accel", "tcg", "--image", str(image), "--device", "usb0"], "--device"),
    ):
        p = subprocess.run(
            [str(phyfarm_binary()), "guest", "plan", *bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2, (bad, p.stderr)
        assert says in p.stderr and "Traceback" not in p.stderr, (bad, p.stderr)
    # Every plan phyfarm printed above follows the schema the harness holds
    # it to; one it could not have written is refused, naming the field.
    for doc in (plan, plan2, fwd):
        assert validate_plan(doc, "plan") is doc
    forged = [
        ({**plan2, "accel": "auto"}, "at accel:"),
        ({**plan2, "extra_qemu_args": ["-s"]}, "at (document):"),
        ({**plan2, "machine": {**plan2["machine"], "argv": "qemu -s"}}, "at machine/argv:"),
        ({k: v for k, v in plan2.items() if k != "kernels"}, "'kernels' is a required"),
    ]
    for doc, says in forged:
        with pytest.raises(SetupError) as e:
            validate_plan(doc, "--guest-plan x.json")
        assert str(e.value).startswith("--guest-plan x.json: not a guest plan"), str(e.value)
        assert says in str(e.value), str(e.value)


def test_the_variants_of_a_run_are_phyfarms(tmp_path):
    """The plugin parametrizes its checks with what `phyfarm guest variants`
    says: a kernel's variant is the one --variant names, else its
    metadata.json's, else rust; --artifacts covers the variants it holds.
    Nothing is built; a folder with no kernel is exit 2, named."""
    from phyfarm_farm.guest import phyfarm_binary

    def variants(*args: str) -> list[str]:
        p = subprocess.run(
            [str(phyfarm_binary()), "guest", "variants", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert variants() == ["rust", "c"]
    assert variants("--variant", "c") == ["c"]
    art = tmp_path / "series"
    (art / "c").mkdir(parents=True)
    (art / "c" / "bzImage").write_bytes(b"k")
    assert variants("--artifacts", str(art)) == ["c"]
    (art / "rust").mkdir()
    (art / "rust" / "bzImage").write_bytes(b"k")
    assert variants("--artifacts", str(art)) == ["rust", "c"]
    assert variants("--artifacts", str(art), "--variant", "rust") == ["rust"]
    one = tmp_path / "one"
    one.mkdir()
    (one / "bzImage").write_bytes(b"k")
    assert variants("--kernel", str(one / "bzImage")) == ["rust"]
    (one / "metadata.json").write_text('{"variant": "c"}')
    assert variants("--kernel", str(one / "bzImage")) == ["c"]
    assert variants("--artifacts", str(one)) == ["c"]
    assert variants("--kernel", str(one / "bzImage"), "--variant", "rust") == ["rust"]
    p = subprocess.run(
        [str(phyfarm_binary()), "guest", "variants", "--artifacts", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--artifacts" in p.stderr and "Traceback" not in p.stderr


def test_tcg_guests_can_be_told_their_tsc_rate(tmp_path):
    def append(**kw) -> str:
        cfg = GuestConfig(kernel=Path("bzImage"), initrd=Path("i"), **kw)
        argv = qemu_argv(cfg, tmp_path / "console.log", tmp_path / "agent.sock")
        return argv[argv.index("-append") + 1]

    assert append(accel="tcg", tsc_khz=2596126).endswith(" tsc_early_khz=2596126")
    assert "tsc_early_khz" not in append(accel="kvm", tsc_khz=2596126)
    assert "tsc_early_khz" not in append(accel="tcg")


def test_the_exporter_names_the_side_that_failed(tmp_path):
    from phyfarm_farm.exporter import Exporter, ExporterFailed

    assert issubclass(ExporterFailed, HarnessError)
    e = Exporter(Path("bzImage"), Path("farm.cpio"), "tcg", tmp_path, tmp_path / "usb.sock")
    argv = " ".join(e.argv)
    # The kernel command line every phyfarm guest has (`phyfarm guest
    # machine`), then the exporter's role.
    append = e.argv[e.argv.index("-append") + 1]
    assert append == f"{machine('tcg')['kernel_args']} phyfarm.role=exporter", append
    assert "oops=panic" in append
    # The model's stream and usbredirect's reach the host on virtio-serial
    # ports: no network in the exporter.
    assert f"socket,id=model,path={tmp_path / 'usb.sock'}," in argv
    assert "virtserialport,chardev=model,name=org.phyfarm.model" in argv
    assert f"socket,id=redir,path={e.usb_sock},server=on,wait=off" in argv
    assert "virtserialport,chardev=redir,name=org.phyfarm.usbredir" in argv
    assert "-netdev" not in e.argv
    assert e.failure() is None
    cases = [
        (
            "ax88772-gadget: E: cannot connect to the model at 10.0.2.2:1: refused\n",
            "ax88772-gadget failed",
        ),
        (
            "phyfarm-exporter: ready\nphyfarm-exporter: usbredirect exited with 1\n",
            "usbredirect exited",
        ),
        (
            "phyfarm-exporter: failed: the gadget was not enumerated within 60 s\n",
            "failed to set up",
        ),
    ]
    for text, what in cases:
        e.console.write_text("[    0.1] boot\n" + text)
        why = e.failure()
        assert why is not None and why.startswith("exporter: ") and what in why, why
        assert str(e.console) in why
    e.console.write_text("phyfarm-exporter: ready\nax88772-gadget: I: gadget bound\n")
    assert e.failure() is None


SYSRQ_W = """\
[   42.123456] sysrq: Show Blocked State
[   42.123500] task:ethtool         state:D stack:0     pid:90    tgid:90    ppid:1
[   42.123510] Call Trace:
[   42.123520]  <TASK>
[   42.123530]  __schedule+0x2b0/0x6d0
[   42.123540]  __mutex_lock.constprop.0+0x2f1/0x6a0
[   42.123550]  phy_ethtool_get_link_ksettings+0x20/0x80
[   42.123560]  </TASK>
[   42.123600] task:kworker/0:2     state:D stack:0     pid:25    tgid:25    ppid:2
[   42.123610] Workqueue: events_power_efficient phy_state_machine
[   42.123620] Call Trace:
[   42.123630]  <TASK>
[   42.123800]  __schedule+0x2b0/0x6d0
[   42.124100]  usb_start_wait_urb+0x83/0x150
[   42.124300]  asix_read_cmd+0x4d/0x90
[   42.124400]  asix_mdio_read+0x6b/0xf0
[   42.124600]  mdiobus_read+0x30/0x50
{rust_frame}+0x55/0x160
[   42.124900]  phy_state_machine+0x5b/0x2b0
[   42.125000]  </TASK>
""".format(
    # As a real 6.12 guest printed it (the selftest case read-status-hangs).
    rust_frame="[   42.124700]  _RNvXCs2EhZZi11KpL_13ax88796b_rustNtB2_11PhyAX88772A"
    "NtNtNtCsb5MLIFMWygY_6kernel3net3phy6Driver11read_status"
)


def test_a_hangs_evidence_names_the_driver_frame_a_blocked_task_waits_in():
    from phyfarm_farm.guest import blocked_frame

    got = blocked_frame(SYSRQ_W)
    want = "<ax88796b_rust::PhyAX88772A as kernel::net::phy::Driver>::read_status"
    assert got == f"kworker/0:2 in {want}", got
    # Without a driver frame, phylib's own is the next best; without
    # any task line, nothing is named.
    phylib_only = SYSRQ_W.split("[   42.123600]")[0]
    assert blocked_frame(phylib_only) == "ethtool in phy_ethtool_get_link_ksettings"
    assert blocked_frame("[ 1.0] nothing blocked\n") is None


def test_after_a_hang_the_variants_other_checks_give_each_command_the_cap(tmp_path):
    from phyfarm_farm.guest import HUNG_CAP, Guest, GuestConfig
    from phyfarm_farm.plugin import _mark_hung

    cfg = GuestConfig(kernel=tmp_path / "k", initrd=tmp_path / "i", accel="tcg", timeout=40)
    g = Guest(cfg, tmp_path / "s", tmp_path / "logs")
    assert g.limit(None) == 40 and g.limit(5) == 5 and g.limit(100) == 40
    g.command_cap = (HUNG_CAP, "capped: x hung earlier")
    assert g.limit(None) == HUNG_CAP and g.limit(5) == 5
    # The first hang of a run is the one remembered.
    marker = tmp_path / "hung-rust"
    _mark_hung(marker, "test_link_flap[rust-plain]", "blocked in kworker/0:2 in read_status")
    _mark_hung(marker, "test_probe[rust]", "later")
    assert marker.read_text().splitlines()[0] == "test_link_flap[rust-plain]"


def test_a_soft_lockup_names_the_function_the_cpu_is_stuck_in():
    """A driver that spins with the PHY lock held stops the guest's only CPU:
    no agent answers, and the kernel's soft-lockup report (a real one, from
    the selftest case read-status-spins) is the evidence. Its RIP line is
    where the CPU is, so it names the driver's function, not a caller."""
    from phyfarm_farm.guest import find_splats, hang_evidence

    text = (Path(__file__).parent / "fixtures/soft-lockup.console").read_text()
    want = "kworker/0:2:21 in <ax88796b_rust::PhyAX88772A as kernel::net::phy::Driver>::read_status"
    (s,) = find_splats("[   27.0] before\n" + text)
    assert s.what == f"reported a soft lockup ({want})", s.what
    assert "Call Trace:" in s.excerpt
    # Without an agent, the console's report stands in for sysrq's.
    ev = hang_evidence(None, "[   27.0] before\n" + text)
    assert ev.startswith(f"blocked in {want}\n"), ev[:300]
    assert hang_evidence(None, "[ 1.0] quiet\n") == "no blocked-task report: no agent"


def test_a_flooded_console_keeps_its_head_and_tail_and_says_what_it_left_out(tmp_path, monkeypatch):
    """A guest printing far more than the log keeps: the log holds the first
    HEAD_BYTES and the last TAIL_BYTES with a line between them saying how
    much was left out, on disk and as the harness reads it, and what a
    writer put in the FIFO after the reader started is all accounted for."""
    from phyfarm_farm import console as con

    monkeypatch.setattr(con, "HEAD_BYTES", 4096)
    monkeypatch.setattr(con, "TAIL_BYTES", 1024)
    c = con.Console(tmp_path / "logs" / "console.log", tmp_path / "console.fifo")
    c.start()
    lines = [f"[{i:8d}] line {i}\n".encode() for i in range(20000)]
    flood = b"".join(lines)
    # The writer is another process, as QEMU is: it opens the FIFO by name.
    subprocess.run(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"]
        + [str(c.fifo)],
        input=flood,
        check=True,
    )
    # The writer is gone; what it left in the FIFO is read by the thread.
    deadline = time.monotonic() + 10
    while c.total < len(flood) and time.monotonic() < deadline:
        time.sleep(0.01)
    live = c.text()
    c.stop()
    on_disk = c.path.read_bytes()
    assert c.total == len(flood)
    assert on_disk.startswith(flood[:4096]) and on_disk.endswith(flood[-1024:])
    dropped = len(flood) - 4096 - 1024
    note = f"{len(flood)} bytes on its console; {dropped} bytes after the first 4096 were not kept"
    assert note in on_disk.decode(), on_disk[4096:4400]
    assert len(on_disk) < 4096 + 1024 + 200
    assert c.text() == on_disk.decode(errors="replace")
    # Read while the guest runs, the console is the same bounded text.
    assert live == on_disk.decode(errors="replace")
    assert not c.fifo.exists(), "the FIFO outlived the guest"


def test_a_quiet_console_is_kept_whole(tmp_path):
    from phyfarm_farm.console import Console

    c = Console(tmp_path / "console.log", tmp_path / "console.fifo")
    c.start()
    with open(c.fifo, "wb") as w:
        w.write(b"[    0.000000] Linux version 6.12\n")
    c.stop()
    c.stop()  # twice: nothing more happens
    assert c.path.read_text() == "[    0.000000] Linux version 6.12\n"


class _Cmd:
    def __init__(self, stdout="", stderr="", exit=0, timed_out=False):
        self.stdout, self.stderr, self.exit, self.timed_out = stdout, stderr, exit, timed_out


class _Guest:
    console = Path("/logs/console.log")

    def __init__(self):
        self.ran = []

    def sh(self, line, timeout=None):
        self.ran.append((line, timeout))
        if line == "hang":
            return _Cmd(timed_out=True, exit=-1)
        if line == "gone":
            raise HarnessError("no reply to `sh`: agent connection closed")
        return _Cmd(stdout="eth1 \x1b[31mUP\n", exit=0 if line != "false" else 1)

    def console_text(self):
        return "\n".join(f"line {i}" for i in range(100))


class _Emu:
    def __init__(self):
        self.links = []

    def link(self, up):
        self.links.append(up)

    def phy(self):
        return {"phy": {"link": False}}

    def counters(self):
        return {"rx_frames": 3}


def test_the_repro_shell_runs_lines_in_the_guest_and_colon_commands_on_the_emulator():
    """`phyfarm repro --shell`: a line runs in the guest, `:` commands go to
    the emulator, guest output is shown without its control characters, a
    command that hangs or a guest that went away is said, not raised."""
    from phyfarm_farm import shell

    class F:
        variant, accel, dut, partner = "rust", "tcg", "eth1", "eth0"
        guest, emu = _Guest(), _Emu()

    f = F()
    inp = io.StringIO(
        "ip link\n\n:link down\n:link sideways\nfalse\nhang\ngone\n"
        ":console 2\n:counters\n:quit\nnever\n"
    )
    out = io.StringIO()
    assert shell.repl(f, inp, out, timeout=5) == 8
    text = out.getvalue()
    assert text.startswith("phyfarm shell: rust kernel, accelerator tcg; adapter eth1"), text
    assert "eth1 ?[31mUP\n" in text and "\x1b" not in text
    assert f.emu.links == [False] and "link down\n" in text
    assert "unknown command ':link sideways'" in text
    assert "[exit 1]" in text and "[timed out after 5s]" in text
    assert "error: no reply to `sh`: agent connection closed" in text
    assert "line 98\nline 99\n" in text and '"rx_frames": 3' in text
    assert [line for line, _ in f.guest.ran] == ["ip link", "false", "hang", "gone"], (
        "never after :quit"
    )
    assert shell.repl(f, io.StringIO(""), io.StringIO()) == 0, "end of input leaves"
