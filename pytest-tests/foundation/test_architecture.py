"""ARCHITECTURE.md stays true: every path it names in backquotes exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import REPO

DOC = REPO / "ARCHITECTURE.md"


def named_paths() -> list[str]:
    text = DOC.read_text()
    found = re.findall(r"`([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]*)+)`", text)
    # The flow picture names source files plainly; check those too.
    found += re.findall(
        r"\b((?:pipeline|qemu-farm|pytest-tests|harness|dashboards|bench)/[A-Za-z0-9_./\-]+)", text
    )
    return sorted({p.rstrip("/.,") for p in found if not p.startswith("<")})


def test_every_path_the_map_names_exists():
    paths = named_paths()
    assert len(paths) >= 20, paths
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_the_map_names_every_top_level_folder():
    text = DOC.read_text()
    top = sorted(
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != "target"
    )
    missing = [d for d in top if f"`{d}/`" not in text]
    assert not missing, f"top-level folders the map does not describe: {missing}"


def test_the_store_never_imports_the_verdict():
    """The store records review states from the results model; the verdict
    reads the store. An import the other way would make them one knot."""
    offenders = [
        f"{p.relative_to(REPO)}:{n}"
        for p in sorted((REPO / "pipeline/src/store").rglob("*.rs"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bcrate::verdict\b|\bsuper::verdict\b", line)
    ]
    assert not offenders, offenders


def test_a_long_file_says_why_at_its_top():
    """pipeline/src keeps files short; a file over 500 lines states why in
    its module comment (the tests of a module live beside it, in tests.rs or
    <topic>_tests.rs)."""
    unexplained = []
    for p in sorted((REPO / "pipeline/src").rglob("*.rs")):
        lines = p.read_text().splitlines()
        if len(lines) <= 500 or p.name == "tests.rs" or p.name.endswith("_tests.rs"):
            continue
        head = "\n".join(lines[:30])
        if "One file over 500 lines:" not in head:
            unexplained.append(f"{p.relative_to(REPO)} ({len(lines)} lines)")
    assert not unexplained, unexplained


#: The stages, in the order a revision meets them, and the leaves every
#: stage may use. A stage never imports the orchestrator (`run`) or the
#: verbs (`cli`); the results model imports no stage at all.
STAGES = ("ingest", "kbuild", "guest", "farm", "results", "store", "verdict", "export")
LEAVES = ("config", "progress", "sandbox", "jsonfile", "run_folder", "results")


def rust_imports(folder: str) -> list[tuple[str, str]]:
    """(file:line, module) for every `crate::<module>` a stage's code names
    (outside its tests)."""
    out = []
    base = REPO / "pipeline/src"
    files = sorted((base / folder).rglob("*.rs"))
    if (base / f"{folder}.rs").exists():
        files.append(base / f"{folder}.rs")
    for p in files:
        if p.name in ("tests.rs",) or p.name.endswith("_tests.rs") or "tests" in p.parts:
            continue
        text = p.read_text().split("#[cfg(test)]")[0]
        for n, line in enumerate(text.splitlines(), 1):
            for m in re.finditer(r"\bcrate::([a-z_]+)", line):
                out.append((f"{p.relative_to(REPO)}:{n}", m.group(1)))
    return out


def test_no_stage_imports_the_orchestrator_or_the_verbs():
    offenders = [
        f"{where} imports crate::{m}"
        for stage in STAGES
        for where, m in rust_imports(stage)
        if m in ("run", "cli")
    ]
    assert not offenders, offenders


def test_the_results_model_and_the_leaves_import_no_stage():
    offenders = [
        f"{where} imports crate::{m}"
        for leaf in ("results", "jsonfile", "run_folder")
        for where, m in rust_imports(leaf)
        if m in STAGES and m != "results" or m in ("run", "cli")
    ]
    assert not offenders, offenders


LONG_FUNCTION_LINES = 120
FN = re.compile(
    r'\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern "C"\s+)?fn\s+(\w+)'
)


def code_of(line: str) -> str:
    """A line without its strings, character literals and comment, so that
    only the braces of code are counted."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def long_functions(path) -> list[tuple[int, str, int, bool]]:
    """(line, name, length, says why) of each function over the limit: the
    reason is a `// Long: …` comment in the lines just above it (among its
    doc comment and attributes)."""
    lines = path.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            code = code_of(lines[j])
            for ch in code:
                if ch == "{":
                    depth, started = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0 or not started and code.rstrip().endswith(";"):
                break
            j += 1
        length = j - i + 1
        if not started or length <= LONG_FUNCTION_LINES:
            continue
        k, why = i - 1, False
        while k >= 0 and re.match(r"\s*(//|#\[)", lines[k]):
            why = why or lines[k].strip().startswith("// Long: ")
            k -= 1
        found.append((i + 1, m.group(7), length, why))
    return found


