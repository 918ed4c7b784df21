"""GGUF files of K-quants run as their blocks (lessons 04b, 05a): Q4_K_M, Q5_K_M and Q6_K files of a tiny random llama
(written by tests/gguf_files.py: its tokenizer is SmolLM2's) load with `quantization="gguf"` into `BlockLinear`s holding
the file's bytes, and give the logits of the float model that transformers builds from the same file (de-quantized by
the `gguf` package, llama.cpp's own de-quantization) within float32 rounding, with the same greedy tokens."""
import os
import pytest, torch
from minivllm import LLM, SamplingParams
from minivllm.core.model_files import cache_dir, convert_gguf, resolve_model
from minivllm.core.model import make_tiny_checkpoint
from minivllm.kernels.quantization import BlockLinear, blocks_supported
from gguf_files import write_llama_gguf

pytestmark = [pytest.mark.skipif(not blocks_supported("cpu", torch.float32),
                                 reason="qgemm.c needs a CPU with AVX-512 (this one has none)"),
              pytest.mark.xdist_group("gguf_kquants")]  # one worker builds the tiny checkpoint once
PROMPTS = [[1, 504, 3458, 282], [1, 1206, 16, 2072, 28, 30, 31, 32, 33, 34, 35, 36, 37]]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_hf")
    make_tiny_checkpoint(d, "llama", tokenizer_from=resolve_model(None), vocab_size=49152, hidden_size=256,
                         intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    return d


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    "A cache of converted checkpoints of this test's own (the compiled kernels shared with the usual one)."
    (tmp_path / "cache").mkdir()
    os.symlink(cache_dir() / "kernels", tmp_path / "cache" / "kernels")
    monkeypatch.setenv("MINIVLLM_CACHE", str(tmp_path / "cache"))


def run(llm):
    sp = SamplingParams(max_tokens=12, temperature=0, logprobs=5, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q5_K_M", "Q6_K"])
def test_k_quant_file_runs_as_blocks(mix, tiny_hf, tmp_path, own_cache):
    path = write_llama_gguf(tmp_path / f"tiny-{mix}.gguf", tiny_hf, mix)
    common = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=32, enable_prefix_caching=False)
    q = LLM(model=str(path), quantization="gguf", **common)
    model = q.llm_engine.engine_core.model_runner.model
    kinds = {m.kind for m in model.modules() if isinstance(m, BlockLinear)}
    assert kinds == ({"Q4_K", "Q6_K"} if mix == "Q4_K_M" else {"Q5_K", "Q6_K"} if mix == "Q5_K_M" else {"Q6_K"}), kinds
    assert not [n for n, m in model.named_modules() if type(m).__name__ == "Linear"]   # nothing de-quantized
    got = run(q)
    ref = run(LLM(model=str(convert_gguf(path)), **common))        # the gguf package's de-quantization, as floats
    for a, b in zip(got, ref):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            common_ids = set(la) & set(lb)
            assert len(common_ids) >= 4
            assert max(abs(la[t].logprob - lb[t].logprob) for t in common_ids) < 1e-3


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_gguf_runs_as_blocks(model_type, tmp_path, own_cache):
    "Qwen2 (q/k/v biases) and Qwen3 (q/k norms) GGUF files: their rows as the file has them (not reordered as llama's)."
    hf = tmp_path / "hf"
    # (head_dim 128 for qwen3: transformers' GGUF reader takes Qwen3's default head_dim, not the file's)
    make_tiny_checkpoint(hf, model_type, tokenizer_from=resolve_model(None), vocab_size=49152, hidden_size=256,
                         intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=128 if model_type == "qwen3" else 64)
    path = write_llama_gguf(tmp_path / f"tiny-{model_type}.gguf", hf, "Q4_K_M")
    common = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=32, enable_prefix_caching=False)
    q = LLM(model=str(path), quantization="gguf", **common)
    model = q.llm_engine.engine_core.model_runner.model
    assert {m.kind for m in model.modules() if isinstance(m, BlockLinear)} == {"Q4_K", "Q6_K"}
    got, ref = run(q), run(LLM(model=str(convert_gguf(path)), **common))
    for a, b in zip(got, ref):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la, lb = a.outputs[0].logprobs[0], b.outputs[0].logprobs[0]
        assert max(abs(la[t].logprob - lb[t].logprob) for t in set(la) & set(lb)) < 1e-3
