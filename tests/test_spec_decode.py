"""Speculative decoding on the embedded SmolLM2 (lesson 07b): greedy outputs token-identical to plain decoding for both
methods and k = 1, 3 and 5, in a mixed batch and at batch 1, with chunked prefill, prefix caching and preemption on; stop
strings, stop tokens, min_tokens, max_tokens, logprobs and n > 1 as without speculation; seeded sampling reproducible;
the KV-block invariants after a fuzzed run where almost every guess is rejected; the counters, /metrics and the
configuration errors."""
import random
import pytest, torch
from minivllm import LLM, SamplingParams, EngineArgs
from minivllm.core.block_manager import check_invariants
from minivllm.features.spec_decode import truncated_draft_model

pytestmark = pytest.mark.xdist_group("spec_decode")  # one worker builds its module fixtures (engines, checkpoints) once

TEXT = ("Speculative decoding lets a cheap proposer guess several tokens, and the model checks all of them in one "
        "forward pass. The quick brown fox jumps over the lazy dog.")
QUESTIONS = ["What is the capital of France?", f"Repeat this text exactly: {TEXT}", "Count from 1 to 12.",
             f"Summarise in one sentence: {TEXT}"]
# a small KV cache (10 blocks of 16) for 4 requests of up to ~100 tokens: preemptions happen; a 48-token budget: chunked prefill
KW = dict(dtype="float32", max_model_len=160, num_gpu_blocks_override=10, block_size=16, max_num_batched_tokens=48,
          enable_prefix_caching=True, enable_chunked_prefill=True)
MAX_TOKENS = 48


def chat(tok, q):
    return tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    "The first 6 of SmolLM2's 30 layers, as a draft model with the same tokenizer."
    return truncated_draft_model(model_dir, tmp_path_factory.mktemp("draft"), 6)


@pytest.fixture(scope="module")
def baseline():
    "Plain decoding (no speculation) with the same engine settings: the reference."
    llm = LLM(**KW)
    prompts = [chat(llm.get_tokenizer(), q) for q in QUESTIONS]
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    mixed = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert llm.llm_engine.engine_core.scheduler.num_preemptions > 0, "the reference run should preempt"
    single = [o.outputs[0].token_ids for o in llm.generate(prompts[1:2], sp, use_tqdm=False)]
    return prompts, mixed, single


def spec_config(method, k, draft_dir):
    if method == "ngram": return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": k}


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("k", [1, 3, 5])   # one guess, a middle, the largest
def test_greedy_identical(baseline, draft_dir, method, k):
    prompts, mixed, single = baseline
    llm = LLM(**KW, speculative_config=spec_config(method, k, draft_dir))
    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    core = llm.llm_engine.engine_core
    steps = []
    llm.llm_engine.step_observers.append(lambda info: steps.append(info))
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)] == mixed
    assert core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[1:2], sp, use_tqdm=False)] == single
    st = core.extension("spec_decoder").stats
    assert st.num_drafts > 0 and 0 < st.num_accepted_tokens <= st.num_draft_tokens <= k * st.num_drafts
    assert sum(st.num_accepted_tokens_per_pos) == st.num_accepted_tokens and len(st.num_accepted_tokens_per_pos) == k
    # the verify chunks were budgeted: never more than the token budget, k+1 tokens for a speculating request
    for info in steps:
        out = info.scheduler_output
        assert out.total_num_scheduled_tokens <= KW["max_num_batched_tokens"]
        for s in out.seqs:
            if s.num_lookahead_tokens: assert s.num_tokens == s.num_lookahead_tokens + 1 <= k + 1
        for rid, (p, a) in info.lookahead.items(): assert len(info.sampled.get(rid, [])) <= a + 1 and a <= p
    kv = core.kv_cache_manager
    check_invariants(kv)
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks
    if method == "draft_model":   # the draft's private pool: every block either free or held by a request it saw
        prop = core.extension("spec_decoder").proposer
        held = [b for st in prop.state.values() for b in st.blocks]
        assert len(set(held)) == len(held) and len(held) + len(prop.free) == prop.runner.num_blocks


def test_sampling_params_as_without(baseline):
    "stop strings, stop tokens, min_tokens, ignore_eos, logprobs, penalties: same tokens, texts, finish reasons, logprobs."
    prompts, _, _ = baseline
    plain, spec = LLM(**KW), LLM(**KW, speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1})
    tok = plain.get_tokenizer()
    stop_tok = tok.encode(" the", add_special_tokens=False)[0]
    params = [SamplingParams(temperature=0, max_tokens=40, stop=["fox", "France"]),
              SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_tok], logprobs=3),
              SamplingParams(temperature=0, max_tokens=30, min_tokens=25, logprobs=2),
              SamplingParams(temperature=0, max_tokens=7, repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1)]
    a, b = plain.generate(prompts, params, use_tqdm=False), spec.generate(prompts, params, use_tqdm=False)
    for x, y in zip(a, b):
        cx, cy = x.outputs[0], y.outputs[0]
        assert (cx.token_ids, cx.text, cx.finish_reason, cx.stop_reason) == (cy.token_ids, cy.text, cy.finish_reason, cy.stop_reason)
        assert (cx.logprobs is None) == (cy.logprobs is None)
        if cx.logprobs is not None:
            assert len(cx.logprobs) == len(cy.logprobs) == len(cx.token_ids)
            for dx, dy in zip(cx.logprobs, cy.logprobs):
                assert list(dx) == list(dy)
                assert all(abs(dx[t].logprob - dy[t].logprob) < 1e-3 and dx[t].rank == dy[t].rank for t in dx)
    assert b[0].outputs[0].finish_reason == "stop" and b[3].outputs[0].finish_reason == "length"
    assert len(b[2].outputs[0].token_ids) >= 25
    assert spec.llm_engine.engine_core.extension("spec_decoder").stats.num_accepted_tokens > 0


