"""A check id is born in one place: the registry (`FARM_CHECKS` and
`KUNIT_CHECK` in `pipeline/src/farm/contract.rs`, listed by `phyfarm farm
plan`) and the farm test that declares it (`@pytest.mark.check`). The
product's other code, its workflows and its scripts take ids from the plan
and never spell one as a value: a copied list is how the CI matrix once
drifted from `record`'s plan."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

REGISTRY = REPO / "pipeline/src/farm/contract.rs"

#: The product's code outside the registry and the farm tests. Tests and
#: benchmarks name the checks they exercise, and may.
RUST_ROOTS = ("pipeline/src", "dashboards/src")
PYTHON_ROOTS = ("harness/phyfarm_farm", "mailing/phyfarm_mail")
TEXT_FILES = ("Makefile", ".github/workflows/*.yml", "containers/**/*.sh", ".ci/*")


def families(phyfarm) -> set[str]:
    r = phyfarm("farm", "plan", "--variants", "rust", "--kunit")
    assert r.code == 0, r.describe()
    found = {
        line.split()[0].split("[")[0]
        for line in r.stdout.splitlines()
        if line.startswith("farm.") and not line.startswith("farm.differential.")
    }
    assert {"farm.probe", "farm.kunit", "farm.link_flap"} <= found, found
    return found


def id_pattern(fams: set[str]) -> re.Pattern[str]:
    """A family as a check id: alone, or with its parameters; not as the
    prefix of a measurement or KUnit case (`farm.throughput.tcp_tx`)."""
    alt = "|".join(re.escape(f) for f in sorted(fams, key=len, reverse=True))
    return re.compile(rf"(?<![\w.])({alt})(?![\w.])")


def rust_test_files(root: Path) -> set[Path]:
    """Files that are test modules: `tests.rs`, `*_tests.rs`, a `tests/`
    folder, and what a `#[cfg(test)] mod NAME;` declares."""
    out = set()
    for p in root.rglob("*.rs"):
        text = p.read_text()
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+);", text):
            folder = p.parent if p.name in ("mod.rs", "lib.rs", "main.rs") else p.with_suffix("")
            out.add(folder / f"{m.group(1)}.rs")
            out.update((folder / m.group(1)).rglob("*.rs"))
    return out


def rust_code(text: str) -> list[tuple[int, str]]:
    """The code of a Rust file without its comments and its inline
    `#[cfg(test)] mod … { … }` blocks."""
    lines, out, skip_depth = text.splitlines(), [], None
    i = 0
    while i < len(lines):
        line = lines[i]
        if skip_depth is None and line.strip() == "#[cfg(test)]":
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if re.match(r"\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", nxt):
                skip_depth, i = 0, i + 1
                continue
        if skip_depth is not None:
            skip_depth += line.count("{") - line.count("}")
            if skip_depth <= 0 and "}" in line:
                skip_depth = None
            i += 1
            continue
        if not line.lstrip().startswith("//"):
            out.append((i + 1, line))
        i += 1
    return out


def rust_offenders(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for root in RUST_ROOTS:
        base = REPO / root
        tests = rust_test_files(base)
        for p in sorted(base.rglob("*.rs")):
            if p == REGISTRY or p in tests or "tests" in p.parts or p.name.endswith("tests.rs"):
                continue
            for n, line in rust_code(p.read_text()):
                for lit in re.findall(r'"((?:\\.|[^"\\])*)"', line):
                    if pattern.search(lit):
                        found.append(f"{p.relative_to(REPO)}:{n}: {lit!r}")
    return found


def python_offenders(pattern: re.Pattern[str]) -> list[str]:
    """String constants of the code, not its docstrings."""
    found = []
    for root in PYTHON_ROOTS:
        for p in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(p.read_text())
            docs = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(
                    node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                )
                and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docs
                    and pattern.search(node.value)
                ):
                    found.append(f"{p.relative_to(REPO)}:{node.lineno}: {node.value[:80]!r}")
    return found


def text_offenders(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for glob in TEXT_FILES:
        for p in sorted(REPO.glob(glob)):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if line.lstrip().startswith("#"):
                    continue
                if pattern.search(line):
                    found.append(f"{p.relative_to(REPO)}:{n}: {line.strip()[:80]}")
    return found


def test_no_check_id_is_spelled_outside_the_registry(phyfarm):
    pattern = id_pattern(families(phyfarm))
    offenders = rust_offenders(pattern) + python_offenders(pattern) + text_offenders(pattern)
    assert not offenders, (
        "check ids spelled outside pipeline/src/farm/contract.rs (take them from "
        "the plan, `phyfarm farm plan`):\n" + "\n".join(offenders)
    )


def test_the_scan_sees_an_id_where_one_is_spelled(phyfarm):
    """The rule can fail: the registry's own file and a farm test spell ids,
    and a measurement's name does not count as one."""
    pattern = id_pattern(families(phyfarm))
    registry = [
        lit
        for _, line in rust_code(REGISTRY.read_text())
        for lit in re.findall(r'"((?:\\.|[^"\\])*)"', line)
        if pattern.search(lit)
    ]
    assert "farm.link_flap[plain]" in registry and "farm.kunit" in registry, registry
    assert pattern.search('check("farm.probe")')
    assert not pattern.search("farm.throughput.tcp_tx")
    assert not pattern.search("phyfarm.probe")
    code = rust_code('let a = "farm.dmesg";\n#[cfg(test)]\nmod tests {\n    "farm.dmesg"\n}\n')
    assert [n for n, _ in code] == [1], code
