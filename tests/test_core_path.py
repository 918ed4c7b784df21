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
    from minivllm.core.scheduler import STEP_EXTENSIONS, StepExtension, by_priority, register_extension
    from minivllm.core.model import MODEL_RUNNERS
    assert {"lora_manager", "spec_decoder", "structured_outputs", "pooler", "prompt_logprobs"} <= set(STEP_EXTENSIONS)
    assert all(issubclass(c, StepExtension) and c.name == n and isinstance(p, int) for n, (p, c) in STEP_EXTENSIONS.items())
    # by priority: load_format="dummy"'s runners (lesson 95; refused with TP/PP) over all; sequence classification's
    # (09b) over the multi-process runners (torchrun's, PP, TP); those over compilation, compilation over 05a's
    # one-call decode steps
    assert [c.__name__ for c in by_priority(MODEL_RUNNERS)] == [
        "DummyTPModelRunner", "ClassifierRunner", "ExternalLauncherRunner", "PPModelRunner", "TPModelRunner",
        "CompiledModelRunner", "CpuDecodeRunner"]
    names = [c.name for c in by_priority(STEP_EXTENSIONS)]   # the order their hooks are called in
    assert names.index("structured_outputs") < names.index("logits_processors")  # the grammar's mask first
    old = STEP_EXTENSIONS["pooler"]      # a class defined again (a notebook re-running its lesson) replaces it
    try:
        again = register_extension(priority=old[0])(type("PoolingExtension", (old[1],), {}))
        assert STEP_EXTENSIONS["pooler"] == (old[0], again) and list(STEP_EXTENSIONS).count("pooler") == 1
    finally:
        STEP_EXTENSIONS["pooler"] = old


def test_selection_by_priority_not_registration_order():
    from minivllm.core.scheduler import STEP_EXTENSIONS, by_priority
    from minivllm.core.model import MODEL_RUNNERS, ModelRunner, model_runner_class
    for reg in (MODEL_RUNNERS, STEP_EXTENSIONS):    # the package's registries, registered in the other order
        assert by_priority(dict(reversed(reg.items()))) == by_priority(reg)
    big = type("BigRunner", (ModelRunner,), {"enabled": classmethod(lambda cls, config: config == "big")})
    small = type("SmallRunner", (ModelRunner,), {"enabled": classmethod(lambda cls, config: True)})
    saved = dict(MODEL_RUNNERS)
    try:
        for order in ((big, small), (small, big)):
            MODEL_RUNNERS.clear()
            for cls in order:
                MODEL_RUNNERS[cls.__name__] = (2 if cls is big else 1, cls)
            assert (model_runner_class("big"), model_runner_class("small")) == (big, small)
        MODEL_RUNNERS["BigRunner"] = (0, big)           # registered again: replaced, and now below SmallRunner
        assert model_runner_class("big") is small and len(MODEL_RUNNERS) == 2
        MODEL_RUNNERS["SmallRunner"] = (0, small)       # a tie: by name
        assert model_runner_class("big") is big
    finally:
        MODEL_RUNNERS.clear()
        MODEL_RUNNERS.update(saved)
