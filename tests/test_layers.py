"""Layers point down: the import graph of `minivllm/`, read from the source (module-level imports and imports inside
functions alike), follows the lesson order. A module may import only modules of earlier lessons; `viz` (the drawing
layer) sits beside the top and no core module imports it, nor matplotlib, ipywidgets or PIL."""
import ast, json, re
from pathlib import Path
import graphlib
import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "minivllm"
DRAWING = {"matplotlib", "ipywidgets", "PIL", "IPython"}
SIDE = {"viz"}            # drawing layer: may import the core, imported by none of it


def lesson_order() -> dict[str, float]:
    "module name -> the number of the notebook that exports it (`#| default_exp`), from nbs/."
    order = {}
    for nb in sorted((ROOT / "nbs").glob("[0-9]*.ipynb")):
        for c in json.loads(nb.read_text())["cells"]:
            m = re.search(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"]))
            if m:
                n = re.match(r"(\d+)([a-z]?)_", nb.name)     # 06b_... comes after 06_... and before 07_...
                order[m.group(1)] = int(n.group(1)) + (ord(n.group(2)) - 96) / 10 if n.group(2) else float(n.group(1)); break
    return order


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, int, str]]:
    "(imported name, line, 'minivllm' or 'external') for every import in the file, nested ones included."
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            if n.level: names = [mod.split(".")[0]] if mod else [a.name for a in n.names]
            elif mod.startswith("minivllm."): names = [mod.split(".")[1]]
            elif mod == "minivllm": names = [a.name for a in n.names]
            else: out.append((mod.split(".")[0], n.lineno, "external"))
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.startswith("minivllm."): names.append(a.name.split(".")[1])
                else: out.append((a.name.split(".")[0], n.lineno, "external"))
        out += [(x, n.lineno, "minivllm") for x in names if x in modules]
    return out


def graph():
    mods = {p.stem: p for p in PKG.glob("*.py") if p.stem not in ("__init__", "_modidx")}
    return mods, {m: imports_of(p, set(mods)) for m, p in mods.items()}


def test_every_module_has_a_lesson():
    mods, order = graph()[0], lesson_order()
    missing = sorted(set(mods) - set(order))
    assert not missing, f"modules without a notebook that exports them: {missing}"


def test_no_cycles():
    mods, g = graph()
    ts = graphlib.TopologicalSorter({m: {x for x, _, k in imps if k == "minivllm" and x != m} for m, imps in g.items()})
    try: ts.prepare()
    except graphlib.CycleError as e: pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_imports_point_down_the_lessons():
    mods, g = graph()
    order = lesson_order()
    bad = [f"{m} (lesson {order[m]:g}) imports {x} (lesson {order[x]:g}) at line {line}"
           for m, imps in g.items() for x, line, k in imps
           if k == "minivllm" and x != m and m not in SIDE and x not in SIDE and order[x] > order[m]]
    assert not bad, "imports that reach a later lesson:\n" + "\n".join(bad)


def test_core_never_imports_drawing():
    mods, g = graph()
    bad = [f"{m} imports {x} at line {line}" for m, imps in g.items() if m not in SIDE
           for x, line, k in imps if (k == "minivllm" and x in SIDE) or (k == "external" and x in DRAWING)]
    assert not bad, "drawing code in the core:\n" + "\n".join(bad)


def test_checker_sees_nested_imports(tmp_path):
    "The checker itself: an import inside a function counts."
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from minivllm.cli import main\n    import matplotlib.pyplot as plt\n")
    found = imports_of(f, {"cli"})
    assert ("cli", 2, "minivllm") in found and ("matplotlib", 3, "external") in found
