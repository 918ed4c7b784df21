"""The course as a teacher uses it:

- every exercise (a `#| exercise` cell at the end of a lesson) in both directions: its reference solution passes the
  test cells that follow it, the student's blank (`minivllm course --student`) fails them, and so does each of
  its plausible wrong answers (tests/exercise_mistakes.py, at least three an exercise); every core lesson has two;
- every measured number the home page (nbs/index.ipynb) and README.md quote comes from the benchmarks' saved results
  (nbs/bench_results/*.json), through the index's own cell;
- the two paths of nbs/course.yml name notebooks that exist, and every core lesson ends with a recap.
"""
import ast, json, os, re, runpy
from pathlib import Path
import pytest
from minivllm.course import blank, exercise_hint, exercises
from exercise_mistakes import MISTAKES

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"


def _src(c) -> str:
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def all_exercises():
    out = []
    for p in sorted(NBS.glob("*.ipynb")):
        nb = json.loads(p.read_text())
        out += [pytest.param(p.name, i, tests, id=f"{p.stem}-cell{i}") for i, tests in exercises(nb)]
    return out


def run_exercise(nb_name: str, i: int, tests: list[int], blanked: bool, replace: tuple[str, str] | None = None):
    """Run the exercise cell (or its blank, or with `replace=(name, source)`: function `name` swapped for `source`)
    and its test cells in a fresh namespace, from nbs/ as nbdev_test does."""
    cells = json.loads((NBS / nb_name).read_text())["cells"]
    src = _src(cells[i])
    if blanked: src = blank(src, exercise_hint(cells[i]))
    if replace: src = swap_function(src, *replace)
    ns = {"__name__": "__exercise__"}
    cwd = os.getcwd(); os.chdir(NBS)
    try:
        exec(compile(src, f"{nb_name}:cell{i}", "exec"), ns)
        for j in tests: exec(compile(_src(cells[j]), f"{nb_name}:cell{j}", "exec"), ns)
    finally: os.chdir(cwd)


def defined_functions(src: str) -> list[str]:
    return [n.name for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def swap_function(src: str, name: str, new: str) -> str:
    "`src` with its top-level function `name` replaced by the source `new`."
    f = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = src.splitlines()
    lines[f.lineno - 1 : f.end_lineno] = new.strip("\n").splitlines()
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("nb_name,i,tests", all_exercises())
def test_exercise_wrong_answers_fail(nb_name, i, tests):
    """The exercise's tests check what its prose asks: each of at least three plausible wrong answers
    (tests/exercise_mistakes.py) fails them."""
    cells = json.loads((NBS / nb_name).read_text())["cells"]
    for name in defined_functions(_src(cells[i])):
        wrong = MISTAKES.get((nb_name.removesuffix(".ipynb"), name), [])
        assert len(wrong) >= 3, f"{nb_name}: {name} has {len(wrong)} wrong answers in tests/exercise_mistakes.py"
        passed = []
        for why, source in wrong:
            try:
                run_exercise(nb_name, i, tests, blanked=False, replace=(name, source))
            except NotImplementedError:
                raise
            except Exception:
                continue
            passed.append(why)
        assert not passed, f"{nb_name}: wrong answers to {name} pass its tests: {passed}"


def test_swap_function_replaces_only_the_function():
    src = "import x\n\n\ndef f(a):\n    \"doc\"\n    return a\n\n\ny = 1\n"
    assert swap_function(src, "f", "\ndef f(a):\n    return 2\n") == "import x\n\n\ndef f(a):\n    return 2\n\n\ny = 1\n"


@pytest.mark.parametrize("nb_name,i,tests", all_exercises())
def test_exercise_reference_passes_blank_fails(nb_name, i, tests):
    assert tests, f"{nb_name}: exercise cell {i} has no test cells after it"
    run_exercise(nb_name, i, tests, blanked=False)
    with pytest.raises(NotImplementedError, match="hint: "):
        run_exercise(nb_name, i, tests, blanked=True)


def test_core_lessons_have_exercises_and_recaps():
    rt = runpy.run_path(str(ROOT / ".ci" / "reading_time"))
    core = rt["course"]()["core"]
    assert core, "nbs/course.yml lists no core lesson"
    missing_recap, counts = [], {}
    for e in core:
        nb = json.loads((NBS / e["file"]).read_text())
        if not any(c["cell_type"] == "markdown" and _src(c).startswith("## Recap") for c in nb["cells"]):
            missing_recap.append(e["nb"])
        counts[e["nb"]] = len(exercises(nb))
    assert not missing_recap, f"core lessons without a recap: {missing_recap}"
    few = {stem: n for stem, n in counts.items() if n < 2}
    assert not few, f"core lessons with fewer than two exercises: {few}"


def test_exercises_do_not_export():
    "An exercise must not change the package: no exercise cell is also exported."
    bad = [f"{p.name}: cell {i}" for p in NBS.glob("*.ipynb") for i, _ in exercises(json.loads(p.read_text()))
           if re.search(r"^#\|\s*export", _src(json.loads(p.read_text())["cells"][i]), re.M)]
    assert not bad, bad


# ---- one source for every measured number

UNITS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(?:ms\b|×|tokens/s|tok/s|tokens a second)")


def headline_cell():
    nb = json.loads((NBS / "index.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "def headline" in _src(c))
    return cell


def computed_headline() -> str:
    ns = {}
    cwd = os.getcwd(); os.chdir(NBS)
    try:
        exec(re.sub(r"^Markdown\(headline\(\)\)\s*$", "", _src(headline_cell()), flags=re.M), ns)
        return ns["headline"]()
    finally: os.chdir(cwd)


def computed_line(fn: str) -> tuple[str, str]:
    """The index's sentence made by its cell `def fn` (the GPU run, the CPU servers), computed from nbs/bench_results
    by that cell, and the output the cell saved."""
    nb = json.loads((NBS / "index.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and f"def {fn}" in _src(c))
    ns = {}
    cwd = os.getcwd(); os.chdir(NBS)
    try:
        exec(re.sub(rf"^{fn}\(\)\s*$", "", _src(headline_cell()) + "\n" + _src(cell), flags=re.M)
             .replace("\nMarkdown(headline())", ""), ns)
        saved = "".join("".join(o["data"]["text/markdown"]) for o in cell["outputs"] if "text/markdown" in o.get("data", {}))
        return ns[fn]().data, saved
    finally: os.chdir(cwd)


def stray_numbers(text: str, allowed: str) -> list[str]:
    "Numbers with a unit of speed or time in `text` that the results table `allowed` does not hold."
    ok = set(re.findall(r"\d+(?:\.\d+)?", allowed))
    return sorted({m.group(0) for m in UNITS.finditer(text) if m.group(1) not in ok})


def test_index_numbers_come_from_saved_results():
    table = computed_headline()
    saved = "".join("".join(o["data"]["text/markdown"]) for o in headline_cell()["outputs"] if "text/markdown" in o.get("data", {}))
    assert saved.strip() == table.strip(), "the index's results table is stale: re-execute nbs/index.ipynb"
    readme = (ROOT / "README.md").read_text()
    assert table.strip() in readme, "README.md does not hold the results table: run python3 .ci/readme"
    nb = json.loads((NBS / "index.ipynb").read_text())
    prose = "\n".join(_src(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    lines = ""
    for fn in ("on_gpu", "server_vs_server", "at_real_sizes"):
        line, saved = computed_line(fn)
        assert saved.strip() == line.strip(), f"the index's {fn} sentence is stale: re-execute nbs/index.ipynb"
        assert line.strip() in readme, f"README.md does not hold the {fn} sentence: run python3 .ci/readme"
        lines += line
    bad = stray_numbers(prose, table + lines) + stray_numbers(readme, table + lines)
    assert not bad, f"numbers quoted in index/README that nbs/bench_results does not give: {bad}"


def table_pairs(table: str) -> list[tuple[str, str, str]]:
    """(row, minivllm figure, llama.cpp figure) for each comparison a results table makes: a llama.cpp column compares
    with each minivllm column between it and the previous llama.cpp column of its group (a group starts at each
    non-empty cell of the first row)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    grouped = rows[1][0].startswith("**")   # a first row of groups above the column names
    head = rows[1] if grouped else rows[0]
    groups, names, g = [], [c.strip("*") for c in head], -1
    for j, c in enumerate(rows[0]):   # without a group row, an empty column name separates groups
        g += bool(c) if grouped else (j == 0 or not c)
        groups.append(g)
    pairs = []
    for row in rows[2 if grouped else 1:]:
        for j, name in enumerate(names):
            if not name.startswith("llama.cpp"): continue
            k = j - 1
            while k >= 0 and groups[k] == groups[j] and not names[k].startswith("llama.cpp"):
                if names[k].startswith(("minivllm", "compiled", "eager")):
                    pairs.append((row[0], row[k].split()[0].strip("*"), row[j].split()[0].strip("*")))
                k -= 1
    return pairs


def run_figures() -> set[tuple[str, str]]:
    "(minivllm, llama.cpp) as the home page rounds them, for every saved llama.cpp run."
    ns = {}
    cwd = os.getcwd(); os.chdir(NBS)
    try:
        exec(re.sub(r"^Markdown\(headline\(\)\)\s*$", "", _src(headline_cell()), flags=re.M), ns)
        out = set()
        for f in sorted(Path("bench_results").glob("llamacpp_*.json")):
            run = json.loads(f.read_text())
            if run.get("kind") == "latency":
                ll = next(r["system"] for r in run["results"] if r["system"].startswith("llama.cpp"))
                out.add((f"{ns['tpot_ms'](run, 'minivllm'):.1f}", f"{ns['tpot_ms'](run, ll):.1f}"))
            elif "results" in run:
                mv, lc = ns["tok_s"](run, "minivllm"), ns["tok_s"](run, "llama.cpp")
                if mv and lc: out.add((f"{ns['mean'](mv):.0f}", f"{ns['mean'](lc):.0f}"))
        return out
    finally: os.chdir(cwd)


def test_compared_figures_come_from_one_run():
    "Every minivllm figure the home page compares with llama.cpp's sits beside llama.cpp's figure of the same run."
    pairs, runs = table_pairs(computed_headline()), run_figures()
    assert len(pairs) == 9, pairs
    bad = [p for p in pairs if p[1:] not in runs]
    assert not bad, f"figures from two different runs compared side by side: {bad}"


def test_pairing_catches_figures_from_two_runs():
    "The layout the home page had: one llama.cpp column for the eager and the compiled runs."
    old = ("| | batch 1, ms a token | | | 32 mixed requests, tokens/s | | |\n|---|---|---|---|---|---|---|\n"
           "| **precision** | **minivllm eager** | **compiled** | **llama.cpp** | **minivllm** | **llama.cpp** "
           "| **HF static batches** |\n| float32 | 23.5 | 20.4 | 18.2 | 156 (1.62× llama.cpp) | 97 | 46 |")
    pairs = table_pairs(old)
    assert pairs == [("float32", "20.4", "18.2"), ("float32", "23.5", "18.2"), ("float32", "156", "97")]
    assert [p for p in pairs if p[1:] not in run_figures()] == [("float32", "20.4", "18.2")]


def saved_markdown(nb_name: str, marker: str) -> str:
    nb = json.loads((NBS / nb_name).read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and marker in _src(c))
    return "".join("".join(o["data"]["text/markdown"]) for o in cell["outputs"] if "text/markdown" in o.get("data", {}))


def test_05b_compares_figures_of_one_run():
    "Lesson 05b's batch-1 table sets minivllm's compiled figure beside llama.cpp's of the same run."
    pairs = table_pairs(saved_markdown("05b_compile.ipynb", "def b1_table"))
    assert len(pairs) == 3, pairs
    bad = [p for p in pairs if p[1:] not in run_figures()]
    assert not bad, f"figures from two different runs compared side by side: {bad}"
    old = ("| ms a token, one sequence | eager | compiled, `compile_sizes=[1]` | llama.cpp |\n|---|---|---|---|\n"
           "| bfloat16 / BF16 | 28.9 | **11.2** (2.6× faster) | 11.4 |")   # the table 05b had: two runs in a row
    assert [p for p in table_pairs(old) if p[1:] not in run_figures()] == [
        ("bfloat16 / BF16", "11.2", "11.4"), ("bfloat16 / BF16", "28.9", "11.4")]


def test_stray_numbers_catches_a_made_up_number():
    table = "| float32 | 23.5 | 20.4 | 156 (1.62× llama.cpp) |"
    assert stray_numbers("eager is 23.5 ms a token, 1.62× llama.cpp", table) == []
    assert stray_numbers("eager is 28.9 ms a token", table) == ["28.9 ms"]
    assert stray_numbers("3.40× faster", table) == ["3.40×"]


def test_minivllm_course_writes_a_student_copy(tmp_path):
    "`minivllm course --student DIR` (through the console script's main): every exercise blanked, the tests kept."
    import subprocess, sys
    dst = tmp_path / "class"
    r = subprocess.run([sys.executable, "-c", "import sys; from minivllm.serve.cli import main; sys.exit(main())",
                        "course", "--student", str(dst), "--nbs", str(NBS)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    total = 0
    for p in sorted(NBS.glob("*.ipynb")):
        src, copy = json.loads(p.read_text())["cells"], json.loads((dst / p.name).read_text())["cells"]
        for i, tests in exercises({"cells": src}):
            total += 1
            assert "raise NotImplementedError('hint: " in _src(copy[i]) or 'raise NotImplementedError("hint: ' in _src(copy[i])
            assert all(copy[j] == src[j] for j in tests), f"{p.name}: the tests of exercise {i} changed"
    assert total and f"{total} exercises" in r.stdout
    r = subprocess.run([sys.executable, "-c", "import sys; from minivllm.serve.cli import main; sys.exit(main())",
                        "course", "--student", str(dst), "--nbs", str(NBS)], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and "exists" in r.stderr


def test_student_copy_output_counts_todays_exercises():
    "16b's saved output (the student copy it writes) counts the exercises the notebooks have now."
    saved = re.findall(r"(\d+) exercises in (\d+) notebooks", (NBS / "16b_course.ipynb").read_text())
    per_nb = [len(exercises(json.loads(p.read_text()))) for p in NBS.glob("*.ipynb")]
    want = (sum(per_nb), sum(1 for n in per_nb if n))
    assert saved and all((int(a), int(b)) == want for a, b in saved), f"saved {saved}, now {want}: run .ci/execute on 16b"
