"""The README's Python example runs as written (from the repository root)."""

from __future__ import annotations

import os
import re

import pytest

from conftest import CASES, REPO


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README: no python block in the Python section"
    return m.group(1)


def test_readme_example(capsys, monkeypatch):
    code = readme_example()
    assert len(code.strip().splitlines()) == 5
    # Run from the repository root, as the README says; QMOE_CONFORMANCE_CASES (a clone elsewhere)
    # moves the cases.
    code = code.replace('"../shared/conformance/cases', '"' + str(CASES))
    monkeypatch.chdir(REPO)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.match(r"\(8, \d+\) \[", out), out
