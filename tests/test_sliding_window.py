"""Sliding-window attention (lesson 05d) end to end, on tiny random models built here: HF transformers' greedy tokens
and logprobs with the CPU's default attention backend, under preemption, after aborts; the same tokens under
tensor parallelism (TP=2) and pipeline parallelism (PP=2) as in one process, for a model whose every layer has a
window (Mistral) and for one that mixes full and windowed layers (Qwen2 with `max_window_layers`), whose two KV cache
groups hold the whole sequence (global) and the window (local)."""
import tempfile
import pytest
import torch
from conftest import hf_greedy_refs
from minivllm import LLM, LLMEngine, EngineArgs, SamplingParams, TokensPrompt
from minivllm.core.model_files import resolve_model
from minivllm.core.model import make_tiny_checkpoint
from minivllm.core.block_manager import check_invariants
from minivllm.features.sliding_window import (HybridKVCacheManager, SlidingWindowKVCacheManager, blocks_held,
                                             check_window_invariants, layer_windows)

pytestmark = pytest.mark.xdist_group("tp")   # the parallel tests start processes of their own

N = 16
PROMPTS = [list(range(100, 130)), [5, 17, 99, 1024, 7, 7, 300], list(range(100, 120)) + [3, 4, 5], [9] * 41]
ARGS = dict(dtype="float32", block_size=4, max_model_len=128)


def build(kind):
    "A tiny random checkpoint: every layer windowed (mistral) or the second of three (qwen2), a window of 8."
    d = tempfile.mkdtemp()
    kw = dict(tokenizer_from=resolve_model(None), vocab_size=49152, sliding_window=8, initializer_range=0.2,
              hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=96)
    if kind == "qwen2":
        kw |= dict(use_sliding_window=True, max_window_layers=1, num_hidden_layers=3)
    hf = make_tiny_checkpoint(d, kind, **kw)
    return d, hf


@pytest.fixture(scope="module", params=["mistral", "qwen2"])
def model(request):
    d, hf = build(request.param)
    refs = hf_greedy_refs(hf, PROMPTS, N)
    return request.param, d, hf.config, refs


def run(engine, prompts=PROMPTS, max_tokens=N):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    for i, p in enumerate(prompts): engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=p), sp)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o.outputs[0]
    return [done[f"r{i}"] for i in range(len(prompts))]


def check(outs, refs):
    for o, (toks, lps) in zip(outs, refs):
        assert o.token_ids == toks
        mine = [next(iter(x.values())).logprob for x in o.logprobs]
        assert max(abs(a - b) for a, b in zip(mine, lps)) < 1e-3


def test_windows_are_read_from_the_config(model):
    kind, _, cfg, _ = model
    assert layer_windows(cfg) == ([8, 8] if kind == "mistral" else [None, 8, 8])


def test_default_backend_matches_hf(model):
    "The CPU's default backend (`cpu`, lesson 04c's C kernel): windowed layers attend with the window code, full ones with C."
    kind, d, _, refs = model
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, max_num_batched_tokens=16, **ARGS))
    runner = engine.engine_core.model_runner
    assert runner.attention_backend == "cpu"
    check(run(engine), refs)
    kv = engine.kv_cache_manager
    assert type(kv) is (SlidingWindowKVCacheManager if kind == "mistral" else HybridKVCacheManager)


def test_preemption_and_abort_free_blocks(model):
    "A cache too small for the batch: requests are preempted and recomputed, tokens stay HF's; an abort frees its blocks."
    kind, d, _, refs = model
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, num_gpu_blocks_override=12, **ARGS | dict(max_model_len=48)))
    check(run(engine, PROMPTS[:3]), refs)
    if kind == "qwen2":   # 48 slots for 3 requests of up to 46 tokens (windowed Mistral needs far fewer)
        assert engine.scheduler.num_preemptions > 0
    kv = engine.kv_cache_manager
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    engine.add_request("long", TokensPrompt(prompt_token_ids=PROMPTS[0]), sp)
    for _ in range(12): engine.step()
    if kind == "mistral":
        assert blocks_held(kv, "long") <= 3 < len(kv.req_to_blocks["long"])
        check_window_invariants(kv)
    else:
        assert blocks_held(kv.local, "long") <= 3 < len(kv.req_to_blocks["long"])
        check_invariants(kv), check_window_invariants(kv.local)
    engine.abort_request("long")
    spare = 1 if kind == "mistral" else 0   # the placeholder block
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks - spare
    if kind == "qwen2":
        assert kv.local.block_pool.get_num_free_blocks() == kv.local.num_blocks - 1


def test_groups_hold_sequence_and_window(model):
    "The mixed model's groups after every step of a 60-token conversation: global = the sequence, local <= the window + 1."
    kind, d, _, _ = model
    if kind != "qwen2":
        pytest.skip("one group: every layer of the Mistral model has the window")
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, max_num_batched_tokens=16, **ARGS))
    kv, runner = engine.kv_cache_manager, engine.engine_core.model_runner
    assert [c.shape[1] for c in runner.kv_caches] == [kv.num_blocks, kv.local.num_blocks, kv.local.num_blocks]
    engine.add_request("talk", TokensPrompt(prompt_token_ids=PROMPTS[0]), SamplingParams(max_tokens=30, ignore_eos=True))
    glob, loc = [], []
    while engine.has_unfinished_requests():
        engine.step()
        if "talk" in kv.req_to_blocks:
            glob.append(len(kv.req_to_blocks["talk"]))
            loc.append(blocks_held(kv.local, "talk"))
            check_invariants(kv), check_window_invariants(kv.local)
    req_tokens = [min(16 * (i + 1), 30) if i < 2 else 30 + i - 1 for i in range(len(glob))]
    assert glob == [-(-n // 4) for n in req_tokens]   # every block of the sequence
    assert max(loc[2:]) <= 3 < glob[-1]                  # the window's 2 blocks + the one being filled
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks
    assert kv.local.block_pool.get_num_free_blocks() == kv.local.num_blocks - 1


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_parallel_matches_one_process(model, tp, pp):
    kind, d, _, refs = model
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                                   kv_cache_memory_bytes=1 << 22, **ARGS))
    try:
        outs = run(engine)
    finally:
        engine.shutdown()
    assert [o.token_ids for o in outs] == [t for t, _ in refs]
