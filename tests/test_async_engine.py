"""AsyncLLMEngine on the embedded SmolLM2: 32 concurrent `generate` iterators (8 of them aborted midway, in four
different ways) give exactly the sync `LLMEngine`'s text; bad requests fail alone; the event loop keeps ticking while
the model runs; all KV blocks are free afterwards; a step that raises fails its own requests; a failure the engine
cannot survive surfaces as `EngineDeadError`, not a hang."""
import asyncio, gc, time
import pytest, torch
from minivllm import LLMEngine, EngineArgs, SamplingParams, TokensPrompt, RequestOutputKind
from minivllm.serve.async_engine import AsyncLLMEngine, EngineDeadError

pytestmark = pytest.mark.xdist_group("async")

DELTA, CUMULATIVE, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY
MAX_LEN = 256
WORDS = ("the quick brown fox jumps over a lazy dog while seven tired engineers watch the kv cache fill up "
         "block by block and wonder why paged attention works so well on such a small model").split()




@pytest.fixture(scope="module")
def llm_engine():
    "One sync engine, shared: the async engines below wrap it (one at a time), the reference runs on it directly."
    return LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=MAX_LEN, num_gpu_blocks_override=300))


def prompt(i: int) -> str:
    "Mixed lengths: from 3 to ~50 words."
    n = 3 + (i * 17) % 45
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n)) + f" ({i})"


def params(i: int, kind=CUMULATIVE) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=8 + (i * 5) % 17, output_kind=kind)


def sync_texts(engine: LLMEngine, requests: dict) -> dict:
    "The sync engine's final (text, token ids) for each `id: (prompt, params)`."
    for rid, (p, sp) in requests.items(): engine.add_request(rid, p, sp)
    out = {}
    while engine.has_unfinished_requests():
        out.update({o.request_id: (o.outputs[0].text, o.outputs[0].token_ids) for o in engine.step() if o.finished})
    return out


def assert_idle(e: LLMEngine):
    kv = e.kv_cache_manager
    assert not e.has_unfinished_requests() and e.get_num_unfinished_requests() == 0
    assert not e.scheduler.running and not e.scheduler.waiting and not e.output_processor.requests
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks


