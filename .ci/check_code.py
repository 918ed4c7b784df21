#!/usr/bin/env python3
"""What the package's code must keep true, read from the notebooks (the source) and the exported modules:
- no exported cell is longer than 60 lines (a lesson shows its code in pieces a reader takes in at once),
  but those `.ci/long_cells.txt` lists (still to split; the list only shrinks);
- no expression is folded only because of its trailing comment (`f(` / `    args` / `)  # why`, where
  `# why` above `f(args)` fits in 100 columns): the comment goes on its own line;
- no method is replaced after its class: neither `Cls.name = ...` on a package class, nor a `@patch` of a name the
  class body (or an earlier `@patch`) already defines — what runs is what the reader read.
    python .ci/check_code.py [nbs/X.ipynb ...]      (default: every notebook in nbs/)
Exit status 1 and one line per problem."""

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60
EXPORT = re.compile(r"^#\|\s*export\b", re.M)


LONG_OK = ROOT / ".ci" / "long_cells.txt"  # cells still over the limit, by notebook and first name


def _first_name(src: str) -> str:
    m = re.search(r"^(?:async def|def|class)\s+(\w+)|^(\w+)\s*[:=]", src, re.M)
    return (m.group(1) or m.group(2)) if m else "?"


def long_cells(paths) -> list[str]:
    """Exported cells over MAX_LINES lines, less those `.ci/long_cells.txt` still lists (the list
    may only shrink: a listed cell that is short now is a problem too, so the list stays exact)."""
    known = (
        {line.strip() for line in LONG_OK.read_text().splitlines()} if LONG_OK.exists() else set()
    )
    known.discard("")
    known = {k for k in known if not k.startswith("#")}
    bad, seen = [], set()
    for p in paths:
        for i, c in enumerate(json.loads(Path(p).read_text())["cells"], 1):
            src = "".join(c.get("source", ""))
            if c["cell_type"] == "code" and EXPORT.search(src):
                n = len([line for line in src.splitlines() if not line.startswith("#|")])
                key = f"{Path(p).name}: {_first_name(src)}"
                if n > MAX_LINES:
                    seen.add(key)
                    if key not in known:
                        bad.append(f"{key} (cell {i}): exported cell of {n} lines (> {MAX_LINES})")
    names = {Path(p).name for p in paths}
    bad += [
        f"{k}: listed in .ci/long_cells.txt but no longer over {MAX_LINES} lines (delete the line)"
        for k in sorted(known - seen)
        if k.split(":")[0] in names
    ]
    return bad


def _patch_target(fn: ast.FunctionDef) -> str | None:
    "The class a fastcore `@patch` function attaches to (its first argument's annotation)."
    if not any(
        (isinstance(d, ast.Name) and d.id == "patch")
        or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "patch")
        for d in fn.decorator_list
    ):
        return None
    a = fn.args.args[0].annotation if fn.args.args else None
    return a.id if isinstance(a, ast.Name) else None


def replaced_methods(modules) -> list[str]:
    "Methods defined twice on one class across the package: class body, then `@patch` or assignment."
    defined: dict[tuple[str, str], str] = {}
    bad = []
    trees = [(m, ast.parse(Path(m).read_text())) for m in modules]
    for m, tree in trees:  # class bodies first
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                for b in n.body:
                    if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        defined[(n.name, b.name)] = f"{Path(m).name}:{b.lineno}"
    classes = {c for c, _ in defined}
    for m, tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cls = _patch_target(n)
                if cls is None:
                    continue
                key = (cls, n.name)
                if key in defined:
                    bad.append(
                        f"{Path(m).name}:{n.lineno}: @patch replaces {cls}.{n.name} "
                        f"(defined at {defined[key]})"
                    )
                defined[key] = f"{Path(m).name}:{n.lineno}"
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id in classes
                        and (t.value.id, t.attr) in defined
                    ):
                        bad.append(
                            f"{Path(m).name}:{n.lineno}: {t.value.id}.{t.attr} reassigned "
                            f"after its class (defined at {defined[(t.value.id, t.attr)]})"
                        )
    return bad


FOLD_END = re.compile(r"(\s*)([\)\]])(\s+#\s.*)$")


def comment_folds(paths) -> list[str]:
    "Three-line expressions that fit on one line but for their trailing comment."
    bad = []
    for p in paths:
        for c in json.loads(Path(p).read_text())["cells"]:
            lines = "".join(c.get("source", "")).split("\n") if c["cell_type"] == "code" else []
            for a, b, e in zip(lines, lines[1:], lines[2:]):
                ind, m = re.match(r"\s*", a).group(), FOLD_END.match(e)
                if not (m and m.group(1) == ind and a.rstrip().endswith(("(", "["))):
                    continue
                inner = b.strip()
                if b.startswith(ind + "    ") and "#" not in b and not inner.endswith(","):
                    if len(ind + a.strip() + inner + m.group(2)) <= 100:
                        bad.append(
                            f"{Path(p).name}: cell {c.get('id')}: {a.strip()} ... folded by its comment"
                        )
    return bad


if __name__ == "__main__":
    nbs = sys.argv[1:] or sorted(str(p) for p in (ROOT / "nbs").glob("*.ipynb"))
    mods = sorted(
        str(p) for p in (ROOT / "minivllm").rglob("*.py") if p.name not in ("_modidx.py",)
    )
    problems = long_cells(nbs) + comment_folds(nbs) + replaced_methods(mods)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