def test_seeded_sampling_reproducible_and_n(baseline):
    "Seeded sampled requests (n = 3) give the same outputs in two engines with speculation; each sample is its own."
    prompts, _, _ = baseline
    cfg = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=1234, n=3, max_tokens=30, logprobs=1)
    runs = [[[c.token_ids for c in o.outputs] for o in LLM(**KW, speculative_config=cfg).generate(prompts[1:3], sp, use_tqdm=False)]
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert all(len(o) == 3 for o in runs[0]) and any(len(set(map(tuple, o))) > 1 for o in runs[0])


class RandomProposer:
    "Guesses random tokens: almost every guess is rejected (the worst case for the KV bookkeeping)."
    def __init__(self, seed=0): self.rng = random.Random(seed)
    def propose(self, requests, ks, alive=()):
        return [[self.rng.randrange(49152) for _ in range(self.rng.randint(0, k))] for k in ks]


def test_no_block_leaks_after_heavy_rejection(baseline):
    """Fuzz: random prompts, lengths, max_tokens, aborts, a tiny cache (preemptions), random guesses; the block
    manager's invariants hold after every step, every block is free at the end, and greedy outputs still equal plain
    decoding's."""
    prompts, _, _ = baseline
    rng = random.Random(0)
    kw = dict(KW, block_size=8, max_model_len=128, num_gpu_blocks_override=16)   # 128 slots for 8 requests: preemptions
    spec = LLM(**kw, speculative_config={"method": "ngram", "num_speculative_tokens": 5})
    core = spec.llm_engine.engine_core
    core.extension("spec_decoder").proposer = RandomProposer()
    eng = spec.llm_engine
    eng.step_observers.append(lambda info: check_invariants(core.kv_cache_manager))
    reqs = []
    for i in range(14):
        p = rng.choice(prompts) if rng.random() < 0.7 else chat(spec.get_tokenizer(), " ".join(rng.choice(TEXT.split()) for _ in range(rng.randint(3, 30))))
        reqs.append((f"r{i}", p, SamplingParams(temperature=0, max_tokens=rng.randint(10, 40))))
    abort_at = {5: "r3", 9: "r7"}
    done, step = {}, 0
    for r in reqs[:8]: eng.add_request(*r)
    while eng.has_unfinished_requests() or step < 12:
        if step == 4:
            for r in reqs[8:]: eng.add_request(*r)
        if step in abort_at: eng.abort_request([abort_at[step]])
        for o in eng.step():
            if o.finished: done[o.request_id] = o.outputs[0].token_ids
        step += 1
    kv = core.kv_cache_manager
    check_invariants(kv)
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks
    st = core.extension("spec_decoder").stats
    assert st.num_draft_tokens > 50 and st.acceptance_rate < 0.05 and core.scheduler.num_preemptions > 0
    plain = LLM(**kw)
    for rid, p, sp in reqs:
        if rid in done and rid not in abort_at.values():
            assert plain.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids == done[rid], rid


def test_config_errors_and_cli():
    import argparse
    with pytest.raises(NotImplementedError, match="eagle"):
        LLM(speculative_config={"method": "eagle", "model": "x", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="unknown key"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "bogus": 1})
    with pytest.raises(NotImplementedError, match="tensor_parallel_size"):
        EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 2}, tensor_parallel_size=2).create_engine_config()
    p = EngineArgs.add_cli_args(argparse.ArgumentParser())
    a = EngineArgs.from_cli_args(p.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']))
    assert a.create_engine_config().speculative_config.num_speculative_tokens == 3
    assert EngineArgs(speculative_config=None).create_engine_config().speculative_config is None


def test_metrics_names(baseline):
    prompts, _, _ = baseline
    llm = LLM(**KW, speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1})
    llm.generate(prompts[1:2], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    st = llm.llm_engine.get_stats().spec_decoding
    from minivllm.v1.metrics.reader import Counter, Vector   # vLLM's reader types, as its spec_decode.py example reads them
    ms = {m.name: m for m in llm.get_metrics()}
    assert ms["vllm:spec_decode_num_drafts"] == Counter("vllm:spec_decode_num_drafts", ms["vllm:spec_decode_num_drafts"].labels, st.num_drafts)
    assert st.num_drafts > 0
    assert ms["vllm:spec_decode_num_draft_tokens"].value == st.num_draft_tokens
    assert ms["vllm:spec_decode_num_accepted_tokens"].value == st.num_accepted_tokens
    vec = ms["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert isinstance(vec, Vector) and vec.values == st.num_accepted_tokens_per_pos and len(vec.values) == 2
    from minivllm.serve.server import Metrics
    class Async: engine = llm.llm_engine
    text = Metrics(Async).render().decode()
    assert f"vllm:spec_decode_num_drafts_total {float(st.num_drafts)}" in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"}' in text


def test_draft_equal_to_target_accepts_everything(baseline, model_dir):
    "The model as its own draft: every greedy guess is the model's own argmax, so (up to float ties) all are accepted."
    prompts, _, single = baseline
    llm = LLM(**KW, speculative_config={"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3})
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[1:2], SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                                                         use_tqdm=False)] == single
    st = llm.llm_engine.engine_core.extension("spec_decoder").stats
    assert st.num_drafts >= 2 and st.acceptance_rate > 0.95
