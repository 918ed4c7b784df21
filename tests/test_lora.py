"""Multi-LoRA serving against HF transformers + PEFT on the same weights: adapters made by PEFT in the test (random,
non-zero B), on a tiny random Llama and on the embedded SmolLM2; mixed batches equal solo runs; the prefix cache keys
blocks by adapter; slots swap under max_loras=2 with 4 adapters in flight; bad adapters fail alone; the server."""
import copy, json
import pytest, torch
from minivllm import LLM, SamplingParams, LoRARequest, TokensPrompt

pytestmark = pytest.mark.xdist_group("lora")  # one worker builds its module fixtures (engines, checkpoints) once

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECS = {1: dict(r=4, lora_alpha=8, target_modules=TARGETS), 2: dict(r=8, lora_alpha=16, use_rslora=True, target_modules=TARGETS),
         3: dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]),
         4: dict(r=6, lora_alpha=3, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj"])}


def make_adapter(hf, path, seed, **kw):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    get_peft_model(copy.deepcopy(hf), LoraConfig(init_lora_weights=False, **kw)).save_pretrained(path)
    return str(path)


def hf_peft_greedy(hf, adapter_path, prompt_ids, n):
    "Greedy tokens of HF transformers, with PEFT's adapter at `adapter_path` (None: the base model)."
    from peft import PeftModel
    m = hf if adapter_path is None else PeftModel.from_pretrained(copy.deepcopy(hf), adapter_path).eval()
    with torch.no_grad():
        out = m.generate(input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_dir):
    "A tiny random Llama (SmolLM2's tokenizer) and four PEFT adapters of it."
    from minivllm.core.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny_lora")
    hf = make_tiny_checkpoint(d / "model", "llama", tokenizer_from=model_dir, vocab_size=49152, tie_word_embeddings=True)
    loras = {i: LoRARequest(f"a{i}", i, make_adapter(hf, d / f"a{i}", seed=i, **kw)) for i, kw in SPECS.items()}
    return hf.eval(), str(d / "model"), loras


PROMPTS = [[1, 500, 600, 700, 800], [1, 42, 43], [1, 9000, 12, 13, 14, 15, 16, 17], [1, 77, 78, 79, 80, 81]]


def greedy(n): return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_tiny_each_adapter_matches_hf_peft(tiny):
    hf, path, loras = tiny
    llm = LLM(dtype="float32", model=path, enable_lora=True, max_loras=4, max_lora_rank=8, num_gpu_blocks_override=64, block_size=4, max_model_len=128)
    for lid in [None, 1, 2, 3, 4]:
        lr = loras[lid] if lid else None
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:2]], greedy(8), use_tqdm=False, lora_request=lr)
        for p, o in zip(PROMPTS, outs):
            assert o.outputs[0].token_ids == hf_peft_greedy(hf, lr.lora_path if lr else None, p, 8), (lid, p)
            assert o.lora_request == lr and o.outputs[0].lora_request == lr
    assert llm.list_loras() == {1, 2, 3, 4}
    # the adapters really change the output (else the test above could not fail)
    assert len({tuple(hf_peft_greedy(hf, loras[i].lora_path if i else None, PROMPTS[0], 8)) for i in [None, 1, 2, 3, 4]}) >= 4


def solo(llm, prompt, lr, n):
    return llm.generate([TokensPrompt(prompt_token_ids=prompt)], greedy(n), use_tqdm=False, lora_request=lr)[0].outputs[0].token_ids


def test_tiny_mixed_batch_equals_solo(tiny):
    hf, path, loras = tiny
    llm = LLM(dtype="float32", model=path, enable_lora=True, max_loras=3, max_lora_rank=8, num_gpu_blocks_override=128, block_size=4, max_model_len=128)
    plan = [(p, l) for p in PROMPTS for l in (None, 1, 2, 3)]   # 3 adapters + base, each prompt under each
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in plan], greedy(10), use_tqdm=False,
                        lora_request=[loras[l] if l else None for _, l in plan])
    for (p, l), o in zip(plan, outs):
        assert o.outputs[0].token_ids == solo(llm, p, loras[l] if l else None, 10), (p, l)
        assert o.lora_request == (loras[l] if l else None)