def test_32_streams_aborts_errors_heartbeat(llm_engine):
    kinds = [DELTA, CUMULATIVE, FINAL_ONLY, DELTA]
    complete = {f"c{i}": (prompt(i), params(i, kinds[i % 4])) for i in range(24)}
    ref = sync_texts(llm_engine, {rid: (p, params(i)) for i, (rid, (p, _)) in enumerate(complete.items())})
    assert_idle(llm_engine)
    long = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True, output_kind=DELTA)
    engine = AsyncLLMEngine(llm_engine)

    async def consume(rid, p, sp):
        "Join a stream into its final (text, token ids); check deltas/cumulative outputs on the way."
        text, toks, n, last = "", [], 0, None
        async for out in engine.generate(p, sp, rid):
            c, n, last = out.outputs[0], n + 1, out
            assert out.request_id == rid
            if sp.output_kind == DELTA: text, toks = text + c.text, toks + list(c.token_ids)
            else:
                assert c.text.startswith(text) and c.token_ids[:len(toks)] == toks   # cumulative: it only grows
                text, toks = c.text, list(c.token_ids)
        assert last.finished and (n == 1 or sp.output_kind != FINAL_ONLY)
        return text, toks, last.outputs[0].finish_reason

    async def abort_after(rid, k):          # 3 of these: engine.abort(id) from outside, after k pieces
        n, last = 0, None
        async for out in engine.generate(prompt(40 + k), long, rid):
            n, last = n + 1, out
            if n == k: await engine.abort(rid)
        return n, last.finished, last.outputs[0].finish_reason

    async def close_after(rid, k):          # 2: break out and aclose() the iterator
        it = engine.generate(prompt(50 + k), long, rid)
        n = 0
        async for _ in it:
            n += 1
            if n == k: break
        await it.aclose()
        return n

    async def drop_after(rid, k):           # 1: break out and drop the iterator (the loop's async-gen finalizer closes it)
        n = 0
        async for _ in engine.generate(prompt(60 + k), long, rid):
            n += 1
            if n == k: break
        return n

    async def cancelled_after(rid, k, got):  # 2: the consumer's task is cancelled (a client went away)
        async for _ in engine.generate(prompt(70 + k), long, rid):
            got[rid] = got.get(rid, 0) + 1

    async def bad(p, sp, rid, **kw):
        try:
            async for _ in engine.generate(p, sp, rid, **kw): pass
        except (ValueError, TypeError) as e: return str(e)
        return None

    async def heartbeat(stop, beats):
        while not stop.is_set():
            beats.append(time.perf_counter())
            await asyncio.sleep(0.005)

    async def main():
        stop, beats, got = asyncio.Event(), [], {}
        hb = asyncio.create_task(heartbeat(stop, beats))
        good = [asyncio.create_task(consume(rid, p, sp)) for rid, (p, sp) in complete.items()]
        aborted = [asyncio.create_task(abort_after(f"a{k}", k)) for k in (2, 3, 4)]
        closed = [asyncio.create_task(close_after(f"x{k}", k)) for k in (2, 5)]
        dropped = asyncio.create_task(drop_after("d3", 3))
        cancelled = [asyncio.create_task(cancelled_after(f"k{k}", k, got)) for k in (1, 2)]
        errors = await asyncio.gather(
            bad(TokensPrompt(prompt_token_ids=[7] * (MAX_LEN + 10)), params(0), "too-long"),
            bad(TokensPrompt(prompt_token_ids=[1, 2, 10 ** 7]), params(0), "out-of-vocab"),
            bad("Hello", {"temperature": 0}, "params-not-sp"),
            bad("Hello", params(0), "prio", priority=3),
            bad("Hello", params(0), "c0"),                     # c0 is running: its id is taken
            bad("Hello", SamplingParams(max_tokens=4, logprobs=50), "too-many-logprobs"))   # > max_logprobs (20)
        while len(got) < 2 or min(got.values()) < 3: await asyncio.sleep(0.01)
        for t in cancelled: t.cancel()
        res = await asyncio.gather(*good)
        other = await asyncio.gather(*aborted, *closed, dropped)
        await asyncio.gather(*cancelled, return_exceptions=True)
        gc.collect()
        await engine.wait_for_requests_to_drain(60)
        stop.set(); await hb
        return res, other, errors, beats, cancelled

    t0 = time.perf_counter()
    try: res, other, errors, beats, cancelled = asyncio.run(main())
    finally: engine.shutdown()
    t1 = time.perf_counter()
    steps = [(a, b) for a, b, _ in engine.step_times]    # when each engine step ran (timed by the engine thread)

    # the 24 complete streams: exactly the sync engine's text and tokens
    for rid, (text, toks, fr) in zip(complete, res):
        assert (text, toks) == ref[rid], rid
        assert fr in ("length", "stop")
    # the 8 aborted ones stopped early; the ones aborted from outside ended with finish_reason "abort"
    assert [o[1:] for o in other[:3]] == [(True, "abort")] * 3 and all(o[0] < 20 for o in other[:3])
    assert other[3:] == [2, 5, 3] and all(t.cancelled() for t in cancelled)
    # each bad request raised its own, precise error
    assert "maximum model length" in errors[0] and "vocabulary" in errors[1] and "SamplingParams" in errors[2]
    assert "priority" in errors[3] and "already in use" in errors[4] and "logprobs" in errors[5]
    # nothing left: no request, no stream, every KV block free
    assert_idle(llm_engine)
    assert not engine._streams
    # the event loop stayed responsive: heartbeats kept coming *while* the model ran in the engine thread
    busy = [(a, b) for a, b in steps if b - a > 0.03]
    hit = [any(a < t < b for t in beats) for a, b in busy]
    assert len(busy) >= 5 and sum(hit) >= 0.8 * len(busy), (len(busy), sum(hit))
    span = steps[-1][1] - steps[0][0]
    gaps = [b - a for a, b in zip(beats, beats[1:]) if steps[0][0] <= a <= steps[-1][1]]
    # no heartbeat waited longer than a quarter of the run, or than two of the engine's longest steps (on a loaded
    # machine the whole process can be descheduled for a second: the step in progress stretches with the gap)
    longest = max(b - a for a, b in steps)
    assert max(gaps) < max(0.25 * span, 2 * longest), (max(gaps), span, longest)
    print(f"\n32 streams: {len(steps)} steps in {span:.2f}s ({t1 - t0:.2f}s in all); {len(beats)} heartbeats, "
          f"max gap {1000 * max(gaps):.0f} ms; {sum(hit)}/{len(busy)} steps > 30 ms saw a heartbeat")


