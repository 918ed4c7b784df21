"""The sampler (nbs/06_sampler): synthetic checks of a mixed batch against each row alone and against plain references,
then every `SamplingParams` knob on the real model (SmolLM2-135M) through the public API, compared with HF transformers.

The real-model tests share one `LLM` and run their requests in as few `generate` calls as possible (one batch for all
the knobs). The last tests check what the engine carries from the sampler: logprobs into `CompletionOutput`, prompt
logprobs from the model runner, bad-word tokenization in the processor, and `LLM.beam_search`."""
import math, random
import pytest, torch
from minivllm import LLM, SamplingParams, TokensPrompt
from minivllm.core.request import Request
from minivllm.core.arg_utils import tokenize_bad_words
from minivllm.core.sampler import Sampler, SamplingMetadata, gather_logprobs, compute_logprobs, apply_top_k_top_p
from minivllm.features.sampling_more import apply_min_p
from minivllm.features.sampling_more import BeamSearchParams, beam_search, prompt_logprobs_from_logits, get_beam_search_score

pytestmark = pytest.mark.xdist_group("sampler")  # one worker builds its module fixtures (engines, checkpoints) once

EOS = 2


# ---------------------------------------------------------------- synthetic: the batch is the sum of its rows
def random_params(rng: random.Random, V: int) -> SamplingParams:
    kw = dict(temperature=rng.choice([0.0, 0.5, 1.0, 1.7]), max_tokens=64)
    if kw["temperature"] > 0:
        kw.update(seed=rng.randrange(1 << 30))
        if rng.random() < 0.5: kw["top_k"] = rng.choice([-1, 0, 1, 3, 10, V])
        if rng.random() < 0.5: kw["top_p"] = rng.choice([0.3, 0.8, 0.95, 1.0])
        if rng.random() < 0.4: kw["min_p"] = rng.choice([0.0, 0.05, 0.2])
    if rng.random() < 0.4: kw["repetition_penalty"] = rng.choice([0.7, 1.0, 1.3, 2.0])
    if rng.random() < 0.4: kw["frequency_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.4: kw["presence_penalty"] = rng.uniform(-2, 2)
    if rng.random() < 0.3: kw["logit_bias"] = {rng.randrange(V): rng.uniform(-5, 5) for _ in range(3)}
    if rng.random() < 0.2: kw["allowed_token_ids"] = rng.sample(range(V), 5)
    if rng.random() < 0.3: kw.update(min_tokens=rng.choice([5, 40]), stop_token_ids=[rng.randrange(V)])
    if rng.random() < 0.3: kw["logprobs"] = rng.choice([0, 2, 5])
    sp = SamplingParams(**kw)
    if rng.random() < 0.2:
        sp.bad_words = ["w"]; sp._bad_words_token_ids = [[rng.randrange(V)], [3, 4]]
    return sp


def make_request(i, sp, prompt, output):
    r = Request(str(i), prompt, sp, eos_token_id=0)
    r.append_output_token_ids(output)
    return r


def test_mixed_batch_equals_each_row_alone():
    "60 requests with random knobs: every row's token (and logprobs) is the one it gets alone; seeds make random rows comparable."
    rng, V = random.Random(0), 64
    specs = [(random_params(rng, V), [rng.randrange(1, V) for _ in range(rng.randrange(1, 20))],
              [rng.randrange(V) for _ in range(rng.randrange(0, 30))] + [3]) for _ in range(60)]
    logits = torch.randn(len(specs), V, generator=torch.Generator().manual_seed(1)) * 4
    batch = [make_request(i, *s) for i, s in enumerate(specs)]
    out = Sampler()(logits, SamplingMetadata.from_requests(batch))
    lp = out.logprobs_tensors
    assert lp is not None
    for i, s in enumerate(specs):
        alone = Sampler()(logits[i:i + 1], SamplingMetadata.from_requests([make_request(i, *s)]))
        assert out.sampled_token_ids[i] == alone.sampled_token_ids[0], (i, s[0])
        if s[0].logprobs is not None:
            k = s[0].logprobs + 1
            assert torch.equal(lp.logprob_token_ids[i, :k], alone.logprobs_tensors.logprob_token_ids[0, :k])
            assert torch.equal(lp.selected_token_ranks[i], alone.logprobs_tensors.selected_token_ranks[0])
            torch.testing.assert_close(lp.logprobs[i, :k], alone.logprobs_tensors.logprobs[0, :k], rtol=0, atol=1e-6)


def test_greedy_rows_take_the_argmax_of_the_reference_logits():
    "Greedy rows with masks, bias, bad words, min_tokens and penalties pick the argmax of a plain per-token reference."
    rng, V = random.Random(1), 50
    reqs, logits = [], torch.randn(40, V, generator=torch.Generator().manual_seed(2)) * 3
    for i in range(40):
        sp = random_params(rng, V)
        sp = SamplingParams(**{**{k: getattr(sp, k) for k in ("repetition_penalty", "frequency_penalty", "presence_penalty",
                                                                "logit_bias", "allowed_token_ids", "min_tokens", "stop_token_ids")},
                               "temperature": 0.0, "max_tokens": 64})
        reqs.append(make_request(i, sp, [rng.randrange(1, V) for _ in range(8)], [rng.randrange(V) for _ in range(10)]))
    got = Sampler()(logits, SamplingMetadata.from_requests(reqs)).sampled_token_ids
    for i, r in enumerate(reqs):
        sp, l = r.sampling_params, logits[i].clone()
        if sp.allowed_token_ids is not None:
            l[[t for t in range(V) if t not in sp.allowed_token_ids]] = float("-inf")
        if r.num_output_tokens < sp.min_tokens: l[sp.stop_token_ids + [0]] = float("-inf")
        for t, b in (sp.logit_bias or {}).items(): l[t] += b
        for t in set(r.prompt_token_ids) | set(r.output_token_ids):
            l[t] = l[t] / sp.repetition_penalty if l[t] > 0 else l[t] * sp.repetition_penalty
        for t in set(r.output_token_ids):
            l[t] -= sp.frequency_penalty * r.output_token_ids.count(t) + sp.presence_penalty
        assert got[i] == l.argmax(), i


def chi2_pvalue(counts, probs):
    n = counts.sum().item()
    sup = [i for i, p in enumerate(probs) if p > 0]
    stat = sum((counts[i].item() - n * probs[i]) ** 2 / (n * probs[i]) for i in sup)
    return torch.special.gammaincc(torch.tensor((len(sup) - 1) / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)).item()


@pytest.mark.parametrize("kw", [dict(temperature=0.6, top_p=0.7), dict(temperature=1.3, min_p=0.02, top_k=12),
                                dict(temperature=1.0, top_k=5, top_p=0.9, min_p=0.1)])
def test_distribution_over_a_larger_vocabulary(kw):
    "20,000 draws over 100 tokens match the distribution that a plain sort-and-sum reference predicts (chi-square, p > 0.001)."
    base = torch.randn(100, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    p = (base / kw["temperature"]).softmax(-1)
    keep = p >= kw.get("min_p", 0.0) * p.max()
    order = [i for i in p.argsort(descending=True).tolist() if keep[i]][:kw.get("top_k", 0) or None]
    mass, kept = p[order].sum().item(), []
    for i in order:
        kept.append(i)
        if p[kept].sum().item() / mass >= kw.get("top_p", 1.0): break
    assert len(kept) >= 4, kept
    want = torch.zeros(100, dtype=torch.float64); want[kept] = p[kept] / p[kept].sum()
    N = 20000
    torch.manual_seed(4)
    reqs = [Request(str(i), [1], SamplingParams(**kw)) for i in range(N)]
    draws = Sampler()(base.float().expand(N, 100).contiguous(), SamplingMetadata.from_requests(reqs)).sampled_token_ids
    counts = torch.bincount(draws, minlength=100)
    assert counts[want == 0].sum() == 0
    assert chi2_pvalue(counts, want.tolist()) > 1e-3


def test_logprobs_only_where_asked_and_raw():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(5))
    ps = [SamplingParams(temperature=0), SamplingParams(temperature=0.3, logprobs=4, seed=1), SamplingParams(),
          SamplingParams(temperature=0, logprobs=0, logit_bias={7: 50.0}), SamplingParams(temperature=2.0, logprobs=-1)]
    out = Sampler()(logits, SamplingMetadata.from_requests([Request(str(i), [1], p) for i, p in enumerate(ps)]))
    lt, raw = out.logprobs_tensors, logits.log_softmax(-1)
    assert lt.logprobs.shape == (5, 31)                                  # -1: the whole vocabulary
    assert (lt.logprobs[[0, 2]] == 0).all() and (lt.selected_token_ranks[[0, 2]] == 0).all()
    for i in (1, 3, 4):
        tok = out.sampled_token_ids[i]
        assert lt.logprob_token_ids[i, 0] == tok
        torch.testing.assert_close(lt.logprobs[i], raw[i, lt.logprob_token_ids[i]])   # raw: no temperature, no bias
        assert lt.selected_token_ranks[i] == (raw[i] >= raw[i, tok]).sum()
    assert out.sampled_token_ids[3] == 7 and lt.selected_token_ranks[3] > 1   # the bias chose it, the raw rank says otherwise
    d = lt.to_dicts([0, 4, 0, 0, -1])
    assert len(d[1]) in (4, 5) and len(d[3]) == 1 and len(d[4]) == 30


def test_tail_cuts_on_subsets_of_rows_equal_whole_batch():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(6))
    k, p, m = torch.tensor([0, 3, 0, 7, 0, 40]), torch.tensor([1.0, 0.9, 0.5, 1.0, 0.8, 1.0]), torch.tensor([0, 0.1, 0, 0.3, 0, 0])
    whole = apply_top_k_top_p(apply_min_p(logits.clone(), m), k, p)
    for r in range(6):
        row = apply_top_k_top_p(apply_min_p(logits[r:r + 1].clone(), m[r:r + 1]), k[r:r + 1], p[r:r + 1])
        assert torch.equal(row[0], whole[r])


