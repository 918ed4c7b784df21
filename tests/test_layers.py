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


def imports_of(path: Path, modules: set[str], pkg: str = "") -> list[tuple[str, int, str]]:
    """(imported module, line, 'minivllm' or 'external') for every import in the file, nested ones included. Modules
    are dotted paths under minivllm (`core.scheduler`); `pkg` is the file's own package (`core`), for relative imports."""
    out = []

    def found(dotted: str, line: int, names=()):
        "`dotted` (or `dotted.name`, where that is a module) among `modules`."
        hits = [f"{dotted}.{a}".strip(".") for a in names if f"{dotted}.{a}".strip(".") in modules]
        if not hits and dotted in modules: hits = [dotted]
        out.extend((x, line, "minivllm") for x in hits)

    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            mod, names = n.module or "", [a.name for a in n.names]
            if n.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - (n.level - 1)] if n.level > 1 else base
                found(".".join([*base, *([mod] if mod else [])]), n.lineno, names)
            elif mod == "minivllm" or mod.startswith("minivllm."): found(mod[len("minivllm."):], n.lineno, names)
            else: out.append((mod.split(".")[0], n.lineno, "external"))
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.startswith("minivllm."): found(a.name[len("minivllm."):], n.lineno)
                else: out.append((a.name.split(".")[0], n.lineno, "external"))
    return out


def graph():
    "module (dotted, under minivllm/) -> its imports; the packages' own `__init__` files are left out."
    mods = {".".join(p.relative_to(PKG).with_suffix("").parts): p for p in PKG.rglob("*.py")
            if p.stem not in ("__init__", "_modidx")}
    return mods, {m: imports_of(p, set(mods), m.rpartition(".")[0]) for m, p in mods.items()}


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
    f.write_text("def f():\n    from minivllm.serve.cli import main\n    import matplotlib.pyplot as plt\n"
                 "    from ..core import config\n")
    assert imports_of(f, {"core.config"}, "serve")[-1] == ("core.config", 4, "minivllm")
    found = imports_of(f, {"serve.cli"})
    assert ("serve.cli", 2, "minivllm") in found and ("matplotlib", 3, "external") in found
