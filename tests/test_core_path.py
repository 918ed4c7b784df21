"The core lessons' code reads the same with every feature off: no LoRA, speculative, grammar, pooling or compile code."
import ast, inspect, re
from pathlib import Path
import minivllm
from minivllm.core.model import ModelRunner

PKG = Path(minivllm.__file__).parent / "core"  # the core path's modules
CORE_MODULES = ["request", "block_manager", "scheduler", "sampler", "engine_core"]
FEATURE_WORDS = re.compile(r"lora|spec_|speculat|draft|grammar|bitmask|structured|pooling|pooler|pooled"
                           r"|torch\.compile|compilation|CompiledModel|cudagraph|cuda_graph", re.I)
# vLLM's typed fields that carry a feature's data through the core (data, not code), and where they may appear
ALLOWED = {
    "request": {"lora_request", "lora_int_id", "pooling_params", "LoRARequest", "LoRA"},   # Request's vLLM fields
    "sampler": {"lora_request"},                                                            # BeamSearchSequence's
    "engine_core": {"pooling_output", "spec_decoding_stats"},                               # EngineCoreOutput's, SchedulerStats'
}


def feature_names(source: str, allowed=()) -> list[str]:
    "Identifiers, strings and comments of `source` that name a feature (the `allowed` identifiers removed first)."
    for name in sorted(allowed, key=len, reverse=True):
        source = re.sub(rf"\b{re.escape(name)}\b", "", source)
    return sorted({m.group(0) for m in FEATURE_WORDS.finditer(source)})


def runner_source() -> str:
    "The model runner's part of model.py: ModelRunner's class body and the functions patched onto it."
    src = inspect.getsource(ModelRunner)
    tree = ast.parse((PKG / "model.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.args.args and \
                ast.unparse(node.args.args[0].annotation or ast.Constant("")) == "ModelRunner":
            src += "\n" + ast.get_source_segment((PKG / "model.py").read_text(), node)
    return src


def test_core_modules_name_no_feature():
    for mod in CORE_MODULES:
        src = (PKG / f"{mod}.py").read_text()
        assert feature_names(src, ALLOWED.get(mod, ())) == [], mod


def test_runner_names_no_feature():
    src = runner_source()
    assert "def execute_model" in src and "def prepare_inputs" in src
    assert feature_names(src) == []


def test_the_check_catches_a_planted_lora_branch():
    "The check fails on the scheduler with a LoRA branch planted in `schedule()` (as it was before the extensions)."
    src = (PKG / "scheduler.py").read_text()
    anchor = "        if not all(e.can_admit(r, self.running) for e in self.extensions):\n"
    assert anchor in src
    planted = src.replace(anchor, "        if cfg.max_loras and r.lora_int_id not in loras:  # LoRA slots\n"
                                  "            break\n" + anchor)
    assert feature_names(src) == [] and feature_names(planted) != []
    assert "max_loras" in " ".join(feature_names(planted)) or feature_names(planted)


def test_every_feature_is_a_registered_extension():
    from minivllm.core.scheduler import STEP_EXTENSIONS, StepExtension, register_extension
    from minivllm.core.model import MODEL_RUNNERS
    assert {"lora_manager", "spec_decoder", "structured_outputs", "pooler", "prompt_logprobs"} <= set(STEP_EXTENSIONS)
    assert all(issubclass(c, StepExtension) and c.name == n for n, c in STEP_EXTENSIONS.items())
    # checked last first: the multi-process runners (TP, PP, torchrun's) win over compilation, compilation over 05a's
    # one-call decode steps; sequence classification's (09b) over those; load_format="dummy"'s runners (lesson 95;
    # refused with TP/PP) over all
    assert list(MODEL_RUNNERS) == ["CpuDecodeRunner", "CompiledModelRunner", "TPModelRunner", "PPModelRunner",
                                   "ExternalLauncherRunner", "ClassifierRunner", "DummyTPModelRunner"]
    old = STEP_EXTENSIONS["pooler"]      # a class defined again (a notebook re-running its lesson) changes nothing
    again = register_extension(type("PoolingExtension", (old,), {}))
    assert STEP_EXTENSIONS["pooler"] is old and again is not old and list(STEP_EXTENSIONS).count("pooler") == 1
