"""The GPU paths, run for real on a CUDA device: the Triton kernels compiled (not interpreted) against the torch
references, the engine on CUDA against HF transformers on the same weights, the compiled model with CUDA graphs
against the eager engine, LoRA's Triton kernels, PyTorch's CUDA int4 kernel on GGUF blocks, speculative decoding and
structured outputs. CI's machines have no GPU, so every test here is skipped there (with that reason); the CPU tests
cover the same logic (the kernels through Triton's interpreter, the compiled path with Inductor's C++ backend).
Tokenizer: MINIVLLM_TOKENIZER_DIR (a directory with tokenizer.json) or the embedded model's. Engines made one after
another in one process keep some GPU memory (compiled graphs hold their model), so only the first tests size the KV
cache by profiling; the later ones fix it (`num_gpu_blocks_override`)."""
import dataclasses, os
import pytest, torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI's machines have none)")
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def tokenizer_dir():
    from minivllm.core.model_files import resolve_model
    return os.environ.get("MINIVLLM_TOKENIZER_DIR") or resolve_model(None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer_dir):
    "A tiny random Llama (GQA 2:1) with the real tokenizer's vocabulary, and its HF model on the GPU."
    from minivllm.core.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny_gpu")
    hf = make_tiny_checkpoint(d, "llama", tokenizer_from=tokenizer_dir, vocab_size=49152, num_hidden_layers=3)
    return str(d), hf.to(CUDA)


PROMPTS = [list(range(1000 + 7 * i, 1000 + 7 * i + n)) for i, n in enumerate((3, 17, 40, 90, 130))]


def generate(llm, prompts=PROMPTS, n=16, **kw):
    from minivllm import SamplingParams, TokensPrompt
    sp = SamplingParams(temperature=0, max_tokens=n, logprobs=5, ignore_eos=True, **kw)
    return [o.outputs[0] for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)]


def assert_close_greedy(a, b, atol=1e-3):
    """Same tokens with logprobs within `atol` (where two runs differ only by summation order, a near-tie may flip: then the
    two tokens must be each other's runner-up, and the comparison stops there, as vLLM's `check_logprobs_close` does)."""
    for x, y in zip(a, b):
        for i, (tx, ty) in enumerate(zip(x.token_ids, y.token_ids)):
            if tx != ty:
                assert ty in x.logprobs[i] and tx in y.logprobs[i], (i, x.token_ids, y.token_ids)
                break
            assert abs(x.logprobs[i][tx].logprob - y.logprobs[i][ty].logprob) < atol, (i, x.logprobs[i][tx], y.logprobs[i][ty])


# --- the Triton kernels, compiled for the GPU -------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("block_size", [16, 32])
def test_triton_paged_attention_matches_reference(dtype, tol, block_size):
    "Decodes (short and long: split-K) and prefill chunks with cached context, GQA 4:1, shuffled blocks."
    from minivllm.core.attention import make_paged_case
    from minivllm.kernels.attention_kernels import triton_paged_attention
    seq_lens, query_lens = [1, 37, 700, 3000, 50, 300], [1, 1, 1, 1, 50, 120]
    q, k, v, kv, md, exp = make_paged_case(seq_lens, query_lens, num_heads=8, num_kv_heads=2, head_dim=64,
                                           block_size=block_size, dtype=dtype)
    md = dataclasses.replace(md, **{f.name: getattr(md, f.name).to(CUDA) for f in dataclasses.fields(md)
                                    if torch.is_tensor(getattr(md, f.name))})
    out = triton_paged_attention(q.to(CUDA), k.to(CUDA), v.to(CUDA), kv.to(CUDA), md, 64 ** -0.5)
    torch.cuda.synchronize()
    assert (out.float().cpu() - exp).abs().max() < tol


def test_triton_write_kv_cache_matches_torch():
    from minivllm.core.attention import write_kv_cache
    from minivllm.kernels.attention_kernels import triton_write_kv_cache
    kv = torch.randn(2, 20, 16, 4, 64, device=CUDA, dtype=torch.bfloat16)
    kv2 = kv.clone()
    k, v = torch.randn(2, 37, 4, 64, device=CUDA, dtype=torch.bfloat16)
    slots = torch.randperm(320, device=CUDA)[:37]
    write_kv_cache(k, v, kv, slots); triton_write_kv_cache(k, v, kv2, slots)
    assert torch.equal(kv, kv2)