# ---------------------------------------------------------------- the real model, through the public API
CHAT_YES_NO = "Reply with one word: yes or no. Is the sky blue?"


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_model_len=512, kv_cache_memory_bytes=128 << 20)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": CHAT_YES_NO}], add_generation_prompt=True, tokenize=False)
    return dict(yes_no=tokenizer(chat, add_special_tokens=False).input_ids,
                france=tokenizer("The capital of France is").input_ids,
                planets=tokenizer("List the planets of the solar system in order from the sun:").input_ids,
                story=tokenizer("Once upon a time, in a small village,").input_ids)


def word_ids(tokenizer, words):
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in words]
    assert all(len(i) == 1 for i in ids), ids
    return [i[0] for i in ids]


@pytest.fixture(scope="module")
def runs(llm, prompts, tokenizer):
    "All the requests that need no engine change, in one batch (two calls: the seeded request alone, then the batch)."
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=8)
    allowed = word_ids(tokenizer, [" London", " Berlin", " Rome", "."])
    banana = word_ids(tokenizer, [" banana"])[0]
    cases = {
        "greedy_yes_no": (prompts["yes_no"], SamplingParams(temperature=0, max_tokens=8)),
        "min_tokens": (prompts["yes_no"], SamplingParams(temperature=0, max_tokens=8, min_tokens=6)),
        "ignore_eos": (prompts["yes_no"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)),
        "greedy_france": (prompts["france"], SamplingParams(temperature=0, max_tokens=8)),
        "stop_token_ids": (prompts["france"], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[198])),
        "allowed": (prompts["france"], SamplingParams(temperature=0, max_tokens=4, allowed_token_ids=allowed)),
        "logit_bias": (prompts["story"], SamplingParams(temperature=0, max_tokens=4, logit_bias={banana: 100.0})),
        "greedy_planets": (prompts["planets"], SamplingParams(temperature=0, max_tokens=10)),
        "repetition": (prompts["planets"], SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3)),
        "seeded": (prompts["story"], seeded),
        "random_a": (prompts["planets"], SamplingParams(temperature=1.2, top_k=20, max_tokens=6)),
        "random_b": (prompts["france"], SamplingParams(temperature=0.7, min_p=0.1, presence_penalty=1.0, frequency_penalty=0.5, seed=5, max_tokens=6)),
    }
    names = list(cases)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in cases.values()], [sp for _, sp in cases.values()], use_tqdm=False)
    res = {n: o.outputs[0] for n, o in zip(names, outs)}
    res["seeded_alone"] = llm.generate([TokensPrompt(prompt_token_ids=prompts["story"])], seeded, use_tqdm=False)[0].outputs[0]
    res["allowed_ids"], res["banana"] = allowed, banana
    return res


