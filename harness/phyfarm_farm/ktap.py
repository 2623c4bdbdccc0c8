"""A KTAP (kernel test anything protocol) parser: one result per case."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RESULT = re.compile(r"^(ok|not ok) (\d+)(?: -)? ?([^#]*?)\s*(?:#\s*(.*))?$")
_PREFIX = re.compile(r"^\[\s*\d+\.\d+\]\s?")


@dataclass
class Case:
    suite: str
    name: str
    status: str  # PASS, FAIL, SKIP
    directive: str = ""
    # The case's own KTAP lines: its diagnostics ("# ...") and its result.
    lines: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "name": f"{self.suite}.{self.name}" if self.suite else self.name,
            "status": self.status,
            "message": self.directive,
        }


def parse(text: str) -> tuple[list[Case], list[str]]:
    """Cases (leaf results) and problems (e.g. a suite plan that was not met)."""
    cases: list[Case] = []
    problems: list[str] = []
    # Each nesting level: [suite name, planned count, seen results, had children]
    stack: list[list] = []
    pending_name = ""
    diag: list[str] = []  # diagnostics since the last result
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw.rstrip())
        body = line.lstrip()
        depth = (len(line) - len(body)) // 4
        if body.startswith(("KTAP version", "TAP version")):
            continue
        if body.startswith("# Subtest:"):
            pending_name = body.split(":", 1)[1].strip()
            continue
        m = re.match(r"^1\.\.(\d+)", body)
        if m:
            while len(stack) > depth:
                stack.pop()
            stack.append([pending_name, int(m.group(1)), 0, False])
            pending_name = ""
            continue
        m = _RESULT.match(body)
        if not m:
            # A case's diagnostics: "# ..." lines and the indented lines of
            # an assertion's explanation (not the kernel's other messages).
            if body and (body.startswith("#") or line[0].isspace()):
                diag.append(body[:300])
                del diag[:-40]
            continue
        ok, _num, name, directive = m.group(1), m.group(2), m.group(3).strip(), m.group(4) or ""
        status = "PASS" if ok == "ok" else "FAIL"
        if directive.upper().startswith("SKIP"):
            status = "SKIP"
        # A result at depth d closes any deeper level (its suite's own line).
        closing = None
        while len(stack) > depth + 1:
            closing = stack.pop()
        if stack and len(stack) == depth + 1:
            stack[-1][2] += 1
            stack[-1][3] = stack[-1][3] or closing is not None
        if closing is not None:
            if closing[2] != closing[1]:
                problems.append(f"{name}: planned {closing[1]} cases, saw {closing[2]}")
            diag = []
            continue  # the suite's summary line, not a case
        suite = stack[-1][0] if stack else ""
        cases.append(Case(suite, name, status, directive, [*diag, body[:300]]))
        diag = []
    return cases, problems
