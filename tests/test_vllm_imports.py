"""vLLM's import surface: each `from vllm.X import Y` that vLLM 0.33.0's examples write, and each name its
`vllm/__init__.py` documents (the list is the data file `vllm_imports.tsv`), written `from minivllm.X import Y`.
Where minivllm has the thing the import works and gives the lessons' own object; where it does not, the import fails
with an `ImportError` that names what is missing."""
import importlib, subprocess, sys
from pathlib import Path
import pytest
import minivllm

ROWS = [tuple(l.rstrip("\n").split("\t")[:2]) for l in (Path(__file__).parent / "vllm_imports.tsv").read_text().splitlines()
        if l and not l.startswith("#")]

# (vLLM module, name) -> the lesson module:object it must be (everything minivllm has of vLLM's list)
HAVE = {
    **{("vllm", n): f"minivllm:{n}" for n in [
        "AsyncEngineArgs", "AsyncLLMEngine", "CompletionOutput", "EmbeddingOutput", "EmbeddingRequestOutput",
        "EngineArgs", "LLM", "LLMEngine", "PoolingOutput", "PoolingParams", "PoolingRequestOutput", "PromptType",
        "RequestOutput", "SamplingParams", "TextPrompt", "TokensPrompt", "__version__"]},
    ("vllm.config", "PoolerConfig"): "minivllm.core.pooling_params:PoolerConfig",
    ("vllm.config", "VllmConfig"): "minivllm.core.config:EngineConfig",
    ("vllm.config", "ProfilerConfig"): "minivllm.core.config:ProfilerConfig",
    ("vllm.distributed", "cleanup_dist_env_and_memory"): "minivllm.compat.vllm:cleanup_dist_env_and_memory",
    ("vllm.engine.arg_utils", "AsyncEngineArgs"): "minivllm.serve.async_engine:AsyncEngineArgs",
    ("vllm.engine.arg_utils", "EngineArgs"): "minivllm.core.arg_utils:EngineArgs",
    ("vllm.engine.async_llm_engine", "AsyncLLMEngine"): "minivllm.serve.async_engine:AsyncLLMEngine",
    ("vllm.engine.llm_engine", "LLMEngine"): "minivllm.core.llm_engine:LLMEngine",
    ("vllm.entrypoints.llm", "LLM"): "minivllm.core.llm:LLM",
    **{("vllm.inputs", n): f"minivllm.core.config:{n}" for n in ["PromptType", "TextPrompt", "TokensPrompt"]},
    ("vllm.logger", "init_logger"): "minivllm.compat.vllm:init_logger",
    ("vllm.model_executor.model_loader", "ShardedStateLoader"): "minivllm.compat.vllm:ShardedStateLoader",
    ("vllm.lora.request", "LoRARequest"): "minivllm.core.config:LoRARequest",
    **{("vllm.outputs", n): f"minivllm.core.config:{n}" for n in ["CompletionOutput", "RequestOutput"]},
    **{("vllm.outputs", n): f"minivllm.core.pooling_params:{n}" for n in [
        "EmbeddingOutput", "EmbeddingRequestOutput", "PoolingOutput", "PoolingRequestOutput"]},
    ("vllm.pooling_params", "PoolingParams"): "minivllm.core.pooling_params:PoolingParams",
    ("vllm.pooling_params", "LateChunkingParams"): "minivllm.core.pooling_params:LateChunkingParams",
    **{(m, n): f"minivllm.features.pooling:{n}" for m in ("vllm", "vllm.outputs")
       for n in ["ScoringOutput", "ScoringRequestOutput"]},
    **{("vllm.outputs", n): f"minivllm.features.pooling:{n}" for n in ["ClassificationOutput", "ClassificationRequestOutput"]},
    **{("vllm.sampling_params", n): f"minivllm.core.config:{n}" for n in [
        "RequestOutputKind", "SamplingParams", "StructuredOutputsParams"]},
    ("vllm.utils", "random_uuid"): "minivllm.compat.vllm:random_uuid",
    **{("vllm.utils.serial_utils", n): f"minivllm.features.pooling:{n}" for n in [
        "EMBED_DTYPES", "ENDIANNESS", "binary2tensor", "tensor2base64"]},
    ("vllm.utils.print_utils", "print_embeddings"): "minivllm.compat.vllm:print_embeddings",
    **{("vllm.entrypoints.pooling.utils", n): f"minivllm.features.pooling:{n}" for n in [
        "MetadataItem", "build_metadata_items", "decode_pooling_output"]},
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser"): "minivllm.serve.cli:FlexibleArgumentParser",
    ("vllm.v1.engine.async_llm", "AsyncLLM"): "minivllm.serve.async_engine:AsyncLLM",
    ("vllm.version", "__version__"): "minivllm:__version__",
    **{("vllm.benchmarks.datasets", n): f"minivllm.benchmarks:{n}" for n in ["add_dataset_parser", "get_samples"]},
    ("vllm.entrypoints.launchers.launcher", "serve_http"): "minivllm.compat.vllm:serve_http",
    ("vllm.entrypoints.serve.utils.api_utils", "with_cancellation"): "minivllm.compat.vllm:with_cancellation",
    ("vllm.usage.usage_lib", "UsageContext"): "minivllm.compat.vllm:UsageContext",
    ("vllm.utils.system_utils", "set_ulimit"): "minivllm.compat.vllm:set_ulimit",
    **{("vllm.v1.sample.logits_processor", n): f"minivllm.features.logits_processors:{n}" for n in [
        "AdapterLogitsProcessor", "BatchUpdate", "LogitsProcessor", "RequestLogitsProcessor"]},
    ("vllm.v1.sample.logits_processor.builtin", "process_dict_updates"): "minivllm.features.logits_processors:process_dict_updates",
    **{("vllm.v1.worker.gpu.sample.logits_processor", n): f"minivllm.features.logits_processors:{m}" for n, m in [
        ("LogitsProcessor", "SlotLogitsProcessor"), ("LogitsContext", "LogitsContext"),
        ("LogitsProcRequestState", "LogitsProcRequestState")]},
    ("vllm.utils.torch_utils", "async_tensor_h2d"): "minivllm.compat.vllm:async_tensor_h2d",
    ("vllm.utils.gpu_sync_debug", "gpu_sync_allowed"): "minivllm.compat.vllm:gpu_sync_allowed",
    ("vllm.tokenizers", "cached_tokenizer_from_config"): "minivllm.compat.vllm:cached_tokenizer_from_config",
    ("vllm.platforms", "current_platform"): "minivllm.compat.vllm:current_platform",
    ("vllm.utils.network_utils", "get_open_port"): "minivllm.compat.vllm:get_open_port",
    **{("vllm.v1.metrics.reader", n): f"minivllm.core.metrics:{n}" for n in ["Counter", "Gauge", "Histogram", "Vector"]},
}


