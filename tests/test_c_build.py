"The C sources are files of the package, shipped as package data, built by `build_c_library` with errors that name the file."
import configparser, importlib.resources, shutil
from pathlib import Path

import pytest

from minivllm.kernels.gemm import build_c_library, c_source

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("decode", "gemm", "glue")
needs_cc = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this machine")


@pytest.mark.parametrize("name", SOURCES)
def test_sources_are_package_files(name):
    p = c_source(name)
    assert p == Path(str(importlib.resources.files("minivllm") / "csrc" / f"{name}.c"))
    text = p.read_text()
    assert max(len(l) for l in text.splitlines()) <= 100  # shown in the lessons without sideways scrolling


def test_sources_ship_in_wheel_and_sdist():
    cfg = configparser.ConfigParser(delimiters=["="])
    cfg.read(ROOT / "settings.ini")
    assert "csrc/*.c" in cfg["DEFAULT"]["package_data"].split()  # setup.py → package_data (wheel)
    assert "recursive-include minivllm/csrc *.c" in (ROOT / "MANIFEST.in").read_text()  # sdist


@needs_cc
def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    lines = c_source("glue").read_text().splitlines()
    n = next(i for i, l in enumerate(lines) if l.startswith("void silu_and_mul(")) + 2
    lines[n] = "    this is not C;"
    bad = tmp_path / "broken_glue.c"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(RuntimeError) as e:
        build_c_library(bad, ("-DBF16=0",))
    assert f"{bad}:{n + 1}:" in str(e.value)


@needs_cc
def test_build_caches_by_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "glue_copy.c"
    src.write_text(c_source("glue").read_text())
    lib = build_c_library(src, ("-DBF16=0",))
    assert hasattr(lib, "rms_norm")
    built = sorted((tmp_path / "cache" / "kernels").glob("glue_copy-*.so"))
    assert len(built) == 1
    build_c_library(src, ("-DBF16=0",), ("-DUNUSED=1",))  # other flags: another library
    src.write_text(src.read_text() + "/* changed */\n")
    build_c_library.cache_clear()
    build_c_library(src, ("-DBF16=0",))  # another source: another library
    assert len(list((tmp_path / "cache" / "kernels").glob("glue_copy-*.so"))) == 3
