"""LLMEngine's API on the embedded SmolLM2: prompt types, RequestOutput fields, stop strings across token boundaries,
stop tokens and EOS (finish_reason / stop_reason as vLLM defines them), byte-fallback characters in streams, aborts,
priority, and stats checked against counts taken independently here."""
import logging, time
import pytest
from minivllm import LLMEngine, EngineArgs, SamplingParams, TokensPrompt, TextPrompt, RequestOutputKind

pytestmark = pytest.mark.xdist_group("engine_api")  # one worker builds its module fixtures (engines, checkpoints) once

PARIS = "The capital of France is"
EMOJI = "🍕🎉🍕🎉🍕🎉🍕🎉🍕🎉"
CJK = "日本語: こんにちは、世界。日本語のテキストを書きます。"
EOS = 2


@pytest.fixture(scope="module")
def engine():
    return LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=512, num_gpu_blocks_override=160))


@pytest.fixture(scope="module")
def small():
    "A tiny KV cache (12 blocks) to force preemptions, a 64-token budget, the priority policy, stats logging on."
    return LLMEngine.from_engine_args(EngineArgs(dtype="float32", num_gpu_blocks_override=12, max_model_len=160, max_num_batched_tokens=64,
                                                 scheduling_policy="priority", disable_log_stats=False))


def run(engine, requests, record=None):
    """Add `(id, prompt, params[, kw])` requests, step to the end. Returns {id: final output} and, per id, the list of
    all outputs seen; `record(outs)` is called after every step."""
    for r in requests: engine.add_request(*r[:3], **(r[3] if len(r) > 3 else {}))
    final, seen = {}, {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        for o in outs:
            seen.setdefault(o.request_id, []).append(o)
            if o.finished: final[o.request_id] = o
        if record: record(outs)
    return final, seen


def one(engine, prompt, params, rid="x"):
    final, seen = run(engine, [(rid, prompt, params)])
    return final[rid], seen[rid]


def greedy(**kw): return SamplingParams(temperature=0, **kw)


def chat(engine, text):
    return engine.get_tokenizer().apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)


def assert_idle(engine):
    kv = engine.kv_cache_manager
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks


# ---------------------------------------------------------------- add_request, RequestOutput fields

def test_prompt_types_fields_and_metrics(engine):
    tok = engine.get_tokenizer()
    ids = tok(PARIS).input_ids
    t_add = time.time()
    final, seen = run(engine, [("str", PARIS, greedy(max_tokens=6), dict(arrival_time=t_add)),
                               ("text", TextPrompt(prompt=PARIS), greedy(max_tokens=6)),
                               ("tokens", TokensPrompt(prompt_token_ids=ids), greedy(max_tokens=6))])
    s, t, k = final["str"], final["text"], final["tokens"]
    assert s.outputs[0].token_ids == t.outputs[0].token_ids == k.outputs[0].token_ids
    assert s.outputs[0].text.startswith(" Paris")
    assert (s.request_id, s.prompt, s.prompt_token_ids, s.prompt_logprobs, s.finished) == ("str", PARIS, ids, None, True)
    assert k.prompt is None and k.prompt_token_ids == ids          # a TokensPrompt has no text, as in vLLM
    c = s.outputs[0]
    assert (c.index, c.finish_reason, c.stop_reason, c.cumulative_logprob, c.logprobs) == (0, "length", None, None, None)
    m = s.metrics
    assert m.arrival_time == t_add
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    # cumulative by default: every output holds the text so far
    texts = [o.outputs[0].text for o in seen["str"]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and len(seen["str"]) == 6
    assert_idle(engine)


def test_num_cached_tokens_and_prefix_cache_stats(engine):
    "Prefix-cache hits counted independently from the prompts' common prefix."
    tok, kv = engine.get_tokenizer(), engine.kv_cache_manager
    assert engine.reset_prefix_cache()
    shared = "You are a helpful assistant. Answer briefly and precisely, in one sentence, without any preamble. " * 2
    a, b = shared + "What is the capital of Italy?", shared + "Name a large mammal."
    ia, ib = tok(a).input_ids, tok(b).input_ids
    common = next(i for i, (x, y) in enumerate(zip(ia, ib)) if x != y)
    bs = kv.block_size
    expect_hits = min(common // bs, (len(ib) - 1) // bs) * bs
    assert expect_hits >= 2 * bs
    before = engine.get_stats()
    oa, _ = one(engine, a, greedy(max_tokens=2), "pa")
    ob, _ = one(engine, b, greedy(max_tokens=2), "pb")
    after = engine.get_stats()
    assert (oa.num_cached_tokens, ob.num_cached_tokens) == (0, expect_hits)
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(ia) + len(ib)
    assert after.prefix_cache_hits - before.prefix_cache_hits == expect_hits


def test_n_children_seeded_and_delta_aggregation(engine):
    p = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8)
    d = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8, output_kind=RequestOutputKind.DELTA)
    final, seen = run(engine, [("n1", PARIS, p), ("n2", PARIS, p), ("n3", PARIS, d)])
    o1, o2 = final["n1"], final["n2"]
    assert [c.index for c in o1.outputs] == [0, 1, 2]
    assert [c.token_ids for c in o1.outputs] == [c.token_ids for c in o2.outputs]       # seeds make it reproducible
    assert len({tuple(c.token_ids) for c in o1.outputs}) > 1                              # children differ (seed + i)
    joined = {i: "".join(c.text for o in seen["n3"] for c in o.outputs if c.index == i) for i in range(3)}
    assert joined == {c.index: c.text for c in o1.outputs}
    assert_idle(engine)