def test_lora_triton_kernels_match_torch():
    from minivllm.features.lora import bgmv_shrink, bgmv_expand, triton_bgmv_shrink, triton_bgmv_expand
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = torch.randn(37, 576, device=CUDA, generator=g)
    a = torch.randn(4, 16, 576, device=CUDA, generator=g)
    b = torch.randn(4, 1536, 16, device=CUDA, generator=g)
    idx = torch.randint(0, 4, (37,), device=CUDA, generator=g)       # each row's slot
    h = triton_bgmv_shrink(x, a, idx)
    assert torch.allclose(h, bgmv_shrink(x, a, idx), atol=1e-3, rtol=1e-3)
    assert torch.allclose(triton_bgmv_expand(h, b, idx), bgmv_expand(h, b, idx), atol=1e-3, rtol=1e-3)


def test_int4_cuda_kernel_matches_dequantized_gguf_blocks():
    "Q4_0/Q4_1 blocks through PyTorch's CUDA int4 kernel (its own packing) equal the de-quantized matmul in bf16."
    from minivllm.kernels.quantization import Int4Linear, int4_reference
    g = torch.Generator().manual_seed(0)
    N, K = 256, 576
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)
    scale, zero = torch.rand(N, K // 32, generator=g) * 0.02, torch.randn(N, K // 32, generator=g) * 0.01
    lin = Int4Linear(q.to(CUDA), scale.to(CUDA), zero.to(CUDA))
    for rows in (1, 7, 64, 300):
        x = torch.randn(rows, K, generator=g).to(CUDA, torch.bfloat16)
        ref = x.float() @ int4_reference(q, scale, zero).float().T.to(CUDA)
        assert (lin(x).float() - ref).abs().max() < 2e-2 * ref.abs().max()


# --- the engine on the GPU -----------------------------------------------------------------------------------------

def test_default_runner_on_cuda(tiny):
    "Compiled by default on CUDA; LoRA (not compilable here) falls back to eager without being asked."
    from minivllm import LLM
    from minivllm.kernels.compilation import CompiledModelRunner
    d, _ = tiny
    kw = dict(model=d, device="cuda", max_model_len=256, num_gpu_blocks_override=64)
    assert isinstance(LLM(**kw).llm_engine.engine_core.model_runner, CompiledModelRunner)
    assert not isinstance(LLM(enable_lora=True, **kw).llm_engine.engine_core.model_runner, CompiledModelRunner)


def test_engine_on_cuda_matches_hf(tiny):
    "fp32 on CUDA, both attention backends, chunked prefill: greedy tokens equal HF `generate` on the same GPU."
    from minivllm import LLM
    d, hf = tiny
    outs = {}
    for backend in ("triton", "torch"):
        llm = LLM(model=d, device="cuda", dtype="float32", attention_backend=backend, enforce_eager=True,
                  max_model_len=256, max_num_batched_tokens=64)
        outs[backend] = generate(llm)
        del llm
    for p, o in zip(PROMPTS, outs["triton"]):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p], device=CUDA), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.token_ids == ref[0, len(p):].tolist()
    assert_close_greedy(outs["triton"], outs["torch"])


def test_cuda_graphs_match_eager(tiny):
    "The CUDA default (enforce_eager unset): torch.compile (Triton) + CUDA graphs of decode steps; the eager tokens."
    from minivllm import LLM
    from minivllm.kernels.compilation import CompiledModelRunner
    d, _ = tiny
    kw = dict(model=d, device="cuda", dtype="float32", max_model_len=256, max_num_batched_tokens=64, num_gpu_blocks_override=512)
    eager = generate(LLM(enforce_eager=True, **kw))
    llm = LLM(compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]}, **kw)     # the CUDA default: compiled
    runner = llm.llm_engine.engine_core.model_runner
    assert isinstance(runner, CompiledModelRunner) and runner.use_graphs and sorted(runner.graphs) == [2, 4, 8]
    replays = []
    for b, (g, out) in runner.graphs.items():
        g.replay = (lambda f, b: lambda: (replays.append(b), f())[1])(g.replay, b)
    assert_close_greedy(eager, generate(llm))
    assert replays, "no decode step replayed a CUDA graph"


def test_bf16_engine_on_cuda_close_to_fp32(tiny):
    "The GPU's default dtype (bf16): greedy tokens track fp32 on a tiny model (bf16 rounding may flip near-ties)."
    from minivllm import LLM
    d, _ = tiny
    a = generate(LLM(model=d, device="cuda", dtype="float32", max_model_len=256, enforce_eager=True))
    b = generate(LLM(model=d, device="cuda", max_model_len=256, enforce_eager=True))
    assert_close_greedy(a, b, atol=0.1)