def test_seeded_request_same_alone_and_in_a_mixed_batch(runs):
    assert len(runs) >= 8
    assert runs["seeded"].token_ids == runs["seeded_alone"].token_ids
    assert len(runs["seeded"].token_ids) == 8


def test_min_tokens_blocks_eos(runs):
    base, got = runs["greedy_yes_no"], runs["min_tokens"]
    assert base.finish_reason == "stop" and len(base.token_ids) < 6 and base.token_ids[-1] == EOS   # the model stops early...
    assert len(got.token_ids) >= 6 and EOS not in got.token_ids[:6]                                # ...but not before min_tokens
    assert got.token_ids[:len(base.token_ids) - 1] == base.token_ids[:-1]


def test_ignore_eos_runs_to_max_tokens(runs):
    base, got = runs["greedy_yes_no"], runs["ignore_eos"]
    assert base.finish_reason == "stop" and len(base.token_ids) < 6
    assert got.finish_reason == "length" and len(got.token_ids) == 6
    assert got.token_ids[:len(base.token_ids)] == base.token_ids     # EOS generated, and generation went on


def test_stop_token_ids(runs):
    base, got = runs["greedy_france"], runs["stop_token_ids"]
    assert 198 in base.token_ids[:-1], base.token_ids                # greedy goes on after the first "\n"...
    cut = base.token_ids.index(198) + 1
    assert got.token_ids == base.token_ids[:cut]                     # ...the stop token ends it there
    assert got.finish_reason == "stop" and got.stop_reason == 198


