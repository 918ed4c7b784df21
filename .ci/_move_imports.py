#!/usr/bin/env python3
"""Rewrite the imports of the names issue #42 moves out of `minivllm.core.config`.

    python3 .ci/_move_imports.py [--dry-run] [ROOT]

The names are in MOVES, each with its new module. The script rewrites every
`from minivllm.core.config import ...` statement (one line, or in parentheses) that imports a moved
name: the names that stay keep their statement, the moved ones get one statement per new module, at
the same place and indentation. It reads the code cells of nbs/*.ipynb (the JSON is rewritten only
where a cell changed; cell ids and everything else are kept), tests/*.py and .ci/*.py. It does not
touch minivllm/: nbdev_export writes that from the notebooks. It also rewrites the
"minivllm.core.config:Name" strings of tests/test_vllm_imports.py (where vLLM's names live).

Idempotent: a second run changes nothing. Before writing, it checks that each new module exists
and defines the names MOVES sends it (so it cannot point an import at a missing name); --dry-run
skips that check and only prints what it would change. It prints, for each file, how many import
statements it rewrote, and lists what it cannot rewrite by itself (an import with a comment inside
it, `import minivllm.core.config`, an attribute `minivllm.core.config.X`).
"""

import ast
import json
import re
import sys
from pathlib import Path

OLD = "minivllm.core.config"
_MODULES = {
    "minivllm.core.pooling_params": """POOLING_TYPES POOLING_TASKS PoolerConfig _REMOVED_TASKS
        resolve_pooler_config pooler_settings LateChunkingParams PoolingParams _fold_names
        _check_values _refuse_unimplemented clone verify LateChunk LateChunkingMetadata
        PoolingOutput EmbeddingOutput PoolingRequestOutput EmbeddingRequestOutput""",
    "minivllm.core.model_files": """EMBEDDED_GGUF embedded_gguf_path cache_dir
        _gguf_metadata_files _gguf_float_weights convert_gguf _HUB_ID _HUB_FILES _hub_offline
        hub_snapshot resolve_model""",
    "minivllm.core.arg_utils": """_CPU_KV_CACHE_BYTES _BACKENDS _QUANTIZATIONS _LOAD_FORMATS
        _MAX_NUM_SEQS _check_weights_format _ModelArgs _RunArgs _EngineArgsFields EXTRA_ARGS
        register_extra_args check_extra_args EngineArgs _check_parallel _parallel_config
        _check_sizes _check_lora _check_load_format _attention_backend _check
        resolve_logits_processors _check_logits_processors tokenize_bad_words
        update_from_tokenizer bad_words_token_ids cpu_has_bf16 _dtype_and_quantization
        apply_hf_overrides _model_paths _model_facts _model_config _feature_configs _check_heads
        _token_budget _step_configs create_engine_config _CAPTURE_SIZES _asked_compilation
        _not_compiled _compile_level _compilation add_cli_args _none_or_str json_or_str
        from_cli_args engine_args_from_kwargs""",
}
MOVES = {name: mod for mod, names in _MODULES.items() for name in names.split()}

_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+" + re.escape(OLD) + r"[ \t]+import[ \t]+"
    r"(?P<names>\([^)]*\)|[^\n]*)",
    re.M,
)
_WIDTH = 100


def _statement(indent: str, module: str, names: list[str]) -> str:
    "One `from module import ...` statement, on one line when it fits, else one name a line."
    line = f"{indent}from {module} import {', '.join(names)}"
    if len(line) <= _WIDTH:
        return line
    inner = "".join(f"{indent}    {n},\n" for n in names)
    return f"{indent}from {module} import (\n{inner}{indent})"


def rewrite(src: str, where: str, manual: list[str]) -> tuple[str, int]:
    "`src` with its imports of moved names rewritten, and how many statements changed."
    count = 0

    def one(m: re.Match) -> str:
        nonlocal count
        indent, names = m["indent"], m["names"]
        if "#" in names:  # a comment inside: placed by hand
            if any(re.search(rf"\b{re.escape(n)}\b", names) for n in MOVES):
                manual.append(f"{where}: an import with a comment in it: {m[0].strip()[:80]}")
            return m[0]
        body = names.strip().removeprefix("(").removesuffix(")")
        items = [i.strip() for i in body.replace("\\\n", " ").split(",") if i.strip()]
        if not any(i.split()[0] in MOVES for i in items):
            return m[0]
        groups: dict[str, list[str]] = {}
        for i in items:
            groups.setdefault(MOVES.get(i.split()[0], OLD), []).append(i)
        count += 1
        return "\n".join(_statement(indent, mod, ns) for mod, ns in groups.items())

    out = _IMPORT.sub(one, src)
    for m in re.finditer(rf"^\s*import {re.escape(OLD)}\b.*|\b{re.escape(OLD)}\.(\w+)", out, re.M):
        if m[1] is None or m[1] in MOVES:
            manual.append(f"{where}: {m[0].strip()[:80]}")
    if f"{OLD}:{{" in out:  # a location built from a name: "minivllm.core.config:{n}"
        manual.append(f"{where}: a location string built from a name ({OLD}:{{...}})")
    return out, count


def rewrite_locations(src: str) -> tuple[str, int]:
    "The 'minivllm.core.config:Name' strings of a moved name, pointed at its new module."
    pat = re.compile(r'"' + re.escape(OLD) + r':(\w+)"')
    n = len([m for m in pat.finditer(src) if m[1] in MOVES])
    return pat.sub(lambda m: f'"{MOVES.get(m[1], OLD)}:{m[1]}"', src), n


def _cell_lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _notebook(path: Path, manual: list[str]) -> tuple[str | None, int]:
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    total = 0
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell["source"])
        new, n = rewrite(src, f"{path.name} cell {cell.get('id')}", manual)
        if n:
            cell["source"], total = _cell_lines(new), total + n
    if not total:
        return None, 0
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n", total


def _defined(path: Path) -> set[str]:
    "The names a module defines at its top level (assignments, defs, classes, imports)."
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def check_targets(root: Path) -> list[str]:
    "What is missing: a new module, or a name MOVES sends to a module that does not define it."
    bad = []
    for mod, names in _MODULES.items():
        f = root / (mod.replace(".", "/") + ".py")
        if not f.exists():
            bad.append(f"{f.relative_to(root)} does not exist")
            continue
        have = _defined(f)
        bad += [f"{mod} does not define {n}" for n in names.split() if n not in have]
    return bad


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    args = [a for a in argv if a != "--dry-run"]
    root = Path(args[0] if args else Path(__file__).resolve().parent.parent)
    if not dry and (bad := check_targets(root)):
        print("not rewritten (export the new modules first):", *bad, sep="\n  ")
        return 1
    manual: list[str] = []
    changed = 0
    files = sorted((root / "nbs").glob("*.ipynb"))
    files += sorted((root / "tests").glob("*.py")) + sorted((root / ".ci").glob("*.py"))
    for path in files:
        if path.name == Path(__file__).name:
            continue
        if path.suffix == ".ipynb":
            new, n = _notebook(path, manual)
        else:
            src = path.read_text(encoding="utf-8")
            new, n = rewrite(src, path.name, manual)
            if path.name == "test_vllm_imports.py":
                new, k = rewrite_locations(new)
                n += k
            new = new if n else None
        if new is not None:
            changed += 1
            print(f"{path.relative_to(root)}: {n} rewritten")
            if not dry:
                path.write_text(new, encoding="utf-8")
    print(f"{changed} files {'to change' if dry else 'changed'}")
    for m in manual:
        print("by hand:", m)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