def test_a_long_function_says_why():
    """No Rust function over 120 lines without a one-line reason above it
    (`// Long: …`): a match with one arm per command or message, a template,
    or the steps not yet split, said as such."""
    roots = [REPO / "pipeline/src", REPO / "qemu-farm", REPO / "dashboards/src"]
    unexplained, seen = [], 0
    for root in roots:
        for p in sorted(root.rglob("*.rs")):
            if "target" in p.parts:
                continue
            for line, name, length, why in long_functions(p):
                seen += 1
                if not why:
                    unexplained.append(f"{p.relative_to(REPO)}:{line}: fn {name}, {length} lines")
    assert seen > 0, "the scan found no long function at all: is it still reading the sources?"
    assert not unexplained, "functions over 120 lines without a `// Long:` reason:\n" + "\n".join(
        unexplained
    )


#: The source files the size rule covers, by ending or name (issue #34).
SOURCE_ENDINGS = (".rs", ".py", ".sh", ".toml", ".yml", ".js", ".css", ".html", ".sql")
MAX_FILE_LINES = 800


def test_no_source_file_is_over_800_lines():
    """A source file that grows past 800 lines is split by concern (test
    data under a `fixtures/` folder and Cargo.lock are not source)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    paths = [
        p
        for p in listed.split("\0")
        if (p.endswith(SOURCE_ENDINGS) or Path(p).name == "Makefile")
        and Path(p).name != "Cargo.lock"
        and "/fixtures/" not in f"/{p}"
    ]
    assert len(paths) > 100, f"git ls-files listed only {len(paths)} source files"
    over = []
    for p in paths:
        f = REPO / p
        if not f.is_file():
            continue
        n = len(f.read_bytes().splitlines())
        if n > MAX_FILE_LINES:
            over.append(f"{p} ({n} lines)")
    assert not over, f"source files over {MAX_FILE_LINES} lines:\n" + "\n".join(over)


def test_the_readme_names_every_planned_check(phyfarm):
    """The registry (`phyfarm farm plan`) is the only list of checks; the
    README's "Verdicts" section names each family of it, so a check added to
    the registry without a word for its readers fails here."""
    r = phyfarm("farm", "plan", "--variants", "rust")
    assert r.code == 0, r.describe()
    families = {
        line.split()[0].split("[")[0]
        for line in r.stdout.splitlines()
        if line.startswith("farm.") and not line.startswith("farm.differential.")
    }
    assert len(families) >= 9, families
    text = (REPO / "README.md").read_text()
    verdicts = text[text.index("## Verdicts") :]
    unnamed = sorted(f for f in families if f"`{f}" not in verdicts)
    assert not unnamed, f"README.md's Verdicts section does not name {unnamed}"


#: The modules that run podman: the sandbox (its probe, every sandboxed
#: argv, and the read-only copy-out `sandbox::runtime::copy_out`), image
#: builds, the build steps' runner `kbuild::steps::Run` (stopping a step's
#: container) and doctor's probe of the installed version. Everything else
#: runs a container through them.
PODMAN_OWNERS = (
    "pipeline/src/sandbox/",
    "pipeline/src/kbuild/images.rs",
    "pipeline/src/kbuild/steps.rs",
    "pipeline/src/cli/doctor.rs",
)

#: The literal "podman" as the program of a command: the first word of an
#: argv literal (`["podman", …]`, `vec!["podman".into(), …]`), a `Command`'s
#: program or argument, a constant naming it, or made into a `String` (an
#: argv built word by word).
PODMAN_AS_PROGRAM = re.compile(
    r'\[\s*"podman"'
    r'|(?:Command::new|\.arg)\(\s*"podman"\s*\)'
    r'|\b(?:const|static)\s+\w+\s*:\s*&(?:\'static\s+)?str\s*=\s*"podman"'
    r'|"podman"\.(?:into|to_string|to_owned)\(\)|String::from\("podman"\)'
)
#: ...except as a struct field's value, which names the runtime
#: (build/metadata.rs: `runtime: "podman".into()`), as a label does.
FIELD_VALUE = re.compile(r"\b\w+\s*:\s*$")


def podman_programs(path: Path) -> list[int]:
    """The lines of `path` that spell "podman" as a program to run (line
    comments left out)."""
    text = "\n".join(
        "" if line.lstrip().startswith("//") else line for line in path.read_text().splitlines()
    )
    lines = set()
    for m in PODMAN_AS_PROGRAM.finditer(text):
        at = text.index('"podman"', m.start())
        if FIELD_VALUE.search(text[text.rfind("\n", 0, at) + 1 : at]):
            continue
        lines.add(text.count("\n", 0, at) + 1)
    return sorted(lines)


def test_only_the_sandbox_and_its_owners_run_podman():
    """A container is started only by the modules that own podman (the
    sandbox, image builds, `kbuild::steps::Run`, doctor's version probe), so every
    other step gets the sandbox's hardening by calling them instead of
    spelling a `podman run` of its own."""
    base = REPO / "pipeline/src"
    found = {str(p.relative_to(REPO)): podman_programs(p) for p in sorted(base.rglob("*.rs"))}
    found = {p: lines for p, lines in found.items() if lines}
    owned = [p for p in found if p.startswith(PODMAN_OWNERS)]
    for owner in PODMAN_OWNERS:
        assert any(p.startswith(owner) for p in owned), (
            f"{owner} no longer runs podman: take it off the owners"
        )
    offenders = [
        f"{p}:{n}" for p, lines in found.items() if not p.startswith(PODMAN_OWNERS) for n in lines
    ]
    assert not offenders, (
        "podman run outside the sandbox and its owners (use "
        "sandbox::runtime::copy_out or kbuild::steps::Run):\n" + "\n".join(offenders)
    )


#: QEMU's machine-wide options: the accelerator, the machine, its memory
#: and CPUs, firmware, kernel, initrd, command line and confinement.
QEMU_MACHINE_OPTIONS = {
    "-accel", "-enable-kvm", "-cpu", "-M", "-machine", "-smp", "-bios", "-kernel",
    "-initrd", "-append", "-nodefaults", "-no-user-config", "-no-reboot", "-display",
    "-serial", "-sandbox", "-runas", "-run-with",
}  # fmt: skip
#: Where each is born: the machine every guest is, in the guest plan.
QEMU_MACHINE_HOMES = {"pipeline/src/guest/machine.rs", "pipeline/src/guest/accel.rs"}
#: Devices (-device, -chardev, -netdev): the farm guest's and the exporter
#: guest's are templates of the machine (guest/machine.rs, handed to the
#: harness in the guest plan), the boot check's in guest/boot.rs; doctor
#: asks QEMU which devices it has (`-device help`).
QEMU_DEVICE_OPTIONS = {"-device", "-chardev", "-netdev"}
QEMU_DEVICE_HOMES = {
    "pipeline/src/guest/boot.rs",
    "pipeline/src/guest/machine.rs",
    "pipeline/src/cli/doctor.rs",
}


def qemu_option_literals() -> dict[str, set[str]]:
    """The QEMU options each product source spells as a string literal
    (outside tests): Rust under pipeline/src, Python of the harness."""
    found: dict[str, set[str]] = {}
    wanted = QEMU_MACHINE_OPTIONS | QEMU_DEVICE_OPTIONS
    files = [p for p in (REPO / "pipeline/src").rglob("*.rs") if "tests" not in p.parts]
    files += sorted((REPO / "harness/phyfarm_farm").glob("*.py"))
    for p in files:
        if p.name == "tests.rs" or p.name.endswith("_tests.rs"):
            continue
        text = p.read_text().split("#[cfg(test)]")[0] if p.suffix == ".rs" else p.read_text()
        lits = set(re.findall(r'"(-[a-z][a-z-]*|-M)"', text)) & wanted
        if lits:
            found[str(p.relative_to(REPO))] = lits
    return found


def test_the_guest_plan_owns_the_machine_and_each_role_its_devices():
    """QEMU's machine options are born in one place (guest/machine.rs and
    the accelerator's guest/accel.rs), and so are the farm's and the
    exporter's devices; they reach the harness in the guest plan, which
    fills their slots and spells no QEMU option itself."""
    found = qemu_option_literals()
    machine_where = {f for f, lits in found.items() if lits & QEMU_MACHINE_OPTIONS}
    device_where = {f for f, lits in found.items() if lits & QEMU_DEVICE_OPTIONS}
    assert machine_where == QEMU_MACHINE_HOMES, {
        f: sorted(found[f] & QEMU_MACHINE_OPTIONS) for f in machine_where ^ QEMU_MACHINE_HOMES
    }
    assert device_where <= QEMU_DEVICE_HOMES, {
        f: sorted(found[f]) for f in device_where - QEMU_DEVICE_HOMES
    }
    assert "-append" in found["pipeline/src/guest/machine.rs"], found
    assert "-device" in found["pipeline/src/guest/machine.rs"], found
    assert not [f for f in found if f.startswith("harness/")], found


def module_graph(src: Path) -> dict[str, set[str]]:
    """Which top-level module of a crate's `src` each one's code (outside
    its tests) names with `crate::<module>`."""
    mods = {p.stem for p in src.iterdir() if p.suffix == ".rs" or p.is_dir()}
    mods -= {"lib", "main", "bin"}
    graph: dict[str, set[str]] = {}
    for m in sorted(mods):
        files = sorted((src / m).rglob("*.rs")) if (src / m).is_dir() else []
        files += [src / f"{m}.rs"] if (src / f"{m}.rs").exists() else []
        names: set[str] = set()
        for p in files:
            if p.name == "tests.rs" or p.name.endswith("_tests.rs") or "tests" in p.parts:
                continue
            code = p.read_text().split("#[cfg(test)]")[0]
            names |= set(re.findall(r"\bcrate::([a-z_0-9]+)", code))
        graph[m] = {x for x in names if x in mods and x != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in graph[a])

    return sorted(f"{a} -> {b} -> … -> {a}" for a in graph for b in graph[a] if reaches(b, a, {b}))


def test_the_modules_import_one_another_without_a_cycle():
    """The arrows between a crate's modules run one way: no module reaches
    itself through the ones it imports (pipeline's guest once named a
    constant of farm while farm used guest's plan; the device model's
    settings, MII register map and tap wire sat on the far side of the
    modules that use them)."""
    pipeline = module_graph(REPO / "pipeline/src")
    assert "farm" in pipeline["run"] and "guest" in pipeline["farm"], pipeline
    model = module_graph(REPO / "qemu-farm/ax88772/src")
    assert "nic" in model["device"] and "mii" in model["link"], model
    found = [f"pipeline: {c}" for c in cycles(pipeline)]
    found += [f"ax88772: {c}" for c in cycles(model)]
    assert not found, found