def test_prefix_cache_keys_blocks_by_adapter(tiny):
    hf, path, loras = tiny
    llm = LLM(dtype="float32", model=path, enable_lora=True, max_loras=2, max_lora_rank=8, num_gpu_blocks_override=64, block_size=4, max_model_len=128)
    p = TokensPrompt(prompt_token_ids=list(range(1, 18)))    # 17 tokens: 4 full blocks
    first = llm.generate([p], greedy(2), use_tqdm=False, lora_request=loras[1])[0]
    other = llm.generate([p], greedy(2), use_tqdm=False, lora_request=loras[2])[0]
    same = llm.generate([p], greedy(2), use_tqdm=False, lora_request=loras[1])[0]
    base = llm.generate([p], greedy(2), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert other.num_cached_tokens == 0          # same prompt, other adapter: no shared blocks
    assert same.num_cached_tokens == 16          # same adapter: its 4 full blocks are reused
    assert base.num_cached_tokens == 0           # and the base model shares nothing with either
    assert same.outputs[0].token_ids == first.outputs[0].token_ids


def test_swapping_max_loras_2_with_4_adapters_in_flight(tiny):
    hf, path, loras = tiny
    llm = LLM(dtype="float32", model=path, enable_lora=True, max_loras=2, max_cpu_loras=3, max_lora_rank=8, num_gpu_blocks_override=128,
              block_size=4, max_model_len=128)
    mgr = llm.llm_engine.engine_core.extension("lora_manager")
    seen, activate = [], mgr.activate
    mgr.activate = lambda ids: seen.append(len({i for i in ids if i})) or activate(ids)
    plan = [(PROMPTS[k % 4], l) for k, l in enumerate([1, 2, 3, 4, 1, 3, 2, 4, None, 4])]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in plan], greedy(6), use_tqdm=False,
                        lora_request=[loras[l] if l else None for _, l in plan])
    assert max(seen) == 2 and mgr.num_swaps >= 2          # never more than 2 adapters in a step; slots were swapped
    ref = LLM(dtype="float32", model=path, enable_lora=True, max_loras=4, max_lora_rank=8, num_gpu_blocks_override=64, block_size=4, max_model_len=128)
    for (p, l), o in zip(plan, outs): assert o.outputs[0].token_ids == solo(ref, p, loras[l] if l else None, 6), (p, l)
    for (p, l), o in zip(plan[:4], outs): assert o.outputs[0].token_ids == hf_peft_greedy(hf, loras[l].lora_path, p, 6)


def test_bad_adapters_fail_alone(tiny, tmp_path):
    hf, path, loras = tiny
    llm = LLM(dtype="float32", model=path, enable_lora=True, max_loras=1, max_lora_rank=4, num_gpu_blocks_override=64, block_size=4, max_model_len=128)
    with pytest.raises(ValueError, match="max_lora_rank=4"): llm.generate("hi", greedy(2), use_tqdm=False, lora_request=loras[2])
    with pytest.raises(ValueError, match="adapter_config.json"):
        llm.generate("hi", greedy(2), use_tqdm=False, lora_request=LoRARequest("none", 9, str(tmp_path)))
    assert llm.llm_engine.get_num_unfinished_requests() == 0 and llm.llm_engine.kv_cache_manager.usage == 0
    assert llm.generate("hi", greedy(2), use_tqdm=False, lora_request=loras[1])[0].outputs[0].token_ids   # still serving
    off = LLM(dtype="float32", model=path, num_gpu_blocks_override=32, block_size=4, max_model_len=128)
    with pytest.raises(ValueError, match="enable_lora=True"): off.generate("hi", greedy(2), use_tqdm=False, lora_request=loras[1])
    with pytest.raises(ValueError, match="max_cpu_loras"): LLM(dtype="float32", model=path, enable_lora=True, max_loras=2, max_cpu_loras=1, max_model_len=128)


def test_smollm2_adapters_match_hf_peft(hf_model, model_dir, tmp_path, tokenizer):
    a = LoRARequest("qv", 1, make_adapter(hf_model, tmp_path / "qv", seed=1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    b = LoRARequest("all", 2, make_adapter(hf_model, tmp_path / "all", seed=2, r=4, lora_alpha=4, use_rslora=True,
                                           target_modules=TARGETS, lora_dropout=0.0))
    llm = LLM(dtype="float32", model=model_dir, enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=256, num_gpu_blocks_override=64)
    ids = tokenizer("The capital of France is").input_ids
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids)] * 3, greedy(6), use_tqdm=False, lora_request=[a, b, None])
    for o, lr in zip(outs, [a, b, None]):
        assert o.outputs[0].token_ids == hf_peft_greedy(hf_model, lr.lora_path if lr else None, ids, 6), lr
    assert outs[1].outputs[0].token_ids != outs[2].outputs[0].token_ids    # the adapter changes SmolLM2's answer


