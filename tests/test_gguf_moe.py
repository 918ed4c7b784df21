"""MoE GGUF files (lesson 07d): tiny random Qwen2-MoE, Qwen3-MoE and Mixtral models written as llama.cpp writes them
(3-D expert tensors, float32 router; Q8_0 and Q4_0 blocks; Mixtral as `llama`; tests/gguf_files.py) run with
`quantization="gguf"` from the file's blocks, through qgemm.c where it runs and through PyTorch's int4/int8 kernels
(forced here); greedy tokens equal HF transformers' on the weights each path multiplies by (what the `gguf` package
de-quantizes the file to; on the PyTorch path Q8_0 is held as per-row int8, lesson 04b's `Int8Linear`), logprobs
within 1e-3 (Mixtral on the blocks' path only: the other path's modules are those the Qwen families test). An MoE GGUF
file of an architecture no MoE loader is registered for is refused by name."""
import os
import pytest, torch
from minivllm import LLM, SamplingParams
from minivllm.core.model_files import cache_dir, resolve_model
from minivllm.core.model import make_tiny_checkpoint
from minivllm.kernels import model_kernels, quantization
from minivllm.kernels.model_kernels import load_gguf_model
from minivllm.kernels.quantization import Int8Linear
from minivllm.models.moe import ModuleExperts, SparseMoeBlock
from gguf_files import write_moe_gguf

pytestmark = pytest.mark.xdist_group("gguf_moe")
MOE = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=16, intermediate_size=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=64, initializer_range=0.2)
FAMILIES = {  # model type: (extra config, the other matrices' block type, the experts')
    "qwen2_moe": ({}, "Q8_0", "Q4_0"),                       # shared expert, q/k/v biases, raw top-k weights
    "qwen3_moe": (dict(norm_topk_prob=True), "Q4_0", "Q8_0"),  # q/k norms, renormalised (llama.cpp's Qwen3-MoE)
    "mixtral": (dict(num_local_experts=4, intermediate_size=32), "Q8_0", "Q4_0"),  # `llama`: q/k rows permuted
}
CASES = [(f, p) for f in FAMILIES for p in ("blocks", "torch") if (f, p) != ("mixtral", "torch")]
KERNELS = {"Q4_0": "Int4Linear", "Q8_0": "Int8Linear"}  # the PyTorch path's module of each block type
PROMPTS = [[1, 504, 3458, 282], [1, 1206, 16, 2072, 28, 30, 31, 32, 33, 34, 35, 36, 37]]
ARGS = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=32, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def family(request, tmp_path_factory):
    """(GGUF file, HF model, `{HF name: (block type, de-quantized weight)}`, experts' block type) of one family;
    a converted-checkpoint cache of its own (the compiled kernels shared with the usual one)."""
    d = tmp_path_factory.mktemp(request.param)
    kw, kind, expert_kind = FAMILIES[request.param]
    hf = make_tiny_checkpoint(d / "hf", request.param, seed=1, tokenizer_from=resolve_model(None), **{**MOE, **kw})
    weights = write_moe_gguf(d / "tiny.gguf", hf, kind, expert_kind)
    (d / "cache").mkdir()
    os.symlink(cache_dir() / "kernels", d / "cache" / "kernels")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIVLLM_CACHE", str(d / "cache"))
        yield d / "tiny.gguf", hf, weights, expert_kind


def held(name: str, kind: str, w: torch.Tensor, path: str) -> torch.Tensor:
    "What a path multiplies by: the file's values; the PyTorch path's Q8_0 matrices as per-row int8 of them."
    if path == "blocks" or kind != "Q8_0" or name == "model.embed_tokens.weight":  # (the table: floats)
        return w
    lin = Int8Linear(w.reshape(-1, w.shape[-1]), torch.float32)
    return (lin.weight.float() * lin.scales[:, None]).reshape(w.shape)


@pytest.mark.parametrize("family,path", CASES, indirect=["family"])
def test_moe_gguf_runs_from_its_blocks(family, path, monkeypatch):
    gguf_file, hf, weights, expert_kind = family
    if path == "torch":   # the path of a CPU without AVX-512: PyTorch's int4/int8 kernels
        for m in (model_kernels, quantization):
            monkeypatch.setattr(m, "blocks_supported", lambda device, dtype: False)
    elif not quantization.blocks_supported("cpu", torch.float32):
        pytest.skip("qgemm.c needs a CPU with AVX-512 (this one has none)")
    hf.load_state_dict({n: held(n, k, w, path) for n, (k, w) in weights.items()})
    llm = LLM(model=str(gguf_file), quantization="gguf", **ARGS)
    model = llm.llm_engine.engine_core.model_runner.model
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2 and all(isinstance(b.experts, ModuleExperts) for b in blocks)
    kinds = {type(m).__name__ for b in blocks for m in b.experts.modules()} - {"ModuleExperts", "ModuleList"}
    assert kinds == {"BlockLinear" if path == "blocks" else KERNELS[expert_kind]}, kinds  # never floats
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=0, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)):
        tokens = out.outputs[0].token_ids
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
        ref = torch.log_softmax(logits, -1)
        assert ref.argmax(-1).tolist() == tokens    # transformers' greedy choice at every step is ours
        got = torch.tensor([lp[t].logprob for t, lp in zip(tokens, out.outputs[0].logprobs)])
        assert torch.allclose(got, ref[torch.arange(len(tokens)), tokens], atol=1e-3), (got, ref.max(-1).values)


def test_moe_gguf_of_other_arch_is_refused_by_name(tmp_path, monkeypatch):
    "No MoE loader for DeepSeek's `deepseek2`; nor for a `llama` file with experts (Mixtral) where none is registered."
    hf = make_tiny_checkpoint(tmp_path / "hf", "qwen3_moe", **{**MOE, "vocab_size": 256})
    write_moe_gguf(tmp_path / "deepseek2.gguf", hf, arch="deepseek2")
    with pytest.raises(NotImplementedError, match="'deepseek2'"):
        load_gguf_model(tmp_path / "deepseek2.gguf", hf.config, torch.float32)
    monkeypatch.delitem(model_kernels.GGUF_MOE_BLOCKS, "mixtral")
    write_moe_gguf(tmp_path / "llama.gguf", hf, arch="llama")
    with pytest.raises(NotImplementedError, match="'mixtral' \\(architecture 'llama'\\)"):
        load_gguf_model(tmp_path / "llama.gguf", hf.config, torch.float32)


@pytest.mark.parametrize("family", ["mixtral"], indirect=True)
def test_mixtral_gguf_float_engine_is_refused_and_gguf_caches_no_floats(family):
    """Without `quantization="gguf"` a Mixtral file would be de-quantized by transformers, which reads it as a dense
    Llama and drops its experts: refused by name. With it, the converted cache holds the config and tokenizer only."""
    gguf_file = family[0]
    with pytest.raises(ValueError, match="quantization='gguf'"):
        LLM(model=str(gguf_file), **ARGS)
    d = resolve_model(str(gguf_file), weights=False)
    assert (d / "config.json").exists() and (d / "tokenizer.json").exists()
    assert not (d / "model.safetensors").exists()    # no float32 copy of the weights