# ---------------------------------------------------------------- stop strings, stop tokens, EOS

@pytest.fixture(scope="module")
def paris(engine):
    "The greedy continuation of PARIS: (text, token ids, character offset where each token starts)."
    tok = engine.get_tokenizer()
    full, _ = one(engine, PARIS, greedy(max_tokens=24, ignore_eos=True), "full")
    text, ids = full.outputs[0].text, full.outputs[0].token_ids
    assert text == tok.decode(ids)
    return text, ids, [len(tok.decode(ids[:k])) for k in range(len(ids) + 1)]


def test_stop_string_across_two_and_three_tokens(engine, paris):
    tok = engine.get_tokenizer()
    text, ids, b = paris
    per_token = [tok.decode([t]) for t in ids]
    cases = {}
    for k in range(1, len(ids) - 2):   # stop strings that straddle 2 tokens, then 3 tokens
        two, three = text[b[k] - 2:b[k] + 2], text[b[k] - 1:b[k + 1] + 1]
        for stop, ntok in ((two, 2), (three, 3)):
            if (len(per_token[k - 1]) >= 2 and len(per_token[k]) >= 2 and len(per_token[k + 1]) >= 1
                    and text.find(stop) == text.find(stop, b[k] - len(stop)) and not any(stop in p for p in per_token)):
                cases.setdefault(ntok, stop)
    assert set(cases) == {2, 3}, cases
    reqs = []
    for n, stop in cases.items():
        reqs += [(f"cut{n}", PARIS, greedy(max_tokens=24, ignore_eos=True, stop=[stop])),
                 (f"incl{n}", PARIS, greedy(max_tokens=24, ignore_eos=True, stop=["never seen", stop], include_stop_str_in_output=True)),
                 (f"delta{n}", PARIS, greedy(max_tokens=24, ignore_eos=True, stop=[stop], output_kind=RequestOutputKind.DELTA))]
    final, seen = run(engine, reqs)
    for n, stop in cases.items():
        at = text.find(stop)
        assert not any(stop in p for p in per_token)          # a naive check of each token's text never sees it
        c = final[f"cut{n}"].outputs[0]
        assert (c.text, c.finish_reason, c.stop_reason) == (text[:at], "stop", stop), (stop, n)
        assert c.token_ids == ids[:len(c.token_ids)] and b[len(c.token_ids)] >= at + len(stop) > b[len(c.token_ids) - 1]
        assert (final[f"incl{n}"].outputs[0].text, final[f"incl{n}"].outputs[0].stop_reason) == (text[:at + len(stop)], stop)
        # streamed: the deltas add up to the cut text, so no piece of the stop string was ever shown
        assert "".join(x.outputs[0].text for x in seen[f"delta{n}"]) == text[:at]
        assert seen[f"delta{n}"][-1].finished and seen[f"delta{n}"][-1].outputs[0].stop_reason == stop
    assert_idle(engine)


