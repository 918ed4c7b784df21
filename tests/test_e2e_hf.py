"""End to end on the embedded SmolLM2-135M-Instruct: minivllm's greedy tokens equal HF transformers' greedy `generate`,
with continuous batching, with preemption, and with aborts and bad input in the mix."""
import pytest, torch
from minivllm import LLM, LLMEngine, EngineArgs, SamplingParams, TokensPrompt

pytestmark = pytest.mark.xdist_group("e2e_hf")  # one worker builds its module fixtures (engines, checkpoints) once

BASE = ("The history of computing is long and full of surprises. Early mechanical calculators gave way to "
        "electronic machines, then to transistors, integrated circuits and the personal computer. ")
PROMPTS = ["Hi", "The capital of France is", "Write a short poem about the moon:",
           "List the planets of the solar system in order from the sun:",
           BASE + "Summarize this in one sentence:",
           BASE * 3 + "What came after the transistor?",
           BASE * 6 + "Name one inventor mentioned above, or say none:",
           BASE * 10 + "Continue the story:"]
MAX_NEW = 32


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    lens = sorted(len(i) for i in ids)
    assert lens[0] < 5 and lens[-1] > 300, lens   # clearly different lengths
    return ids


def run_engine(engine, prompt_ids, params):
    for i, ids in enumerate(prompt_ids): engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o
    return [done[str(i)].outputs[0].token_ids for i in range(len(prompt_ids))]


def test_greedy_batch_matches_hf(prompt_ids, hf_greedy):
    llm = LLM(dtype="float32", max_model_len=1024)
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in prompt_ids], SamplingParams(temperature=0, max_tokens=MAX_NEW), use_tqdm=False)
    for ids, o in zip(prompt_ids, outs):
        assert o.outputs[0].token_ids == hf_greedy(ids, MAX_NEW), o.prompt
    assert "Paris" in outs[1].outputs[0].text


@pytest.mark.parametrize("backend", ["cpu", "inductor"])
def test_greedy_in_place_attention_matches_hf(prompt_ids, hf_greedy, backend):
    "The CPU's in-place decode kernels (lesson 04: the C kernel, the default, and Inductor's) from the first step on: still HF's greedy tokens."
    llm = LLM(dtype="float32", max_model_len=1024, attention_backend=backend)
    runner = llm.llm_engine.engine_core.model_runner
    assert runner.attention_backend == backend  # chosen when the runner was built
    outs = llm.generate([TokensPrompt(prompt_token_ids=i) for i in prompt_ids], SamplingParams(temperature=0, max_tokens=MAX_NEW), use_tqdm=False)
    for ids, o in zip(prompt_ids, outs): assert o.outputs[0].token_ids == hf_greedy(ids, MAX_NEW), o.prompt
    from minivllm.core.attention import get_attention_backend
    assert {layer.self_attn.attn_fn for layer in runner.model.layers} == {get_attention_backend(backend)}


def test_greedy_with_preemption_matches_hf(prompt_ids, hf_greedy):
    # 40 blocks of 16 tokens = 640 slots: far less than the ~1500 the 8 requests need together
    engine = LLMEngine.from_engine_args(EngineArgs(dtype="float32", num_gpu_blocks_override=40, max_model_len=640, max_num_batched_tokens=256))
    got = run_engine(engine, prompt_ids, SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert engine.scheduler.num_preemptions > 0
    for ids, toks in zip(prompt_ids, got): assert toks == hf_greedy(ids, MAX_NEW)
    kv = engine.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks


def test_greedy_chunked_prefill_without_prefix_caching(prompt_ids, hf_greedy):
    engine = LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_num_batched_tokens=64, enable_prefix_caching=False, max_model_len=1024))
    got = run_engine(engine, prompt_ids[-2:], SamplingParams(temperature=0, max_tokens=8))
    for ids, toks in zip(prompt_ids[-2:], got): assert toks == hf_greedy(ids, 8)


def test_abort_frees_blocks_and_others_continue(prompt_ids, hf_greedy):
    engine = LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=1024))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW)
    for i in range(3): engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=prompt_ids[i + 3]), params)
    outs = {}
    for _ in range(4): outs.update({o.request_id: o for o in engine.step()})
    engine.abort_request("r1")
    assert engine.kv_cache_manager.get_block_ids("r1") == []
    while engine.has_unfinished_requests(): outs.update({o.request_id: o for o in engine.step()})
    assert outs["r1"].finished and outs["r1"].outputs[0].finish_reason == "abort"
    for i in (0, 2): assert outs[f"r{i}"].outputs[0].token_ids == hf_greedy(prompt_ids[i + 3], MAX_NEW)
    kv = engine.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_blocks


def test_bad_input_fails_alone(prompt_ids, hf_greedy):
    engine = LLMEngine.from_engine_args(EngineArgs(dtype="float32", max_model_len=512))
    params = SamplingParams(temperature=0, max_tokens=8)
    engine.add_request("good", TokensPrompt(prompt_token_ids=prompt_ids[1]), params)
    with pytest.raises(TypeError, match="request_id"): engine.add_request(42, "hello", params)
    with pytest.raises(ValueError, match="already in use"): engine.add_request("good", "hello", params)
    with pytest.raises(ValueError, match="maximum model length"): engine.add_request("long", TokensPrompt(prompt_token_ids=[5] * 600), params)
    with pytest.raises(ValueError, match="temperature"): engine.add_request("t", "hello", SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="top_p"): engine.add_request("p", "hello", SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="vocabulary"): engine.add_request("v", TokensPrompt(prompt_token_ids=[10 ** 9]), params)
    outs = []
    while engine.has_unfinished_requests(): outs += engine.step()
    finished = [o for o in outs if o.finished]
    assert [o.request_id for o in finished] == ["good"]
    assert finished[0].outputs[0].token_ids == hf_greedy(prompt_ids[1], 8)


def test_llm_generate_bad_prompt_leaves_nothing_running():
    llm = LLM(dtype="float32", max_model_len=256)
    with pytest.raises(ValueError, match="maximum model length"):
        llm.generate(["fine", TokensPrompt(prompt_token_ids=[5] * 300)], SamplingParams(max_tokens=4), use_tqdm=False)
    kv = llm.llm_engine.kv_cache_manager
    assert not llm.llm_engine.has_unfinished_requests() and kv.block_pool.get_num_free_blocks() == kv.num_blocks
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text


def test_seeded_sampling_is_reproducible_in_a_batch():
    llm = LLM(dtype="float32", max_model_len=256)
    sp = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = llm.generate("Tell me a joke.", sp, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate(["Hello", "Tell me a joke.", "Why?", "1, 2, 3,"],
                         [SamplingParams(temperature=0.7, max_tokens=20), sp, SamplingParams(temperature=0), SamplingParams(temperature=1.2, top_k=5, max_tokens=9)],
                         use_tqdm=False)
    assert mixed[1].outputs[0].token_ids == alone
