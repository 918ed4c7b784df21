"""Mixture-of-experts families (lesson 07d) through the whole engine, on tiny random checkpoints built here (8
experts, top 2, 4 layers): greedy tokens equal to HF transformers' and logprobs within 1e-3 (float32), alone and in a
mixed batch with chunked prefill and prefix caching; tensor_parallel_size=2 and pipeline_parallel_size=2 give the
tokens of one process. HF's reference is its own forward pass over the prompt and our tokens: its argmax at every
step must be our token (so its greedy generation is ours) and its log-softmax our logprob."""
import shutil
import psutil, pytest, torch
from minivllm.core.arg_utils import EngineArgs
from minivllm.core.config import SamplingParams, TokensPrompt
from minivllm.core.llm_engine import LLMEngine

pytestmark = pytest.mark.xdist_group("tp")   # one xdist worker: the TP/PP tests start processes of their own

MOE = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
           head_dim=16, intermediate_size=64, num_local_experts=8, num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, shared_expert_intermediate_size=48, initializer_range=0.2)
FAMILIES = {   # id: (model_type, extra config)
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),                                            # shared expert, raw top-k weights
    "qwen3_moe": ("qwen3_moe", dict(norm_topk_prob=True, mlp_only_layers=[2])),  # renormalised; layer 2 dense
    "olmoe": ("olmoe", {}),
}
ARGS = dict(dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=256, block_size=4)
G = torch.Generator().manual_seed(7)
PREFIX = torch.randint(0, 49152, (24,), generator=G).tolist()
PROMPTS = [PREFIX + [5, 6, 7], [11, 12, 13], PREFIX + torch.randint(0, 49152, (9,), generator=G).tolist(),
           torch.randint(0, 49152, (41,), generator=G).tolist()]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, model_dir):
    "(checkpoint dir, HF model) of one family."
    from minivllm.core.model import make_tiny_checkpoint
    mt, kw = FAMILIES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    hf = make_tiny_checkpoint(d, mt, seed=3, tokenizer_from=model_dir, **MOE, **kw)
    return str(d), hf


def run(engine, prompts, max_tokens=8, waves=(None,)):
    """Greedy tokens and logprobs of each prompt; `waves`: how many prompts to add before each group of steps
    (None: the rest), so later requests arrive while earlier ones decode."""
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    done, added, cached = {}, 0, {}
    for w in waves:
        for p in prompts[added: added + w if w else None]:
            engine.add_request(f"r{added}", TokensPrompt(prompt_token_ids=p), sp); added += 1
        for _ in range(2) if w else iter(int, 1):
            if not engine.has_unfinished_requests(): break
            for o in engine.step():
                if o.finished:
                    out = o.outputs[0]
                    done[o.request_id] = (out.token_ids, [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)])
                    cached[o.request_id] = o.num_cached_tokens
    return [done[f"r{i}"] for i in range(len(prompts))], cached


def check_against_hf(hf, prompt, tokens, logprobs):
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
    ref = torch.log_softmax(logits, -1)
    assert ref.argmax(-1).tolist() == tokens          # HF's greedy choice at every step is ours
    got = torch.tensor(logprobs)
    assert torch.allclose(got, ref[torch.arange(len(tokens)), tokens], atol=1e-3), (got, ref.max(-1).values)


def test_batch_1_matches_hf(family):
    d, hf = family
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, **ARGS))
    try:
        for p in PROMPTS[:2]:
            [(toks, lps)], _ = run(engine, [p])
            check_against_hf(hf, p, toks, lps)
    finally:
        engine.shutdown()


def test_mixed_batch_chunked_prefill_prefix_caching_matches_hf(family):
    "A 24-token shared prefix, prefill chunks of at most 16 tokens, requests arriving while others decode."
    d, hf = family
    engine = LLMEngine.from_engine_args(EngineArgs(model=d, enable_prefix_caching=True, enable_chunked_prefill=True,
                                                   max_num_batched_tokens=16, **ARGS))
    try:
        outs, cached = run(engine, PROMPTS, waves=(1, 1, None))
    finally:
        engine.shutdown()
    assert cached["r2"] >= 16   # the prefix came from the cache
    for p, (toks, lps) in zip(PROMPTS, outs):
        check_against_hf(hf, p, toks, lps)
    assert len({tuple(t) for t, _ in outs}) > 1


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_parallel_matches_one_process(family, tp, pp):
    "TP=2: every expert's features split over the ranks; PP=2: layers 0-1 and 2-3 (Qwen3-MoE's dense layer 2 first)."
    d, hf = family
    outs = []
    for kw in ({}, dict(tensor_parallel_size=tp, pipeline_parallel_size=pp)):
        engine = LLMEngine.from_engine_args(EngineArgs(model=d, **kw, **ARGS))
        try: outs.append(run(engine, PROMPTS)[0])
        finally: engine.shutdown()
    assert [t for t, _ in outs[0]] == [t for t, _ in outs[1]]
    for (_, a), (_, b) in zip(*outs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-3)


def test_unknown_architecture_is_refused_by_name(tmp_path):
    from minivllm.core.model import make_tiny_checkpoint
    make_tiny_checkpoint(tmp_path, "gpt2", vocab_size=256, n_embd=64, n_layer=1, n_head=4)
    with pytest.raises(NotImplementedError, match="architecture 'GPT2LMHeadModel' is not supported"):
        LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), **ARGS))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler on this machine")
def test_c_decode_kernel_keeps_greedy_tokens(tmp_path, model_dir, monkeypatch):
    "`moe.c` runs the CPU decode steps (at most `Experts.c_rows` rows): a tiny Mixtral's greedy tokens are the torch loop's."
    from minivllm.core.model import make_tiny_checkpoint
    from minivllm.models import moe
    make_tiny_checkpoint(tmp_path, "mixtral", seed=3, tokenizer_from=model_dir, **MOE)
    ran, kernel = [], moe.moe_experts_c

    def counted(*args):
        out = kernel(*args)
        ran.append(out is not None)
        return out
    monkeypatch.setattr(moe, "moe_experts_c", counted)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(moe.Experts, "c_decode", on)
        engine = LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), **ARGS))
        try: outs.append(run(engine, PROMPTS[:2], max_tokens=6)[0])
        finally: engine.shutdown()
        if on:
            assert ran and all(ran), ran   # the decode steps ran in C; the 27-token prefill went to torch uncalled
            ran.clear()
    assert ran == []                                # off: never called
    assert [t for t, _ in outs[0]] == [t for t, _ in outs[1]]
    for (_, a), (_, b) in zip(*outs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
