"""`.ci/stats` (run by .ci/test) on a tiny project of its own: three notebooks and a package of two
folders, where one module assigns attributes to a class of another, imports a private name from it
and patches it (once with a test after, once without). Each number is checked, and `--check` fails
on a number over its limit."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

STATS = Path(__file__).resolve().parent.parent / ".ci" / "stats"

A_PY = """__all__ = ["A"]


class A:
    def m(self):
        return 1


def _helper():
    return 2


A_CONST = 3
A.local = 2
"""
B_PY = """from fastcore.basics import patch
from minivllm.a import A, _helper
from os import _exit
from . import a as amod


@patch
def f(self: A):
    return _helper()


@patch
def g(self: "A"):
    return 3


class B:
    pass


@patch
def h(self: B):
    return 4


A.extra = 1
if True:
    amod.A.other, B.mine = 1, 2


def later():
    A.inner = 3
"""
C_PY = """from .. import a

setattr(a.A, "flag", True)
"""
LONG = "#| export\n" + "\n".join(f"v{i} = {i}" for i in range(41))
NB_A = [
    "#| default_exp a",
    "#| export\nclass A:\n    def m(self):\n        return 1\n\n\ndef _helper():\n    return 2",
    ("markdown", "Some words, and a test after the class"),
    "test_eq(A().m(), 1)",
    "#|export\nA_CONST = 3",  # untested: a hidden import, then an assert that does not run
    "#| hide\nimport os",
    "#| eval: false\nassert A_CONST == 3",
    "x = 1\n#| export\ny = 2",  # not exported: nbdev reads directives before the code only
]
NB_B = [
    "#| default_exp b",
    "#| exports\nfrom minivllm.a import A, _helper",  # untested
    "#| export\n@patch\ndef f(self: A):\n    return _helper()",  # a foreign patch, untested
    "z = 0",
    '#| export\n@patch\ndef g(self: "A"):\n    return 3',  # a foreign patch, tested
    "assert A().g() == 3",
    "#| export\nclass B:\n    pass\n\n\n@patch\ndef h(self: B):\n    return 4",  # its own class
    LONG,
    "# | hide\nfrom fastcore.test import test_close\n\ntest_close(1.0, 1.0)",
]
NB_SKIPPED = ["#| default_exp b", "#| export\ndef skipped():\n    pass"]


def _nb(path: Path, cells):
    cells = [c if isinstance(c, tuple) else ("code", c) for c in cells]
    nb = {
        "cells": [
            {"cell_type": t, "metadata": {}, "source": s}
            | ({"outputs": [], "execution_count": None} if t == "code" else {})
            for t, s in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


@pytest.fixture
def project(tmp_path):
    files = {
        "minivllm/__init__.py": "",
        "minivllm/_modidx.py": "d = {}\n",
        "minivllm/a.py": A_PY,
        "minivllm/b.py": B_PY,
        "minivllm/sub/__init__.py": "",
        "minivllm/sub/c.py": C_PY,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    _nb(tmp_path / "nbs/00_a.ipynb", NB_A)
    _nb(tmp_path / "nbs/more/01_b.ipynb", NB_B)
    _nb(tmp_path / "nbs/_draft.ipynb", NB_SKIPPED)
    return tmp_path


def _stats(root, *args):
    cmd = [sys.executable, str(STATS), "--root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _lines(*texts):
    return sum(1 for t in texts for s in t.splitlines() if s.strip())


def test_numbers(project):
    r = _stats(project, "--json", "--no-ruff")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["per_folder"] == {
        "minivllm": {"modules": 3, "lines": _lines(A_PY, B_PY)},
        "minivllm/sub": {"modules": 2, "lines": _lines(C_PY)},
    }
    assert (s["folders"], s["modules"], s["modules_per_folder_max"]) == (2, 5, 3)
    # exported cells: 5 and 1 lines in 00_a; 1, 3, 3, 5 and 41 in 01_b (_draft is skipped)
    assert s["exported_cells"] == 7
    assert (s["exported_cell_lines_median"], s["exported_cell_lines_max"]) == (3, 41)
    assert s["exported_cells_over_40"] == 1
    assert s["exported_cells_tested"] == 4 and s["exported_cells_tested_share"] == round(4 / 7, 3)
    assert (s["patch_foreign"], s["patch_foreign_untested"]) == (2, 1)
    # A.extra, amod.A.other, setattr(a.A, ...); not B.mine, A.local (own module), A.inner (a def)
    assert s["class_attr_assignments"] == 3
    assert s["private_imports"] == 1  # _helper (os._exit is not the package's)
    assert s["ruff_findings"] is None
    text = _stats(project, "--no-ruff", "--verbose").stdout
    assert "private_imports: 1\n" in text and "minivllm/b.py:2: _helper from minivllm.a" in text
    assert "minivllm/sub/c.py:3: a.A.flag (a class of minivllm.a)" in text


def test_clean_package_counts_zero(project):
    (project / "minivllm/b.py").write_text(
        "from minivllm.a import A\n\n\nclass B:\n    pass\n\n\nB.mine = 1\n"
    )
    (project / "minivllm/sub/c.py").write_text("from .. import a\n")
    # g (tested) is the only foreign patch left
    _nb(project / "nbs/more/01_b.ipynb", NB_B[:2] + NB_B[4:])
    s = json.loads(_stats(project, "--json", "--no-ruff").stdout)
    assert (s["class_attr_assignments"], s["private_imports"]) == (0, 0)
    assert (s["patch_foreign"], s["patch_foreign_untested"]) == (1, 0)


def test_check(project):
    limits = project / "limits.json"
    current = {"max": {"private_imports": 1, "exported_cells_over_40": 1, "ruff_findings": 0}}
    current["min"] = {"exported_cells_tested_share": 0.5}
    limits.write_text(json.dumps(current))
    r = _stats(project, "--no-ruff", "--check", str(limits))
    assert r.returncode == 0, r.stderr
    assert "private_imports: 1\n" in r.stdout  # the numbers are printed either way
    limits.write_text(
        json.dumps({"max": {"private_imports": 0}, "min": {"exported_cells_tested_share": 0.6}})
    )
    r = _stats(project, "--no-ruff", "--check", str(limits))
    assert r.returncode == 1
    assert "private_imports is 1, over its limit 0" in r.stderr
    assert "exported_cells_tested_share is 0.571, under its minimum 0.6" in r.stderr
    limits.write_text(json.dumps({"max": {"private_import": 1}}))  # a typo checks nothing: it fails
    r = _stats(project, "--no-ruff", "--check", str(limits))
    assert r.returncode == 1 and "'private_import'" in r.stderr


@pytest.mark.skipif(not shutil.which("ruff"), reason="ruff is not installed")
def test_ruff_findings(project):
    (project / "pyproject.toml").write_text('[tool.ruff.lint]\nselect = ["F401"]\n')
    s = json.loads(_stats(project, "--json").stdout)
    assert (s["ruff_findings"], s["ruff_by_code"]) == (1, {"F401": 1})  # b.py: os._exit


def test_executable():
    assert os.access(STATS, os.X_OK) and STATS.read_text().startswith("#!/usr/bin/env python3\n")