def test_stop_string_wins_over_length_and_respects_min_tokens(engine, paris):
    tok = engine.get_tokenizer()
    text, ids, b = paris
    k = next(k for k in range(2, 16) if len(tok.decode([ids[k]])) >= 2 and text.find(tok.decode([ids[k]])) == b[k]
             and text.find(tok.decode([ids[k]]), b[k + 1]) == -1)
    stop = tok.decode([ids[k]])
    final, _ = run(engine, [
        # the stop string is completed by the very token that also reaches max_tokens: "stop" wins, the text is cut
        ("last", PARIS, greedy(max_tokens=k + 1, ignore_eos=True, stop=[stop])),
        # inside min_tokens a stop string does not count (and that text is not searched again)
        ("min", PARIS, greedy(max_tokens=k + 4, min_tokens=k + 2, ignore_eos=True, stop=[stop]))])
    o = final["last"].outputs[0]
    assert (o.finish_reason, o.stop_reason, o.text, len(o.token_ids)) == ("stop", stop, text[:b[k]], k + 1)
    o = final["min"].outputs[0]
    assert (o.finish_reason, o.text) == ("length", tok.decode(ids[:k + 4]))
    assert_idle(engine)


def test_stop_token_ids_eos_and_special_tokens(engine, paris):
    tok = engine.get_tokenizer()
    _, ids, _ = paris
    dot = tok.convert_tokens_to_ids(".")
    k = ids.index(dot)
    q = chat(engine, "What is 2+2? Answer with only the number.")
    final, _ = run(engine, [("t", PARIS, greedy(max_tokens=12, ignore_eos=True, stop_token_ids=[dot])),
                            ("ti", PARIS, greedy(max_tokens=12, ignore_eos=True, stop_token_ids=[dot], include_stop_str_in_output=True)),
                            ("e", q, greedy(max_tokens=20)), ("es", q, greedy(max_tokens=20, skip_special_tokens=False))])
    c = final["t"].outputs[0]
    # vLLM: the stop token's id is in token_ids, its text is not (unless include_stop_str_in_output); stop_reason = the id
    assert (c.token_ids, c.text, c.finish_reason, c.stop_reason) == (ids[:k + 1], tok.decode(ids[:k]), "stop", dot)
    assert final["ti"].outputs[0].text == tok.decode(ids[:k + 1])
    # EOS: finish_reason "stop", stop_reason None; the EOS id ends token_ids, its text is never shown
    c = final["e"].outputs[0]
    assert (c.finish_reason, c.stop_reason, c.token_ids[-1]) == ("stop", None, EOS)
    assert final["es"].outputs[0].text == c.text and "<|im_end|>" not in c.text
    # with ignore_eos the model runs past EOS; skip_special_tokens decides whether "<|im_end|>" shows in the text
    n = c.token_ids.index(EOS) + 2
    final, _ = run(engine, [("shown", q, greedy(max_tokens=n, ignore_eos=True, skip_special_tokens=False)),
                            ("hidden", q, greedy(max_tokens=n, ignore_eos=True))])
    shown, hidden = final["shown"].outputs[0], final["hidden"].outputs[0]
    assert shown.token_ids == hidden.token_ids and EOS in shown.token_ids
    assert "<|im_end|>" in shown.text and "<|im_end|>" not in hidden.text
    assert (hidden.finish_reason, hidden.stop_reason) == ("length", None)
    assert_idle(engine)


def test_multibyte_streams_have_no_replacement_characters(engine):
    "Emoji and CJK, whose characters the byte-level tokenizer splits over several tokens."
    tok = engine.get_tokenizer()
    delta = greedy(max_tokens=24, output_kind=RequestOutputKind.DELTA)
    final, seen = run(engine, [("emoji", EMOJI, delta), ("cjk", CJK, delta), ("cut", EMOJI, greedy(max_tokens=24, stop=["🎉"]))])
    for rid in ("emoji", "cjk"):
        outs = seen[rid]
        ids = [t for o in outs for t in o.outputs[0].token_ids]
        deltas = [o.outputs[0].text for o in outs]
        assert sum("\ufffd" in tok.decode([t]) for t in ids) >= 6       # the tokens do split characters
        assert not any("\ufffd" in d for d in deltas)                    # the stream never shows a broken one
        # all whole characters arrive; an incomplete one at the very end (max_tokens) is never shown
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        assert any(o.outputs[0].token_ids and not o.outputs[0].text for o in outs)   # tokens of a character not complete yet
        assert len("".join(deltas)) >= 4
    # a stop string that is one character made of several tokens
    text = "".join(o.outputs[0].text for o in seen["emoji"])
    assert "🎉" in text
    assert (final["cut"].outputs[0].text, final["cut"].outputs[0].stop_reason) == (text[:text.index("🎉")], "🎉")
    assert_idle(engine)