def minivllm_path(vllm_module: str) -> str:
    return "minivllm" + vllm_module[len("vllm"):]


def test_the_list():
    "The data file is vLLM's list, whole: its examples' imports and its documented names."
    assert len(ROWS) == len(set(ROWS)) >= 140
    assert ("vllm.lora.request", "LoRARequest") in ROWS and ("vllm", "ModelRegistry") in ROWS
    assert set(HAVE) <= set(ROWS)


@pytest.mark.parametrize("module,name", sorted(HAVE))
def test_what_minivllm_has_imports(module, name):
    ns = {}
    exec(f"from {minivllm_path(module)} import {name}", ns)
    where, attr = HAVE[(module, name)].split(":")
    assert ns[name] is getattr(importlib.import_module(where), attr)


@pytest.mark.parametrize("module,name", sorted(set(ROWS) - set(HAVE)))
def test_what_minivllm_lacks_is_refused_by_name(module, name):
    path = minivllm_path(module)
    with pytest.raises(ImportError) as e:
        exec(f"from {path} import {name}", {})
    missing_module = isinstance(e.value, ModuleNotFoundError) and path.startswith(e.value.name or "?")
    assert name in str(e.value) or (missing_module and e.value.name in str(e.value)), str(e.value)


def test_thin_modules_say_what_they_have():
    with pytest.raises(ImportError, match=r"no 'get_metrics_snapshot'.*vLLM's get_metrics_snapshot.*It has: Metric, Counter"):
        from minivllm.v1.metrics.reader import get_metrics_snapshot  # noqa: F401
    import minivllm.outputs
    assert "RequestOutput" in minivllm.outputs.__all__ and not hasattr(minivllm.outputs, "_private")


def test_fresh_interpreter():
    "The paths resolve in a new process whatever is imported first (the package's __init__ registers them)."
    code = ("from minivllm.utils.argparse_utils import FlexibleArgumentParser as F; import minivllm.lora.request as r; "
            "from minivllm.v1.engine.async_llm import AsyncLLM; from minivllm.serve.cli import FlexibleArgumentParser; "
            "import minivllm; print(F is FlexibleArgumentParser, r.LoRARequest is minivllm.LoRARequest, "
            "AsyncLLM is minivllm.AsyncLLM)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["True"] * 3, r.stderr
