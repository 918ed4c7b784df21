#!/usr/bin/env python3
"""The course's saved notebooks are what the docs site shows, so they must be saved executed and readable:
- a notebook saved with no outputs at all fails;
- a code cell that draws (a `plot_*` call, `plt.`, a `StepViewer`, a `viz.` function) must have a stored image or
  step-widget output (cells that nbdev_test skips by flag and have never been run are exempt);
- no saved output may hold an error, a traceback, a progress bar or a log line;
- every lesson (a numbered notebook) ends with a picture: an image or a step widget in its last third;
- every lesson from 02 on shows the shared step widget (`StepViewer`), but the benchmarks and the CLI.
    python .ci/check_notebooks.py [nbs/X.ipynb ...]      (default: every notebook in nbs/)
Exit status 1 and one line per problem when something is wrong."""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRAWS = re.compile(r"(\bplot_\w+\(|\bplt\.|\bStepViewer\(|\bviz\.\w+\(|\.plot\(|\bshow_picture\()")
DIRECTIVE = re.compile(r"^#\|\s*(.+)$", re.M)
PROGRESS = re.compile(r"(\d+%\|[█▉▊▋▌▍▎▏ #]*\||\bit/s\]|Loading weights|Writing model shards|Loading checkpoint shards)")
LOGLINE = re.compile(r"^\s*(\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d[^\n]*\b(INFO|WARNING|DEBUG)\b|(INFO|WARNING|DEBUG)\s*[:|]|\[(I|W|D) \d|"
                     r"\S+ - (INFO|WARNING|DEBUG) - )", re.M)
SKIP_FLAGS = {"slow", "gpu"}
NO_VIEWER = {"16_benchmarks.ipynb", "16b_course.ipynb", "17_cli.ipynb", "90_viz.ipynb"}   # measurements, the course tool and the command line: figures, no engine steps



def _src(c) -> str: return "".join(c.get("source", ""))
def _directives(c) -> set[str]: return {d.strip() for d in DIRECTIVE.findall(_src(c))}
def _text(o) -> str:
    if o.get("output_type") == "stream": return "".join(o.get("text", ""))
    d = o.get("data", {}) or {}
    return "".join(d.get("text/plain", "")) + "".join(d.get("text/html", "")) + "".join(d.get("text/markdown", ""))


DRAW_CALL = re.compile(r"^(plot_\w+|plt\.\w+|StepViewer|viz\.\w+|\w+\.plot|show_picture)$")


def _name(f) -> str:
    import ast
    return f.id if isinstance(f, ast.Name) else (_name(f.value) + "." + f.attr if isinstance(f, ast.Attribute) else "?")


def draws(src: str) -> bool:
    "Does the cell draw at its top level (not merely define a drawing function), outside a test cell?"
    import ast
    if re.search(r"^\s*(assert\b|test_\w+\()", src, re.M): return False   # a test that draws in memory shows nothing
    try: tree = ast.parse("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))))
    except SyntaxError: return bool(DRAWS.search(re.sub(r"#.*", "", src)))
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)): continue
        if any(isinstance(n, ast.Call) and DRAW_CALL.match(_name(n.func)) for n in ast.walk(stmt)): return True
    return False


def is_picture(o) -> bool:
    "An output a reader sees as a picture: an image, a step widget's player, or an inline SVG/image in HTML."
    d = o.get("data", {}) or {}
    html = "".join(d.get("text/html", ""))
    return any(k.startswith("image/") for k in d) or "step-viewer" in html or "<img" in html or "<svg" in html


def is_viewer(o) -> bool: return "step-viewer" in "".join((o.get("data", {}) or {}).get("text/html", ""))


def check(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    name, problems = path.name, []
    runnable = [c for c in code if not ({"export", "exports", "exporti", "hide"} & _directives(c) and not c.get("outputs"))
                and "eval: false" not in _directives(c)]
    if runnable and not any(c.get("outputs") for c in code):
        return [f"{name}: saved with no outputs at all (execute it: python .ci/execute nbs/{name})"]
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] != "code": continue
        ds, outs = _directives(c), c.get("outputs", [])
        flagged = bool(SKIP_FLAGS & ds) or "eval: false" in ds
        first = _src(c).strip().splitlines()[0][:60] if _src(c).strip() else ""
        if draws(_src(c)) and not ({"export", "exports", "exporti"} & ds) and not flagged \
                and not any(is_picture(o) for o in outs):
            problems.append(f"{name}: cell {i} draws but has no stored picture: {first!r}")
        for o in outs:
            t = _text(o)
            if o.get("output_type") == "error" or "Traceback (most recent call last)" in t:
                problems.append(f"{name}: cell {i} has an error output: {first!r}")
            if PROGRESS.search(t): problems.append(f"{name}: cell {i} has a progress bar in its output: {first!r}")
            if LOGLINE.search(t): problems.append(f"{name}: cell {i} has a log line in its output: {LOGLINE.search(t).group(0).strip()[:80]!r}")
    m = re.match(r"(\d+)_", name)
    if m and int(m.group(1)) < 98:          # 98_main, 99_public_api: appendices that only export names, not lessons
        cells = nb["cells"]
        tail = cells[len(cells) * 2 // 3:]
        if not any(is_picture(o) for c in tail if c["cell_type"] == "code" for o in c.get("outputs", [])):
            problems.append(f"{name}: the lesson does not end with a picture (none in its last third)")
        if int(m.group(1)) >= 2 and name not in NO_VIEWER and not any(is_viewer(o) for c in code for o in c.get("outputs", [])):
            problems.append(f"{name}: no step widget (StepViewer) saved in this lesson")
    return problems


def main(paths: list[str]) -> int:
    files = [Path(p) for p in paths] or sorted((ROOT / "nbs").glob("*.ipynb"))
    problems = [p for f in files for p in check(f.resolve())]
    for p in problems: print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__": sys.exit(main(sys.argv[1:]))
