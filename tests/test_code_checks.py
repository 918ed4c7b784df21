"""`.ci/check_code.py` (run by .ci/test) shown to fail on what it is for: a new exported cell over 60 lines, a listed
long cell that got short, and a method replaced after its class (by `@patch` or by assignment)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_code", ROOT / ".ci" / "check_code.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def _nb(tmp_path, src: str, name="05_x.ipynb") -> Path:
    cell = {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
    p = tmp_path / name
    p.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return p


def test_long_exported_cell_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "LONG_OK", tmp_path / "none.txt")
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert cc.long_cells([_nb(tmp_path, f"#| export\ndef f():\n{body}\n")])
    assert not cc.long_cells([_nb(tmp_path, "#| export\ndef f():\n    return 1\n")])
    assert not cc.long_cells([_nb(tmp_path, f"def f():\n{body}\n")])  # not exported: a test cell


def test_listed_cell_that_got_short_fails(tmp_path, monkeypatch):
    ok = tmp_path / "long.txt"
    ok.write_text("05_x.ipynb: f\n")
    monkeypatch.setattr(cc, "LONG_OK", ok)
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert not cc.long_cells([_nb(tmp_path, f"#| export\ndef f():\n{body}\n")])
    assert cc.long_cells([_nb(tmp_path, "#| export\ndef f():\n    return 1\n")])


def test_replaced_methods_fail(tmp_path):
    m = tmp_path / "m.py"
    m.write_text("class A:\n    def forward(self): return 1\n\n@patch\ndef forward(self: A): return 2\n")
    assert cc.replaced_methods([m])
    m.write_text("class A:\n    def forward(self): return 1\n\nA.forward = lambda self: 2\n")
    assert cc.replaced_methods([m])
    m.write_text("class A:\n    def forward(self): return 1\n\n@patch\ndef extra(self: A): return 2\n")
    assert not cc.replaced_methods([m])


def test_the_package_passes():
    nbs = sorted((ROOT / "nbs").glob("*.ipynb"))
    mods = sorted(p for p in (ROOT / "minivllm").rglob("*.py") if p.name != "_modidx.py")
    assert cc.long_cells(nbs) + cc.replaced_methods(mods) == []