# ---------------------------------------------------------------- abort, bad input, configs

def test_abort_one_or_many_unknown_is_noop(engine):
    long = greedy(max_tokens=100, ignore_eos=True)
    for r in ("a", "b", "c"): engine.add_request(r, PARIS, long)
    engine.step(); engine.step()
    assert engine.get_num_unfinished_requests() == 3
    engine.abort_request("a")
    engine.abort_request(["b", "nope", "a"])
    kv = engine.kv_cache_manager
    assert kv.get_block_ids("a") == kv.get_block_ids("b") == [] and kv.get_block_ids("c")
    assert engine.get_num_unfinished_requests() == 1
    outs = engine.step()
    ab = {o.request_id: o for o in outs if o.finished}
    assert set(ab) == {"a", "b"} and all(o.outputs[0].finish_reason == "abort" and o.outputs[0].stop_reason is None for o in ab.values())
    assert len(ab["a"].outputs[0].token_ids) == 2
    engine.abort_request("c", final_output=False)
    assert engine.step() == [] and not engine.has_unfinished_requests()
    engine.abort_request("c")                      # twice: a no-op
    assert_idle(engine)


def test_bad_input_and_missing_features(engine):
    with pytest.raises(TypeError, match="request_id"): engine.add_request(1, "x")
    with pytest.raises(ValueError, match="empty"): engine.add_request("x", "")
    with pytest.raises(ValueError, match="vocabulary"): engine.add_request("x", TokensPrompt(prompt_token_ids=[-3]))
    with pytest.raises(ValueError, match="maximum model length"): engine.add_request("x", TokensPrompt(prompt_token_ids=[5] * 513))
    with pytest.raises(ValueError, match="scheduling_policy"): engine.add_request("x", "hi", priority=3)
    with pytest.raises(TypeError, match="LoRARequest"): engine.add_request("x", "hi", lora_request=object())
    with pytest.raises(ValueError, match="tensor_parallel_size=10"): LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=10))
    assert not engine.has_unfinished_requests()
    assert engine.get_lora_config() is None and engine.get_speculative_config() is None
    mc, sc, cc = engine.get_model_config(), engine.get_scheduler_config(), engine.get_cache_config()
    assert (mc.max_model_len, sc.max_model_len, cc.num_gpu_blocks, cc.block_size) == (512, 512, 160, 16)
    assert engine.get_parallel_config().tensor_parallel_size == 1


def test_priority_and_arrival_time(small):
    "Lower priority value runs first; with equal priority, earlier arrival_time first."
    tok = small.get_tokenizer()
    # three different 50-token prompts (the same prompt would be a prefix-cache hit and start all three at once)
    prompt = lambda w: TokensPrompt(prompt_token_ids=tok(f"{w} " * 50).input_ids[:50])
    trace = []
    small.step_observers.append(watch := lambda info: trace.append(info.scheduler_output))
    now = time.time()
    final, _ = run(small, [("late", prompt("cat"), greedy(max_tokens=2), dict(priority=1, arrival_time=now)),
                           ("urgent", prompt("dog"), greedy(max_tokens=2), dict(priority=0, arrival_time=now + 1)),
                           ("early", prompt("fox"), greedy(max_tokens=2), dict(priority=1, arrival_time=now - 5))])
    first = {}
    for step, out in enumerate(trace):
        for s in out.seqs: first.setdefault(s.req_id, step)
    small.step_observers.remove(watch)
    assert first["urgent"] <= first["early"] < first["late"]
    assert final["early"].metrics.arrival_time == now - 5
    assert_idle(small)


# ---------------------------------------------------------------- stats