def test_api_and_output_kinds(llm_engine):
    engine = AsyncLLMEngine(llm_engine)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    ref = sync_texts(llm_engine, {"r": ("The capital of France is", sp)})["r"]

    async def main():
        assert engine.is_running and not engine.errored
        await engine.check_health()
        tok, mc = await engine.get_tokenizer(), await engine.get_model_config()
        assert tok is llm_engine.get_tokenizer() and mc.max_model_len == MAX_LEN
        outs = {}
        for kind in (DELTA, CUMULATIVE, FINAL_ONLY):
            p = sp.clone(); p.output_kind = kind
            outs[kind] = [o async for o in engine.generate("The capital of France is", p, f"r-{kind.name}")]
        ids = tok("The capital of France is").input_ids      # a token prompt, with the text to report given aside
        pt = [o async for o in engine.generate(TokensPrompt(prompt_token_ids=ids), SamplingParams(temperature=0, max_tokens=2),
                                               "tokens", prompt_text="The capital of France is")]
        assert pt[-1].prompt == "The capital of France is" and pt[-1].prompt_token_ids == ids
        assert pt[-1].outputs[0].token_ids == ref[1][:2]
        stats = await engine.get_stats()
        await engine.do_log_stats()
        return outs, stats

    try: outs, stats = asyncio.run(main())
    finally: engine.shutdown()
    d, c, f = outs[DELTA], outs[CUMULATIVE], outs[FINAL_ONLY]
    assert "".join(o.outputs[0].text for o in d) == c[-1].outputs[0].text == f[0].outputs[0].text == ref[0]
    assert [t for o in d for t in o.outputs[0].token_ids] == c[-1].outputs[0].token_ids == ref[1] and len(ref[1]) == 10
    # one output per step (10), or fewer if the consumer fell behind and outputs were merged; only the last is final
    assert 1 < len(d) <= 10 and 1 < len(c) <= 10 and len(f) == 1 and [o.finished for o in d] == [False] * (len(d) - 1) + [True]
    lens = [len(o.outputs[0].token_ids) for o in c]
    assert lens == sorted(set(lens)) and lens[-1] == 10 and [o.finished for o in c][-1]
    assert stats.num_running_reqs == 0 and stats.kv_cache_usage == 0
    # after shutdown: not running, every call raises EngineDeadError
    assert not engine.is_running and engine.errored and isinstance(engine.dead_error, EngineDeadError)
    async def after():
        with pytest.raises(EngineDeadError): await engine.check_health()
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("Hi", sp, "late"): pass
    asyncio.run(after())
    assert_idle(llm_engine)


def test_step_failure_fails_its_requests_alone(llm_engine, monkeypatch):
    """An exception inside step() ends the requests that step ran with EngineGenerateError (their blocks freed);
    a request that was not in it, and later ones, run on: the engine is not dead."""
    from minivllm.serve.async_engine import EngineGenerateError
    engine = AsyncLLMEngine(llm_engine)
    calls, step = [0], llm_engine.step
    def failing_step():
        calls[0] += 1
        if calls[0] == 4: raise RuntimeError("simulated fault")
        return step()
    monkeypatch.setattr(llm_engine, "step", failing_step)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)

    async def one(rid, p="Tell me a story."):
        n = 0
        try:
            async for _ in engine.generate(p, long, rid): n += 1
        except EngineGenerateError as e: return n, e
        return n, None

    async def main():
        res = await asyncio.wait_for(asyncio.gather(one("a"), one("b")), 30)
        later = await asyncio.wait_for(one("c", "Hello"), 60)
        await engine.check_health()
        return res, later
    res, later = asyncio.run(main())
    assert all(n < 50 and isinstance(e, EngineGenerateError) and "simulated fault" in str(e) for n, e in res)
    assert isinstance(res[0][1].__cause__, RuntimeError) and engine.is_running and not engine.errored
    assert later[0] > 0 and later[1] is None
    engine.shutdown()
    monkeypatch.undo()
    assert_idle(llm_engine)