def test_allowed_token_ids(runs):
    base, got = runs["greedy_france"], runs["allowed"]
    assert any(t not in runs["allowed_ids"] for t in base.token_ids[:4])
    assert got.token_ids and all(t in runs["allowed_ids"] for t in got.token_ids)


def test_logit_bias(runs):
    assert runs["logit_bias"].token_ids == [runs["banana"]] * 4


def test_repetition_penalty_matches_hf(runs, prompts, hf_model):
    base, got = runs["greedy_planets"], runs["repetition"]
    ids = prompts["planets"]
    with torch.no_grad():
        hf = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=10,
                               do_sample=False, repetition_penalty=1.3, pad_token_id=EOS)[0, len(ids):].tolist()
    assert got.token_ids == hf[:len(got.token_ids)]
    assert got.token_ids != base.token_ids                            # the penalty changed the greedy text


def test_random_requests_in_the_batch(runs, llm, prompts, hf_model):
    "top_k=20 draws only among the model's 20 likeliest tokens (HF's logits); a seeded request draws as it does alone."
    a = runs["random_a"].token_ids
    ids = prompts["planets"] + a
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0, len(prompts["planets"]) - 1 : -1]
    top = logits.topk(20).indices.tolist()
    assert len(a) == 6 or a[-1] == EOS
    assert all(t in top[j] for j, t in enumerate(a)), (a, [top[j][:3] for j in range(len(a))])
    sp = SamplingParams(temperature=0.7, min_p=0.1, presence_penalty=1.0, frequency_penalty=0.5, seed=5, max_tokens=6)
    alone = llm.generate([TokensPrompt(prompt_token_ids=prompts["france"])], sp, use_tqdm=False)[0].outputs[0]
    assert runs["random_b"].token_ids == alone.token_ids and len(alone.token_ids) > 0


# ---- need the engine plumbing
def hf_logprobs(hf_model, ids):
    with torch.no_grad(): return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


@pytest.fixture(scope="module")
def logprob_runs(llm, prompts):
    ps = [SamplingParams(temperature=0, max_tokens=6, logprobs=5),
          SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3),
          SamplingParams(temperature=1.5, seed=7, max_tokens=6, logprobs=2)]
    return llm.generate([TokensPrompt(prompt_token_ids=prompts["france"])] * 3, ps, use_tqdm=False)


def test_greedy_logprobs_match_hf(logprob_runs, prompts, hf_model, tokenizer):
    "Each step's dict: the chosen token (rank 1) and the top 5, logprobs within 2e-4 of HF's log_softmax; cumulative_logprob the sum."
    o = logprob_runs[0].outputs[0]
    assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
    ids = prompts["france"] + o.token_ids
    ref = hf_logprobs(hf_model, ids)[len(prompts["france"]) - 1:-1]
    for j, (tok, d) in enumerate(zip(o.token_ids, o.logprobs)):
        assert len(d) == 5 and tok in d and d[tok].rank == 1
        top = ref[j].topk(5)
        assert list(d) == top.indices.tolist()
        for t, lp in d.items():
            assert abs(lp.logprob - ref[j, t].item()) < 2e-4
            assert lp.decoded_token == tokenizer.decode([t])
    assert abs(o.cumulative_logprob - sum(d[t].logprob for t, d in zip(o.token_ids, o.logprobs))) < 1e-4


def test_prompt_logprobs_match_hf(logprob_runs, prompts, hf_model):
    "prompt_logprobs: None for the first token, then the prompt token (with its rank) and the top 3, within 2e-4 of HF."
    pl = logprob_runs[1].prompt_logprobs
    ids = prompts["france"]
    assert pl is not None and len(pl) == len(ids) and pl[0] is None
    ref = hf_logprobs(hf_model, ids)
    for i in range(1, len(ids)):
        d, tok = pl[i], ids[i]
        assert tok in d and d[tok].rank == int((ref[i - 1] >= ref[i - 1, tok]).sum())
        assert set(ref[i - 1].topk(3).indices.tolist()) <= set(d) and len(d) in (3, 4)
        for t, lp in d.items(): assert abs(lp.logprob - ref[i - 1, t].item()) < 2e-4