def test_stats_agree_with_independent_counts(small, caplog):
    """Preemptions, tokens, finish reasons, running / waiting, KV usage, TTFT, TPOT and throughput, each counted or
    timed here from what the engine returns, and compared with `get_stats()` and the logged line."""
    small.stat_logger.interval = 1e9               # no automatic log line in the middle of our interval
    before = small.do_log_stats()                  # starts a new interval
    t0 = time.time()
    trace = []
    small.step_observers.append(watch := lambda info: trace.append(info.scheduler_output))
    prompts = [f"Story number {i}: once upon a time, in a land far away, there lived" for i in range(5)]
    params = [greedy(max_tokens=40, ignore_eos=True), greedy(max_tokens=30, ignore_eos=True), greedy(max_tokens=6, stop=[" "]),
              SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=24, ignore_eos=True), greedy(max_tokens=35, ignore_eos=True)]
    added, token_times, usage_checks, rw_checks, step_times = {}, {}, [], [], []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        added[str(i)] = time.time()
        small.add_request(str(i), p, sp, arrival_time=added[str(i)])
    final = {}
    finished_ids = set()
    while small.has_unfinished_requests():
        t_s = time.time()
        outs = small.step()
        t_e = time.time()
        step_times.append(t_e - t_s)
        for o in outs:
            for c in o.outputs:
                token_times.setdefault((o.request_id, c.index), [])
                token_times[(o.request_id, c.index)] += [t_e] * (len(c.token_ids) - len(token_times[(o.request_id, c.index)]))
            if o.finished: final[o.request_id] = o; finished_ids.add(o.request_id)
        st = small.get_stats()
        kv = small.kv_cache_manager
        live = {c for rid in added if rid not in finished_ids for c in ([rid] if params[int(rid)].n == 1 else [f"{j}_{rid}" for j in range(2)])}
        used = {b for c in live for b in kv.get_block_ids(c)}
        usage_checks.append((st.kv_cache_usage, len(used) / kv.num_blocks))
        if not any(o.preempted_req_ids for o in trace):          # before any preemption, running = scheduled so far, not finished
            scheduled = {s.req_id for o in trace for s in o.seqs}
            live_unfinished = {c for c in live if small.scheduler.requests.get(c) is not None}
            rw_checks.append(((st.num_running_reqs, st.num_waiting_reqs), (len(scheduled & live_unfinished), len(live_unfinished - scheduled))))
    small.step_observers.remove(watch)
    t1 = time.time()
    with caplog.at_level(logging.INFO, logger="minivllm"):
        st = small.do_log_stats()
    # tokens and requests, counted from the outputs
    outs = [c for o in final.values() for c in o.outputs]
    assert st.num_generation_tokens - before.num_generation_tokens == sum(len(c.token_ids) for c in outs)
    assert st.num_prompt_tokens - before.num_prompt_tokens == sum(len(o.prompt_token_ids) * len(o.outputs) for o in final.values())
    reasons = {}
    for c in outs: reasons[c.finish_reason] = reasons.get(c.finish_reason, 0) + 1
    assert {k: st.num_finished.get(k, 0) - before.num_finished.get(k, 0) for k in reasons} == reasons == {"length": 5, "stop": 1}
    # preemptions, from the scheduler outputs of every step
    n_pre = sum(len(o.preempted_req_ids) for o in trace)
    assert n_pre > 0 and st.num_preemptions - before.num_preemptions == n_pre
    # KV usage after each step = blocks held by live requests / all blocks; running / waiting before preemptions
    assert all(abs(a - b) < 1e-9 for a, b in usage_checks) and max(a for a, _ in usage_checks) > 0.5
    assert len(rw_checks) >= 1 and all(a == b for a, b in rw_checks), rw_checks
    assert rw_checks[0][0][1] > 0                                 # the 64-token budget left some waiting at first
    # latencies: TTFT and TPOT measured from when outputs came back, within one step of the engine's own timing
    slack = max(step_times) + 0.01
    n_seqs = len(outs)
    assert st.time_to_first_token.count - before.time_to_first_token.count == n_seqs
    ttft_here = [ts[0] - added[rid] for (rid, _), ts in token_times.items()]
    new_ttft = list(st.time_to_first_token.recent)[-n_seqs:]
    assert abs(sum(new_ttft) / n_seqs - sum(ttft_here) / n_seqs) <= slack
    assert all(a <= b + 1e-6 for a, b in zip(sorted(new_ttft), sorted(ttft_here)))
    tpot_here = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in token_times.values() if len(ts) > 1]
    new_tpot = list(st.time_per_output_token.recent)[-len(tpot_here):]
    assert abs(sum(new_tpot) / len(new_tpot) - sum(tpot_here) / len(tpot_here)) <= 0.01 + 0.1 * sum(tpot_here) / len(tpot_here)
    # throughput over the interval that the two do_log_stats() calls delimit
    gen = sum(len(c.token_ids) for c in outs)
    assert st.interval == pytest.approx(t1 - t0, rel=0.05, abs=0.05)
    assert st.generation_throughput == pytest.approx(gen / (t1 - t0), rel=0.1)
    line = [r.getMessage() for r in caplog.records if r.name == "minivllm"][-1]
    assert f"Avg generation throughput: {st.generation_throughput:.1f} tokens/s" in line and f"Preemptions: {st.num_preemptions}" in line
    small.stat_logger.interval = 10.0
    assert_idle(small)


