"""docs/guarantees.md names, for every promise, the tests that back it; each named test exists.

A promise is a top-level bullet of the page. A test is named ``file.py::test_name``
(a file under ``tests/``) or ``::test_name`` (a test of the file named last before
it on the page). A test "exists" when its file defines a function of that name
(at module level or in a class), found by reading the file's syntax tree, so a
renamed or deleted test fails this check.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "guarantees.md"
_REF = re.compile(r"`(?:(test_\w+\.py))?::(test_\w+)`|`(test_\w+\.py)`")


def promises(text: str) -> list[tuple[int, str]]:
    """The top-level bullets of a page: (line number, text with its continuation lines)."""
    out: list[tuple[int, list[str]]] = []
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("* "):
            out.append((n, [line]))
        elif out and line.startswith("  ") and line.strip():
            out[-1][1].append(line)
        elif out and not line.strip():
            out.append((0, []))  # a blank line ends a bullet
    return [(n, " ".join(lines)) for n, lines in out if n]


def named_tests(text: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """Each promise of the page with the tests it names: (line, [(file, test), ...]), files resolved."""
    last_file = None
    out = []
    for n, body in promises(text):
        refs = []
        for m in _REF.finditer(body):
            if m.group(3):  # a file named alone (its tests are named elsewhere)
                continue
            if m.group(1):
                last_file = m.group(1)
            if last_file is None:
                raise AssertionError(f"line {n}: ::{m.group(2)} names no file before it")
            refs.append((last_file, m.group(2)))
        out.append((n, refs))
    return out


@cache
def _tests_in(file: str) -> frozenset[str]:
    p = REPO / "tests" / file
    if not p.is_file():
        return frozenset()
    tree = ast.parse(p.read_text("utf-8"))
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"))


def problems(text: str) -> list[str]:
    """What is wrong with a page: promises naming no test, and named tests that do not exist."""
    out = []
    for n, refs in named_tests(text):
        if not refs:
            out.append(f"line {n}: the promise names no test")
        for file, test in refs:
            if test not in _tests_in(file):
                out.append(f"line {n}: {file}::{test} does not exist")
    return out


def test_every_promise_names_a_test_and_every_named_test_exists():
    text = PAGE.read_text("utf-8")
    assert len(promises(text)) >= 50, "the page's promises were not found: has its bullet style changed?"
    assert problems(text) == []


def test_the_check_finds_a_promise_without_a_test_and_a_test_that_does_not_exist():
    page = ("# Fake\n\n* **Checked.** `test_guarantees_page.py::test_every_promise_names_a_test_and_every_"
            "named_test_exists`,\n  `::test_the_check_finds_a_promise_without_a_test_and_a_test_that_does_not_"
            "exist`.\n* **Unbacked.** Nothing names a test here.\n\n* **Renamed.**\n  `::test_no_such_test`, "
            "`test_nowhere.py::test_x`.\n")
    assert [n for n, _ in promises(page)] == [3, 5, 7]
    assert problems(page) == ["line 5: the promise names no test",
                              "line 7: test_guarantees_page.py::test_no_such_test does not exist",
                              "line 7: test_nowhere.py::test_x does not exist"]