def test_steps_do_not_wait_for_the_gpu_per_phase(tiny, monkeypatch):
    """A step synchronises the GPU at each of its phases only when `sync_phase_timings` is set (the
    step breakdown's exact device times); by default the host runs ahead and waits once, for the tokens."""
    from minivllm import LLM
    d, _ = tiny
    llm = LLM(model=d, device="cuda", max_model_len=256, enforce_eager=True, num_gpu_blocks_override=64)
    generate(llm, n=4)  # warm-up
    calls, real = [], torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    steps = llm.llm_engine.engine_core.num_steps
    generate(llm, n=4)
    assert calls == [], f"{len(calls)} GPU synchronisations in {llm.llm_engine.engine_core.num_steps - steps} steps"
    llm.llm_engine.engine_core.sync_phase_timings = True
    steps = llm.llm_engine.engine_core.num_steps
    generate(llm, n=4)
    ran = llm.llm_engine.engine_core.num_steps - steps
    assert ran and len(calls) >= 2 * ran, (len(calls), ran)  # schedule and update lap in every step


def test_lora_on_cuda_matches_peft(tiny, tmp_path):
    "Two adapters and the base model in one batch (Triton BGMV), against PEFT on the same GPU."
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM
    from minivllm import LLM, SamplingParams, TokensPrompt, LoRARequest
    from minivllm.benchmarks import random_peft_adapter
    d, _ = tiny
    cfg = AutoConfig.from_pretrained(d)
    paths = [random_peft_adapter(tmp_path / f"a{i}", cfg, r=8, seed=i) for i in (1, 2)]
    for p in paths:   # make the adapters matter: B from 0.01 to 1.0 scale
        from safetensors.torch import load_file, save_file
        w = {k: (t * 100 if "lora_B" in k else t) for k, t in load_file(f"{p}/adapter_model.safetensors").items()}
        save_file(w, f"{p}/adapter_model.safetensors")
    llm = LLM(model=d, device="cuda", dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256,
              enforce_eager=True, num_gpu_blocks_override=512)
    reqs = [None, LoRARequest("a1", 1, paths[0]), LoRARequest("a2", 2, paths[1])] * 2
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:3] * 2], sp, lora_request=reqs, use_tqdm=False)
    for i, (p, r, o) in enumerate(zip(PROMPTS[:3] * 2, reqs, outs)):
        base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(CUDA)
        m = base if r is None else PeftModel.from_pretrained(base, r.lora_path).to(CUDA)
        with torch.no_grad():
            ref = m.generate(torch.tensor([p], device=CUDA), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.outputs[0].token_ids == ref[0, len(p):].tolist(), i


def test_spec_decode_on_cuda_is_exact(tiny):
    "n-gram speculation on CUDA: greedy tokens equal those without it."
    from minivllm import LLM
    d, _ = tiny
    kw = dict(model=d, device="cuda", dtype="float32", max_model_len=256, enforce_eager=True, num_gpu_blocks_override=512)
    prompts = [p * 3 for p in PROMPTS[:3]]               # repeats: the n-gram proposer has something to find
    plain = generate(LLM(**kw), prompts, n=24)
    spec = generate(LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, **kw),
                    prompts, n=24)
    assert [o.token_ids for o in plain] == [o.token_ids for o in spec]


def test_structured_output_on_cuda(tiny):
    "A regex and a choice on CUDA (the grammar's token bitmask applied to logits on the GPU): even a random model obeys them."
    import re
    from minivllm import LLM, SamplingParams
    from minivllm.core.config import StructuredOutputsParams
    d, _ = tiny
    llm = LLM(model=d, device="cuda", max_model_len=256, num_gpu_blocks_override=512)     # compiled, CUDA graphs: the bitmask applies outside the graph
    for so, ok in [(StructuredOutputsParams(regex=r"(yes|no), [0-9]{2}"), re.compile(r"(yes|no), [0-9]{2}").fullmatch),
                   (StructuredOutputsParams(choice=["red", "green", "blue"]), {"red", "green", "blue"}.__contains__)]:
        sp = SamplingParams(temperature=1.0, seed=1, max_tokens=32, structured_outputs=so)
        for o in llm.generate(["Answer:"] * 4, sp, use_tqdm=False):
            assert ok(o.outputs[0].text) and o.outputs[0].finish_reason == "stop", o.outputs[0].text
