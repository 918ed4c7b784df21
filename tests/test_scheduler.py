"""The continuous-batching scheduler. With a fake model (no model): budget and max_num_seqs are never exceeded,
no request waits forever under a steady stream, FCFS order is kept, priorities are honoured (including an urgent
arrival preempting less urgent work), and preemption frees exactly the victim's blocks. With the real model: a
300+-token prompt is prefilled in 64-token chunks and gives the unchunked greedy tokens, and a small KV cache with
mixed priorities preempts and still gives the unconstrained greedy tokens."""
import random
import pytest
from minivllm.core.block_manager import check_invariants
from minivllm.core.config import SamplingParams
from minivllm.core.request import Request, RequestStatus
from minivllm.core.scheduler import make_scheduler, simulate


def urgency(r): return (r.priority, r.arrival_time)


def random_run(seed):
    "One random configuration and workload; checks every step, returns (scheduler, requests, trace)."
    rng = random.Random(seed)
    chunked, policy = rng.random() < 0.7, rng.choice(["fcfs", "priority"])
    budget, cap, bs = rng.choice([4, 8, 16, 32, 64]), rng.randint(1, 8), rng.choice([1, 2, 4, 16])
    max_len = budget if not chunked else rng.choice([48, 96])
    nb = rng.randint(max_len // bs + 1, 3 * max_len // bs + 4)
    sched = make_scheduler(nb, bs, cap, budget, chunked, policy, max_model_len=max_len, caching=rng.random() < 0.5)
    prefixes = [[rng.randrange(5) for _ in range(max_len // 3)] for _ in range(2)]
    def rq(i, t):
        p = rng.randint(1, max_len // 2)
        toks = (rng.choice(prefixes) + [rng.randrange(5) for _ in range(p)])[:p]
        return Request(f"q{i}", toks, SamplingParams(max_tokens=rng.randint(1, max_len - p), ignore_eos=True),
                       priority=rng.randint(0, 2) if policy == "priority" else 0, arrival_time=float(t))
    first = [rq(i, 0) for i in range(rng.randint(1, 10))]
    arrivals, k = {}, 100
    for s in sorted(rng.sample(range(60), 6)):
        arrivals[s] = [rq(k + j, s) for j in range(rng.randint(1, 3))]; k += 10
    everyone = first + [r for v in arrivals.values() for r in v]
    waiting_before = []                      # the waiting queue, in policy order, just before each schedule()
    real_schedule = sched.schedule
    def schedule():
        waiting_before.append([r.request_id for r in sched.waiting])
        return real_schedule()
    sched.schedule = schedule
    def on_step(step, s, out):
        assert out.total_num_scheduled_tokens <= budget, "over the token budget"
        assert len(out.seqs) <= cap and len(s.running) <= cap, "over max_num_seqs"
        assert out.token_budget == budget and len({q.req_id for q in out.seqs}) == len(out.seqs)
        for q in out.seqs:
            r = s.requests[q.req_id]
            assert q.start_pos == r.num_computed_tokens and q.num_tokens >= 1
            assert q.token_ids == r.all_token_ids[q.start_pos:q.start_pos + q.num_tokens]
            assert q.sample == (q.start_pos + q.num_tokens == r.num_tokens)
            assert len(q.block_ids) * bs >= q.start_pos + q.num_tokens
            if not chunked and q.is_prefill: assert q.sample, "a prompt was split with chunked prefill off"
        check_invariants(s.kv_cache_manager)
        new = [q.req_id for q in out.seqs if q.new]
        assert new == waiting_before[-1][:len(new)], "admission skipped a request ahead in the queue"
        if policy == "priority":
            # admitted requests are the most urgent of the queue; victims are the least urgent of the batch
            if new and len(s.waiting): assert max(urgency(s.requests[r]) for r in new) <= min(map(urgency, s.waiting))
            for v in out.preempted_req_ids:
                assert all(urgency(r) <= urgency(s.requests[v]) for r in s.running), "preempted a more urgent request"
    trace = simulate(sched, first, arrivals, on_step=on_step)
    for r in everyone:
        assert r.is_finished() and r.num_output_tokens == r.sampling_params.max_tokens, r
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == nb
    return sched, everyone, trace


def test_random_schedules_respect_limits_and_order():
    preemptions = prio_preemptions = 0
    for seed in range(120):
        sched, everyone, trace = random_run(seed)
        preemptions += sched.num_preemptions
        prio_preemptions += sched.policy == "priority" and any(o.preempted_req_ids and any(q.new for q in o.seqs) for o in trace)
    assert preemptions > 100 and prio_preemptions > 3, (preemptions, prio_preemptions)


def test_preemption_frees_exactly_the_victims_blocks():
    "Spy on kv.free during schedule(): only victims free, exactly the blocks they held; nobody else loses blocks."
    total = 0
    for seed in range(30):
        rng = random.Random(seed)
        sched = make_scheduler(num_blocks=rng.randint(10, 16), block_size=4, max_num_seqs=rng.randint(2, 6), max_num_batched_tokens=16,
                               policy=rng.choice(["fcfs", "priority"]), caching=rng.random() < 0.5, max_model_len=40)
        freed, real_free = [], sched.kv_cache_manager.free
        def spy(r):
            held, before = sched.kv_cache_manager.get_block_ids(r.request_id), [b.ref_cnt for b in sched.kv_cache_manager.block_pool.blocks]
            real_free(r)
            after = [b.ref_cnt for b in sched.kv_cache_manager.block_pool.blocks]
            assert [i for i in range(len(before)) if before[i] != after[i]] == sorted(held)    # exactly its blocks...
            assert all(before[i] - after[i] == 1 for i in held)                              # ...one reference each
            freed.append((r.request_id, held))
        sched.kv_cache_manager.free = spy
        rs = [Request(f"x{i}", [rng.randrange(4) for _ in range(rng.randint(2, 16))], SamplingParams(max_tokens=rng.randint(4, 20), ignore_eos=True),
                      priority=rng.randint(0, 2) if sched.policy == "priority" else 0, arrival_time=float(i)) for i in range(8)]
        pending = {3 * i: [r] for i, r in enumerate(rs)}
        step = 0
        while step <= max(pending) or sched.has_unfinished_requests():
            for r in pending.get(step, []): sched.add_request(r)
            tables = {rid: sched.kv_cache_manager.get_block_ids(rid) for rid in sched.kv_cache_manager.req_to_blocks}
            freed.clear()
            out = sched.schedule()
            assert [rid for rid, _ in freed] == out.preempted_req_ids
            for rid, ids in freed:
                assert ids == tables[rid] and sched.kv_cache_manager.get_block_ids(rid) == []
            for rid, ids in tables.items():
                if rid not in out.preempted_req_ids: assert sched.kv_cache_manager.get_block_ids(rid)[:len(ids)] == ids
            total += len(out.preempted_req_ids)
            sched.update_from_output(out, {s.req_id: [1] for s in out.seqs if s.sample})
            step += 1
        assert all(r.num_output_tokens == r.sampling_params.max_tokens for r in rs)
    assert total > 20, total


@pytest.mark.parametrize("seed", range(4))
def test_no_starvation_under_a_steady_stream(seed):
    rng = random.Random(seed)
    sched = make_scheduler(num_blocks=40, block_size=4, max_num_seqs=6, max_num_batched_tokens=32)
    arrivals, arrived = {}, {}
    for k, step in enumerate(range(0, 600, 3)):
        p = rng.randint(4, 40)
        r = Request(f"s{k}", [rng.randrange(1000) for _ in range(p)], SamplingParams(max_tokens=rng.randint(2, 24), ignore_eos=True))
        arrivals[step] = [r]; arrived[r.request_id] = step
    done = {}
    trace = simulate(sched, [], arrivals, on_update=lambda i, o, u: done.update(dict.fromkeys(u.finished_req_ids, i)))
    assert set(done) == set(arrived)
    waits = [done[f"s{k}"] - arrived[f"s{k}"] for k in range(len(arrived))]
    assert sched.num_preemptions > 0
    assert max(waits) < 100 and max(waits[-50:]) < 2 * max(waits[:50]) + 10, (max(waits[:50]), max(waits[-50:]))
    first = {}
    for i, o in enumerate(trace):
        for s in o.seqs: first.setdefault(s.req_id, i)
    assert sorted(first, key=lambda r: (first[r], int(r[1:]))) == [f"s{k}" for k in range(len(arrived))]   # FCFS


def test_priority_admission_order_and_ties():
    rs = [Request(f"{p}@{t}", [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), priority=p, arrival_time=t)
          for p, t in [(1, 0.0), (0, 3.0), (1, 1.0), (0, 2.0), (2, 0.5), (-1, 9.0)]]
    trace = simulate(make_scheduler(max_num_seqs=1, policy="priority"), rs)
    order = list(dict.fromkeys(s.req_id for o in trace for s in o.seqs))
    assert order == ["-1@9.0", "0@2.0", "0@3.0", "1@0.0", "1@1.0", "2@0.5"]


@pytest.mark.parametrize("policy,urgent_priority,expect_preempt", [("priority", 0, True), ("priority", 1, False), ("fcfs", 0, False)])
def test_urgent_arrival_preempts_only_with_priority(policy, urgent_priority, expect_preempt):
    sched = make_scheduler(num_blocks=12, block_size=4, policy=policy, caching=False)
    lows = [Request(f"low{i}", list(range(10)), SamplingParams(max_tokens=14, ignore_eos=True), priority=1 if policy == "priority" else 0,
                    arrival_time=float(i)) for i in range(2)]
    urgent = Request("urgent", list(range(50, 70)), SamplingParams(max_tokens=6, ignore_eos=True),
                     priority=urgent_priority if policy == "priority" else 0, arrival_time=10.0)
    trace = simulate(sched, lows, arrivals={3: [urgent]})
    admitted = next(i for i, o in enumerate(trace) if any(s.req_id == "urgent" for s in o.seqs))
    if expect_preempt:
        assert admitted == 3 and trace[3].preempted_req_ids == ["low1"]
        assert "urgent" not in {v for o in trace for v in o.preempted_req_ids}
    else:
        assert admitted > 3 and not trace[3].preempted_req_ids
    assert [r.num_output_tokens for r in lows + [urgent]] == [14, 14, 6]


def test_preempted_request_resumes_with_its_tokens():
    sched = make_scheduler(num_blocks=8, caching=False)
    rs = [Request(f"r{i}", list(range(6)), SamplingParams(max_tokens=8, ignore_eos=True)) for i in range(4)]
    def token(r):   # a fake model whose next token depends on the whole sequence so far
        return (sum(r.all_token_ids) * 31 + r.num_tokens) % 97
    trace = simulate(sched, rs, token=token)
    assert sched.num_preemptions > 0
    for r in rs:   # the same tokens as if it had run alone
        alone = Request("x", list(range(6)), SamplingParams(max_tokens=8, ignore_eos=True))
        simulate(make_scheduler(num_blocks=64), [alone], token=token)
        assert r.output_token_ids == alone.output_token_ids
    resumed = [s for o in trace for s in o.seqs if s.new and s.start_pos == 0 and s.num_tokens > 6]
    assert resumed, "a preempted request should be recomputed from prompt + generated tokens"


def test_scheduler_output_reports_the_step():
    sched = make_scheduler(max_num_batched_tokens=16)
    rs = [Request("a", list(range(5)), SamplingParams(max_tokens=2, ignore_eos=True)),
          Request("b", list(range(100, 130)), SamplingParams(max_tokens=1, ignore_eos=True))]   # no prefix shared with a
    upds = []
    trace = simulate(sched, rs, on_update=lambda i, o, u: upds.append(u))
    o0, o1 = trace[0], trace[1]
    assert o0.num_scheduled_tokens == {"a": 5, "b": 11} and o0.prefill_req_ids == ["a", "b"] and o0.decode_req_ids == []
    assert [s.new for s in o0.seqs] == [True, True] and [s.sample for s in o0.seqs] == [True, False]
    assert o1.num_scheduled_tokens == {"a": 1, "b": 15} and o1.decode_req_ids == ["a"] and upds[1].finished_req_ids == ["a"]
    assert upds[1].new_token_ids == {"a": [7]} and upds[1].updated == [rs[0]]   # b still reads its prompt
    assert trace[2].finished_req_ids == ["a"]
    assert o0.token_budget == 16 and 0 < o0.kv_usage <= 1
    assert "prefill" in o0.summary() and "decode" in o1.summary()


# ---------------------------------------------------------------------------------------------------------------
# The real model
# ---------------------------------------------------------------------------------------------------------------

from minivllm import LLMEngine, EngineArgs, TokensPrompt   # noqa: E402

STORY = "The old lighthouse keeper climbed the stairs every evening to light the lamp. "


@pytest.fixture(scope="module")
def baseline():
    "Unconstrained: a big budget (no chunking), plenty of blocks, no prefix caching."
    return LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=512, num_gpu_blocks_override=128, enable_prefix_caching=False))


def run(engine, requests, arrivals=None):
    "requests: (id, token ids, params, priority); arrivals: {step: [...]}. Returns ({id: token ids}, trace, finished)."
    trace, fins, done, step, arrivals = [], [], {}, 0, arrivals or {}
    def watch(info):      # a step observer: every step's scheduler decision and the requests it finished
        trace.append(info.scheduler_output)
        fins.append(info.finished_req_ids)
    engine.step_observers.append(watch)
    for rid, ids, sp, prio in requests: engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), sp, priority=prio)
    while engine.has_unfinished_requests() or step <= max(arrivals, default=-1):
        for rid, ids, sp, prio in arrivals.get(step, []): engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), sp, priority=prio)
        for o in engine.step():
            if o.finished: done[o.request_id] = o.outputs[0].token_ids
        step += 1
    engine.step_observers.remove(watch)
    return done, trace, fins