def test_stats_are_logged_at_the_interval_only_with_log_stats(engine, small, caplog):
    small.stat_logger.interval = engine.stat_logger.interval = 0.0
    try:
        with caplog.at_level(logging.INFO, logger="minivllm"):
            run(small, [("l", PARIS, greedy(max_tokens=3))])
            n_small = sum("Avg prompt throughput" in r.getMessage() for r in caplog.records)
            caplog.clear()
            run(engine, [("l", PARIS, greedy(max_tokens=3))])      # engine: disable_log_stats=True (the default)
            n_engine = sum("Avg prompt throughput" in r.getMessage() for r in caplog.records)
    finally:
        small.stat_logger.interval = engine.stat_logger.interval = 10.0
    assert (small.log_stats, engine.log_stats) == (True, False)
    assert n_small >= 3 and n_engine == 0


# ---------------------------------------------------------------- the step hook

def test_step_observers_last_step_and_phase_seconds(engine):
    """Every step is published once, in order, to each observer (after the outputs are processed, KV as after the
    step); `last_step` is the latest; the sampled tokens are the outputs' tokens; the stats sum the phase seconds."""
    before = engine.get_stats().phase_seconds
    seen, kv_free = [], []
    def watch(info):
        seen.append(info); kv_free.append(engine.kv_cache_manager.block_pool.get_num_free_blocks())
    engine.step_observers.append(watch)
    try:
        final, all_outs = run(engine, [("h1", PARIS, greedy(max_tokens=5)), ("h2", "Hello", greedy(max_tokens=3, n=1))])
    finally: engine.step_observers.remove(watch)
    assert engine.last_step is seen[-1] and [i.step for i in seen] == list(range(seen[0].step, seen[0].step + len(seen)))
    for rid in ("h1", "h2"):
        assert [t for i in seen for t in i.sampled.get(rid, [])] == final[rid].outputs[0].token_ids
    assert kv_free[-1] == engine.kv_cache_manager.num_blocks           # the last observer call saw the blocks freed
    phases = ["schedule", "prepare", "forward", "logits", "sampling", "update", "outputs"]
    assert all(list(i.timings) == phases and min(i.timings.values()) >= 0 for i in seen)
    after = engine.get_stats().phase_seconds
    for k in phases:
        assert after[k] - before.get(k, 0.0) == pytest.approx(sum(i.timings[k] for i in seen), rel=1e-6, abs=1e-9)
    assert after["forward"] > before.get("forward", 0.0)
    assert_idle(engine)


def test_profile_num_blocks_runs_the_budget_within_max_model_len(tmp_path, monkeypatch):
    """The GPU's KV sizing (`profile_num_blocks`) runs a forward of max_num_batched_tokens tokens: as prompts of at most
    max_model_len tokens, so that every position exists (on an H100 a single 2048-token prompt for a model of 256
    positions read past the rotary table). Run here on the CPU with CUDA's memory counters faked."""
    import types, torch
    from minivllm.core.model import ModelRunner, make_tiny_checkpoint
    make_tiny_checkpoint(tmp_path, "llama", max_position_embeddings=64)
    cfg = EngineArgs(model=str(tmp_path), max_model_len=64, max_num_batched_tokens=200, num_gpu_blocks_override=8).create_engine_config()
    runner = ModelRunner(cfg)
    seen = []
    forward = runner.model.forward
    monkeypatch.setattr(runner.model, "forward", lambda ids, pos, *a: (seen.append(int(pos.max())), forward(ids, pos, *a))[1])
    fake = types.SimpleNamespace(reset_peak_memory_stats=lambda d: None, synchronize=lambda d: None, empty_cache=lambda: None,
                                 max_memory_allocated=lambda d: 10 ** 8, mem_get_info=lambda d: (10 ** 10, 2 * 10 ** 10),
                                 memory_reserved=lambda d: 0)
    monkeypatch.setattr(torch, "cuda", fake)
    assert runner.profile_num_blocks() > 0
    assert seen == [63]   # 200 tokens as prompts of 64, 64, 64, 8: the largest position is max_model_len - 1


