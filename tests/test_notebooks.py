"""Every notebook's cells are unit tests: run each one with `nbdev_test` (in its own process), so that one pytest
summary counts them with the end-to-end tests. Cells flagged `#| slow` or `#| gpu` are skipped unless
MINIVLLM_NB_FLAGS names the flags (e.g. MINIVLLM_NB_FLAGS="slow")."""
import os, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (ROOT / "nbs").glob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook(nb):
    cmd = ["nbdev_test", "--path", str(ROOT / "nbs" / nb), "--do_print"]
    if os.environ.get("MINIVLLM_NB_FLAGS"): cmd += ["--flags", os.environ["MINIVLLM_NB_FLAGS"]]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1500)
    assert r.returncode == 0, f"{nb} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