def test_gguf_blocks_with_adapters_match_hf_peft(hf_model, tmp_path, tokenizer):
    """Adapters on the GGUF's own 4-bit blocks (quantization="gguf", lesson 04b): in float32 those are the weights of the
    float32 expansion that HF loads, so PEFT on HF gives the same greedy tokens."""
    a = LoRARequest("all", 1, make_adapter(hf_model, tmp_path / "all", seed=3, r=4, lora_alpha=8, target_modules=TARGETS,
                                           lora_dropout=0.0))
    llm = LLM(quantization="gguf", dtype="float32", enable_lora=True, max_loras=1, max_lora_rank=4, max_model_len=256,
              num_gpu_blocks_override=64)
    ids = tokenizer("The capital of France is").input_ids
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids)] * 2, greedy(6), use_tqdm=False, lora_request=[a, None])
    for o, lr in zip(outs, [a, None]):
        assert o.outputs[0].token_ids == hf_peft_greedy(hf_model, lr.lora_path if lr else None, ids, 6), lr
    assert outs[0].outputs[0].token_ids != outs[1].outputs[0].token_ids    # the adapter changes the answer


def test_server_openai_client_selects_adapter_by_model_name(tiny):
    import httpx, openai
    from conftest import running_server
    hf, path, loras = tiny
    flags = ["--max-lora-rank", "8", "--max-loras", "2", "--num-gpu-blocks-override", "64", "--block-size", "4", "--max-model-len", "128"]
    offline = LLM(dtype="float32", model=path, enable_lora=True, max_loras=4, max_lora_rank=8, num_gpu_blocks_override=64, block_size=4, max_model_len=128)
    want = {n: offline.generate("Hello there", greedy(8), use_tqdm=False, lora_request=lr)[0].outputs[0].text
            for n, lr in [("base", None), ("a1", loras[1]), ("a2", loras[2]), ("a3", loras[3])]}
    assert len(set(want.values())) == 4
    with running_server(path, "--dtype", "float32", "--served-model-name", "base", "--lora-modules", f"a1={loras[1].lora_path}",
                        f"a2={loras[2].lora_path}", *flags) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)
        assert [m.id for m in c.models.list().data] == ["base", "a1", "a2"]
        for name in ["base", "a1", "a2"]:
            r = c.completions.create(model=name, prompt="Hello there", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            assert r.choices[0].text == want[name], name
        with pytest.raises(openai.NotFoundError): c.completions.create(model="a3", prompt="Hello there", max_tokens=2)
        r = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": loras[3].lora_path}, timeout=60)
        assert r.status_code == 200, r.text
        r = c.completions.create(model="a3", prompt="Hello there", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].text == want["a3"]
        bad = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nowhere"}, timeout=60)
        assert bad.status_code == 400 and "adapter_config.json" in bad.text
        assert httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "a1"}, timeout=60).status_code == 200
        with pytest.raises(openai.NotFoundError): c.completions.create(model="a1", prompt="Hello there", max_tokens=2)
        assert [m.id for m in c.models.list().data] == ["base", "a2", "a3"]


def test_async_engine_generate_with_lora(tiny):
    import asyncio
    from minivllm import AsyncLLMEngine, EngineArgs
    hf, path, loras = tiny
    eng = AsyncLLMEngine.from_engine_args(EngineArgs(dtype="float32", model=path, enable_lora=True, max_loras=2, max_lora_rank=8,
                                                     num_gpu_blocks_override=64, block_size=4, max_model_len=128))
    async def one(rid, lr):
        async for o in eng.generate(TokensPrompt(prompt_token_ids=PROMPTS[0]), greedy(6), rid, lora_request=lr): last = o
        return last
    async def go():
        assert await eng.add_lora(loras[1]) and await eng.list_loras() == {1}
        outs = await asyncio.gather(one("a", loras[1]), one("b", loras[2]), one("c", None))
        assert await eng.remove_lora(1) and await eng.list_loras() == {2}
        return outs
    try: outs = asyncio.run(go())
    finally: eng.shutdown()
    for o, lr in zip(outs, [loras[1], loras[2], None]):
        assert o.lora_request == lr
        assert o.outputs[0].token_ids == hf_peft_greedy(hf, lr.lora_path if lr else None, PROMPTS[0], 6)