def test_chunked_prefill_gives_the_unchunked_tokens(baseline, tokenizer):
    long_ids = tokenizer(STORY * 22 + "What did the keeper do every evening?").input_ids
    short_ids = tokenizer("The capital of France is").input_ids
    assert len(long_ids) >= 300, len(long_ids)
    sp = SamplingParams(temperature=0, max_tokens=10)
    chunked = LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=512, num_gpu_blocks_override=64, max_num_batched_tokens=64,
                                                    enable_prefix_caching=False))
    got, trace, fins = run(chunked, [("short", short_ids, sp, 0)], {1: [("long", long_ids, sp, 0)]})
    chunks = [(i, s) for i, o in enumerate(trace) for s in o.seqs if s.req_id == "long" and s.is_prefill]
    assert len(chunks) >= -(-len(long_ids) // 64) and all(s.num_tokens <= 64 for _, s in chunks)
    assert [s.start_pos for _, s in chunks] == [sum(c.num_tokens for _, c in chunks[:k]) for k in range(len(chunks))]
    assert sum(s.num_tokens for _, s in chunks) == len(long_ids)
    assert [s.sample for _, s in chunks] == [False] * (len(chunks) - 1) + [True]     # only the last chunk samples
    short_done = next(i for i, f in enumerate(fins) if "short" in f)
    overlap = [i for i, _ in chunks if i <= short_done]
    assert len(overlap) >= 3 and all(trace[i].num_scheduled_tokens["short"] == 1 for i in overlap), "decodes starved by the long prompt"
    assert all(o.total_num_scheduled_tokens <= 64 for o in trace)
    ref, *_ = run(baseline, [("short", short_ids, sp, 0), ("long", long_ids, sp, 0)])
    assert got == ref


def test_small_cache_with_priorities_gives_the_unconstrained_tokens(baseline, tokenizer):
    chat = lambda t: tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=True)["input_ids"]
    lows = [("chat-0", chat("Name three colours."), 24), ("long", chat(STORY * 8 + "Summarize the story."), 16),
            ("chat-1", chat("What is 2 + 2?"), 30), ("chat-2", chat("Say hello in French."), 28)]
    urgent = ("urgent", chat("The tide tables of the harbour are printed every month by the port office. " * 4 +
                             "Explain in two sentences why the sea has two high tides every day."), 12)
    g = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    small = LLMEngine.from_engine_args(EngineArgs(dtype="float32", num_gpu_blocks_override=18, block_size=16, max_model_len=288,
                                                  max_num_batched_tokens=64, scheduling_policy="priority"))
    got, trace, fins = run(small, [(r, ids, g(n), 1) for r, ids, n in lows], {12: [(urgent[0], urgent[1], g(urgent[2]), 0)]})
    admitted = next(i for i, o in enumerate(trace) if "urgent" in o.num_scheduled_tokens)
    assert admitted == 12 and trace[admitted].preempted_req_ids, "the urgent arrival should preempt a less urgent request"
    victims = [v for o in trace for v in o.preempted_req_ids]
    assert small.scheduler.num_preemptions == len(victims) >= 2 and "urgent" not in victims
    finished_at = {r: i for i, f in enumerate(fins) for r in f}
    assert all(finished_at["urgent"] < finished_at[r] for r in ("chat-1", "chat-2"))
    ref, *_ = run(baseline, [(r, ids, g(n), 0) for r, ids, n in lows + [urgent]])
    assert got == ref
    kv = small.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks
