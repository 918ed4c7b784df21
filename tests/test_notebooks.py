"""Every notebook's cells are unit tests: run each one as `nbdev_test` does (nbdev's `test_nb`, in a process of its
own), so that one pytest summary counts them with the end-to-end tests. Cells flagged `#| slow` or `#| gpu` are
skipped unless MINIVLLM_NB_FLAGS names the flags (e.g. MINIVLLM_NB_FLAGS="slow").

Each notebook's process is forked from one that has imported the libraries every notebook imports (torch,
transformers, matplotlib, IPython, nbdev: about 4 s a notebook otherwise); minivllm itself is imported by the
notebook, as in `nbdev_test`, and so is Triton (it reads `TRITON_INTERPRET` when imported, and the lessons that
run its kernels without a GPU set that first)."""
import multiprocessing, os, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (ROOT / "nbs").glob("*.ipynb"))
PRELOAD = ["torch", "numpy", "transformers", "transformers.models.auto.modeling_auto",
           "transformers.models.auto.tokenization_auto", "tokenizers", "safetensors", "pydantic", "fastapi",
           "matplotlib.pyplot", "IPython", "execnb.shell", "nbdev.test"]


def _run_notebook(path: str, flags: str, log: str):
    "In the forked process: nbdev_test's own call for one notebook, its prints and errors into `log`."
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1); os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1); sys.stderr = os.fdopen(2, "w", buffering=1)
    os.chdir(ROOT)
    from nbdev.config import get_config
    from nbdev.test import test_nb
    from fastcore.xtras import working_directory
    cfg = get_config()
    with working_directory(cfg.nbs_path):
        ok, _ = test_nb(Path(path), skip_flags=cfg.tst_flags.split(), force_flags=flags.split(), do_print=True,
                        basepath=cfg.config_path)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0 if ok else 1)


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook(nb, forkserver, tmp_path):
    log = tmp_path / "nbdev_test.log"
    p = forkserver.Process(target=_run_notebook, args=(str(ROOT / "nbs" / nb),
                                                       os.environ.get("MINIVLLM_NB_FLAGS", ""), str(log)))
    p.start(); p.join(1500)
    if p.exitcode is None: p.kill(); p.join()
    out = log.read_text(errors="replace") if log.exists() else ""
    assert p.exitcode == 0, f"{nb} failed (exit code {p.exitcode}):\n{out[-12000:]}"


# The saved-notebook checker run by .ci/test (.ci/check_notebooks.py): shown to fail on each defect it is for.
import importlib.util, json as _json
_spec = importlib.util.spec_from_file_location("check_notebooks", ROOT / ".ci" / "check_notebooks.py")
check_notebooks = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(check_notebooks)


def _nb(tmp_path, cells, name="05_lesson.ipynb"):
    def cell(src, outputs=None):
        if src.startswith("md:"): return {"cell_type": "markdown", "metadata": {}, "source": src[3:]}
        return {"cell_type": "code", "metadata": {}, "source": src, "outputs": outputs or [], "execution_count": None}
    p = tmp_path / name
    p.write_text(_json.dumps({"cells": [cell(*c) if isinstance(c, tuple) else cell(c) for c in cells], "metadata": {},
                              "nbformat": 4, "nbformat_minor": 5}))
    return p


PNG = {"output_type": "display_data", "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "metadata": {}}
VIEWER = {"output_type": "display_data", "data": {"text/html": '<div class="step-viewer">', "text/plain": "StepViewer"}, "metadata": {}}
TEXT = lambda t: {"output_type": "stream", "name": "stdout", "text": t}


def test_checker_accepts_a_good_lesson(tmp_path):
    p = _nb(tmp_path, ["#| export\ndef f(): pass", ("x = 1\nx", [TEXT("1")]), "md:## Picture",
                       ("plot_block_grid(kv);", [PNG]), ("StepViewer(recs)", [VIEWER])])
    assert check_notebooks.check(p) == []


@pytest.mark.parametrize("cells,expected", [
    (["x = 1", "plot_step(recs, 0)"], "saved with no outputs at all"),
    ([("x", [TEXT("1")]), "plt.plot([1, 2]);", ("StepViewer(r)", [VIEWER])], "draws but has no stored picture"),
    ([("1/0", [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "", "traceback": []}]), ("StepViewer(r)", [VIEWER])], "error output"),
    ([("load()", [TEXT("Loading weights: 100%|██████████| 272/272 [00:00<00:00, 13522.96it/s]")]), ("StepViewer(r)", [VIEWER])], "progress bar"),
    ([("serve()", [TEXT("INFO:     Started server process [1234]\n")]), ("StepViewer(r)", [VIEWER])], "log line"),
    ([("StepViewer(r)", [VIEWER]), ("x", [TEXT("1")]), ("y", [TEXT("2")]), ("z", [TEXT("3")])], "does not end with a picture"),
    ([("x", [TEXT("1")]), ("plot_block_grid(kv);", [PNG])], "no step widget"),
])
def test_checker_fails_on_each_defect(tmp_path, cells, expected):
    problems = check_notebooks.check(_nb(tmp_path, cells))
    assert any(expected in p for p in problems), problems


def test_checker_ignores_definitions_and_skipped_cells(tmp_path):
    "Defining a drawing function draws nothing; a `#| gpu` cell that nbdev_test skips may stay unrun."
    p = _nb(tmp_path, [("def show(): plt.plot([1])", []), ("#| gpu\nplot_bandwidth()", []), ("StepViewer(r)", [VIEWER])])
    assert check_notebooks.check(p) == []
