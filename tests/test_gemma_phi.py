"""Gemma 2, Gemma 3 and Phi-3 (lesson 07e) end to end on tiny random models built here: HF transformers' greedy tokens
and logprobs with the CPU's default backend, and the same tokens under tensor parallelism (TP=2), pipeline
parallelism (PP=2, three layers: the second stage starts at a local layer) and TP=2 × PP=2 as in one process."""
import tempfile
import pytest
import torch
from conftest import hf_greedy_refs
from minivllm import LLMEngine, EngineArgs, SamplingParams, TokensPrompt
from minivllm.core.model_files import resolve_model
from minivllm.core.model import make_tiny_checkpoint, model_class
from minivllm.models.gemma_phi import GemmaForCausalLM, Phi3ForCausalLM

pytestmark = pytest.mark.xdist_group("tp")   # the parallel tests start processes of their own

N = 12
PROMPTS = [list(range(100, 130)), [5, 17, 99, 1024, 7, 7, 300], [9] * 21]
ARGS = dict(dtype="float32", block_size=4, max_model_len=128, kv_cache_memory_bytes=1 << 22)
TINY = dict(tokenizer_from=None, vocab_size=49152, initializer_range=0.2, num_hidden_layers=3)
GEMMA = dict(sliding_window=8, query_pre_attn_scalar=24,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"])
FAMILIES = {
    "gemma2": GEMMA | dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    "gemma3_text": GEMMA | dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}),
    "phi3": dict(sliding_window=None, max_position_embeddings=512, original_max_position_embeddings=128,
                 pad_token_id=0, rope_parameters={
                     "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 128,
                     "short_factor": [1.0, 1.1, 1.3, 1.0, 1.5, 1.06, 1.8, 1.7],
                     "long_factor": [2.8, 3.7, 2.4, 3.4, 1.4, 2.2, 1.2, 2.4]}),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    d = tempfile.mkdtemp()
    hf = make_tiny_checkpoint(d, request.param, **(TINY | dict(tokenizer_from=resolve_model(None))),
                              **FAMILIES[request.param])
    refs = hf_greedy_refs(hf, PROMPTS, N)
    return request.param, d, hf.config, refs


def run(engine):
    sp = SamplingParams(temperature=0, max_tokens=N, logprobs=0, ignore_eos=True)
    for i, p in enumerate(PROMPTS): engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=p), sp)
    done = {}
    try:
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished: done[o.request_id] = o.outputs[0]
    finally:
        engine.shutdown()
    return [done[f"r{i}"] for i in range(len(PROMPTS))]


def test_registered(family):
    kind, _, cfg, _ = family
    assert model_class(cfg) is (Phi3ForCausalLM if kind == "phi3" else GemmaForCausalLM)


def test_default_backend_matches_hf(family):
    "The CPU's default backend and a mixed batch (16-token chunks, prefix caching): HF's tokens and logprobs."
    _, d, _, refs = family
    outs = run(LLMEngine.from_engine_args(EngineArgs(model=d, max_num_batched_tokens=16, **ARGS)))
    for o, (toks, lps) in zip(outs, refs):
        assert o.token_ids == toks
        mine = [next(iter(x.values())).logprob for x in o.logprobs]
        assert max(abs(a - b) for a, b in zip(mine, lps)) < 1e-3


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)])
def test_parallel_matches_one_process(family, tp, pp):
    _, d, _, refs = family
    outs = run(LLMEngine.from_engine_args(EngineArgs(model=d, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                                     **ARGS)))
    assert [o.token_ids for o in outs] == [t for t, _ in refs]


def test_longrope_past_the_original_context_is_refused():
    d = tempfile.mkdtemp()
    make_tiny_checkpoint(d, "phi3", **(TINY | dict(tokenizer_from=resolve_model(None))), **FAMILIES["phi3"])
    with pytest.raises(NotImplementedError, match="max_model_len <= 128"):
        LLMEngine.from_engine_args(EngineArgs(model=d, **ARGS | dict(max_model_len=256)))