def test_fatal_step_failure_is_engine_dead_error(llm_engine, monkeypatch):
    """A step failure the engine cannot survive (its workers gone) ends every open stream with EngineDeadError
    (no hang); the blocks are freed, and the engine reports itself failed."""
    import minivllm.serve.async_engine as ae
    engine = AsyncLLMEngine(llm_engine)
    calls, step = [0], llm_engine.step
    def failing_step():
        calls[0] += 1
        if calls[0] == 4: raise RuntimeError("simulated device failure")
        return step()
    monkeypatch.setattr(llm_engine, "step", failing_step)
    monkeypatch.setattr(ae, "engine_failure", lambda e: "the workers are gone (simulated)")
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)

    async def one(rid):
        n = 0
        try:
            async for _ in engine.generate("Tell me a story.", long, rid): n += 1
        except EngineDeadError as e: return n, e
        return n, None

    async def main():
        res = await asyncio.wait_for(asyncio.gather(one("a"), one("b")), 30)
        with pytest.raises(EngineDeadError): await engine.check_health()
        return res
    res = asyncio.run(main())
    assert all(n < 50 and isinstance(e, EngineDeadError) and "simulated device failure" in str(e) for n, e in res)
    assert isinstance(res[0][1].__cause__, RuntimeError) and engine.errored and engine.failed and not engine.is_running
    engine.shutdown()
    monkeypatch.undo()
    assert_idle(llm_engine)


def test_a_failing_new_request_fails_alone(llm_engine, monkeypatch):
    """A step that raises for one new request (here: whenever request "bad" is in the batch) ends that request alone
    with EngineGenerateError; the three streams running beside it finish with their finish_reason and exactly the
    text they have without the fault (they are recomputed from their tokens)."""
    from minivllm.serve.async_engine import EngineGenerateError
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ps = {rid: prompt(i) for i, rid in enumerate("abc")}
    ref = sync_texts(llm_engine, {rid: (p, sp) for rid, p in ps.items()})
    core, execute = llm_engine.engine_core, llm_engine.engine_core.execute
    def faulty(out, timer):
        if any(s.req_id == "bad" for s in out.seqs): raise RuntimeError("simulated fault in request bad")
        return execute(out, timer)
    monkeypatch.setattr(core, "execute", faulty)
    engine = AsyncLLMEngine(llm_engine)
    progress = {rid: 0 for rid in ps}

    async def one(rid, p):
        out = None
        try:
            async for out in engine.generate(p, sp, rid): progress[rid] = len(out.outputs[0].token_ids)
        except EngineGenerateError as e: return e
        return out.outputs[0]

    async def main():
        tasks = [asyncio.create_task(one(rid, p)) for rid, p in ps.items()]
        while min(progress.values()) < 3: await asyncio.sleep(0.005)   # all three running, a few tokens in
        bad = await asyncio.wait_for(one("bad", "Hello there"), 60)
        return bad, await asyncio.wait_for(asyncio.gather(*tasks), 120)
    bad, outs = asyncio.run(main())
    assert isinstance(bad, EngineGenerateError) and "simulated fault" in str(bad.__cause__), bad
    assert all(not isinstance(o, Exception) for o in outs), outs
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert {rid: (o.text, list(o.token_ids)) for rid, o in zip(ps, outs)} == {rid: (t, list(ids)) for rid, (t, ids) in ref.items()}
    assert engine.is_running
    engine.shutdown()
    monkeypatch.undo()
    assert_idle(llm_engine)