# ---------------------------------------------------------------- vLLM's spellings that scripts pass to LLM(...)

def test_vllm_default_spellings_reach_the_llm(caplog):
    """`LLM(max_num_seqs=None)` (vLLM's default) means minivllm's default; `enforce_eager=False` (vLLM's default, which
    scripts pass) on a model minivllm does not compile (here: speculative decoding) runs eagerly with a log line, and
    gives the plain engine's greedy tokens; `reset_prefix_cache` takes vLLM's arguments."""
    from minivllm import LLM
    kw = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=64)
    plain = LLM(max_num_seqs=None, **kw)
    assert plain.llm_engine.vllm_config.scheduler_config.max_num_seqs == 256
    sp = SamplingParams(temperature=0, max_tokens=12)
    want = plain.generate(PARIS, sp, use_tqdm=False)[0].outputs[0].token_ids
    with caplog.at_level(logging.WARNING, logger="minivllm"):
        spec = LLM(enforce_eager=False, speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **kw)
    assert any("runs eagerly" in r.getMessage() and "speculative" in r.getMessage() for r in caplog.records)
    assert spec.llm_engine.vllm_config.compilation_config.level == 0
    assert spec.generate(PARIS, sp, use_tqdm=False)[0].outputs[0].token_ids == want
    with pytest.raises(NotImplementedError, match="does not compile"):   # asking in so many words is refused
        LLM(compilation_config=3, speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **kw)
    # reset_prefix_cache(reset_running_requests=..., reset_connector=...): vLLM's signature
    plain.generate(PARIS, sp, use_tqdm=False)
    assert plain.reset_prefix_cache(reset_running_requests=True, reset_connector=True) is True
    plain.enqueue(PARIS, sp)
    plain.llm_engine.step(), plain.llm_engine.step()     # running: its blocks are in use
    assert plain.reset_prefix_cache() is False
    assert plain.reset_prefix_cache(reset_running_requests=True) is True     # preempted first (lesson 13b)
    assert [o.outputs[0].token_ids for o in plain.wait_for_completion(use_tqdm=False)] == [want]


def test_profiler_writes_a_trace(tmp_path):
    "vLLM's `profiler_config` + `LLM.start_profile()/stop_profile()`: a Chrome trace of the engine's work in the directory."
    import gzip, json
    from minivllm import LLM
    kw = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=16)
    llm = LLM(profiler_config={"profiler": "torch", "torch_profiler_dir": str(tmp_path)}, **kw)
    llm.start_profile()
    llm.generate(PARIS, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    llm.stop_profile()
    traces = list(tmp_path.glob("minivllm*.pt.trace.json.gz"))
    assert len(traces) == 1
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)   # the model's ops are in it
    with pytest.raises(RuntimeError, match="no profile is running"):
        llm.stop_profile()
    # vLLM's step bounds (run_one_batch_offline.py --profile prefill): the prefill step alone, written when it ends
    llm.start_profile("prefill", max_iterations=1)
    llm.generate(PARIS, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    bounded = list(tmp_path.glob("prefill*.pt.trace.json.gz"))
    assert len(bounded) == 1                                 # already written: it stopped itself after one step
    llm.stop_profile()
    steps = lambda p: sum(e.get("name") == "aten::embedding" for e in json.loads(gzip.decompress(p.read_bytes()))["traceEvents"])
    assert steps(bounded[0]) == 1 and steps(traces[0]) == 3    # one model forward against three
    with pytest.raises(ValueError, match="delay_iterations must be"):
        llm.start_profile(delay_iterations=-1)
    with pytest.raises(RuntimeError, match="profiler_config"):
        LLM(**kw).start_profile()
    with pytest.raises(NotImplementedError, match="profiler='cuda'"):
        EngineArgs(profiler_config={"profiler": "cuda", "torch_profiler_dir": str(tmp_path)})