def test_sampled_logprobs_are_raw_and_include_the_chosen_token(logprob_runs, prompts, hf_model):
    "At temperature 1.5 the reported logprobs are still those of the raw model, and the sampled token is always there with its rank."
    o = logprob_runs[2].outputs[0]
    assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
    ref = hf_logprobs(hf_model, prompts["france"] + o.token_ids)[len(prompts["france"]) - 1:-1]
    for j, (tok, d) in enumerate(zip(o.token_ids, o.logprobs)):
        assert tok in d and d[tok].rank == int((ref[j] >= ref[j, tok]).sum())
        assert abs(d[tok].logprob - ref[j, tok].item()) < 2e-4
        assert len(d) in (2, 3)


def test_bad_words(llm, runs, prompts, tokenizer):
    got = llm.generate([TokensPrompt(prompt_token_ids=prompts["france"])], SamplingParams(temperature=0, max_tokens=6, bad_words=["Paris"]),
                       use_tqdm=False)[0].outputs[0]
    paris = [w[-1] for w in tokenize_bad_words(["Paris"], tokenizer) if len(w) == 1]
    assert any(t in paris for t in runs["greedy_france"].token_ids)   # greedy says " Paris"...
    assert not any(t in paris for t in got.token_ids) and "Paris" not in got.text   # ...not with bad_words


def test_beam_search_matches_a_reference_on_hf(llm, prompts, hf_model):
    "LLM.beam_search returns the beams that the same algorithm finds with HF's logprobs (tokens equal, cumulative logprobs within 1e-3)."
    params = BeamSearchParams(beam_width=3, max_tokens=4)
    got = llm.beam_search([TokensPrompt(prompt_token_ids=prompts["france"])], params)[0].sequences

    def hf_next(seqs, k, temperature):   # the beams of one prompt all have the same length: one batched forward
        with torch.no_grad(): lp = hf_model(torch.tensor(seqs)).logits[:, -1].float().log_softmax(-1)
        return gather_logprobs(lp, k, lp.argmax(-1)).to_dicts(k)

    want = beam_search(hf_next, [prompts["france"]], params, eos_token_id=EOS)[0].sequences
    assert [b.tokens for b in got] == [b.tokens for b in want]
    for g, w in zip(got, want): assert abs(g.cum_logprob - w.cum_logprob) < 1e-3
    scores = [get_beam_search_score(b.tokens, b.cum_logprob, EOS) for b in got]
    assert scores == sorted(scores, reverse=True)


def test_text_knobs_and_logprobs_of_children(llm, runs, prompts, tokenizer):
    "detokenize=False: no text (nor decoded_token) but the same tokens; skip_special_tokens=False shows EOS's text; n=2 children each get logprobs."
    ps = [SamplingParams(temperature=0, max_tokens=8, detokenize=False, logprobs=1),
          SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, skip_special_tokens=False),
          SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, logprobs=2)]
    quiet, special, kids = llm.generate([TokensPrompt(prompt_token_ids=prompts["france"]), TokensPrompt(prompt_token_ids=prompts["yes_no"]),
                                         TokensPrompt(prompt_token_ids=prompts["story"])], ps, use_tqdm=False)
    q = quiet.outputs[0]
    assert q.text == "" and q.token_ids == runs["greedy_france"].token_ids
    assert all(d[t].decoded_token is None and d[t].rank == 1 for t, d in zip(q.token_ids, q.logprobs))
    s, plain = special.outputs[0], runs["ignore_eos"]
    assert s.token_ids == plain.token_ids and EOS in s.token_ids[:-1]
    assert tokenizer.decode([EOS]) in s.text and tokenizer.decode([EOS]) not in plain.text
    assert s.text == tokenizer.decode(s.token_ids, skip_special_tokens=False)
    assert s.cumulative_logprob is None and s.logprobs is None
    assert len(kids.outputs) == 2 and kids.outputs[0].token_ids != kids.outputs[1].token_ids
    for c in kids.outputs:
        assert len(c.logprobs) == len(c.token_ids) and all(t in d and len(d) in (2, 3) for t, d in zip(c.token_ids, c.logprobs))
        assert abs(c.cumulative_logprob - sum(d[t].logprob for t, d in zip(c.token_ids, c.logprobs))) < 1e-4
