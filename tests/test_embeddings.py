"Embeddings (`LLM.embed` / `LLM.encode`, `/v1/embeddings`) against HF transformers' final-norm hidden states on the same weights."
import pytest, torch
import torch.nn.functional as F
from minivllm import LLM, SamplingParams, PoolingParams, EmbeddingRequestOutput, PoolingRequestOutput
from minivllm.core.pooling_params import PoolerConfig

pytestmark = pytest.mark.xdist_group("embeddings")  # one worker builds its module fixtures (engines, checkpoints) once

# minivllm and HF both run float32 on the CPU, but batch and order their matmuls differently (and minivllm reads the
# keys/values back from the paged cache in chunks): the vectors agree to float32 rounding, far below this tolerance.
ATOL = 1e-5

PROMPTS = ["The capital of France is", "Paged attention keeps keys and values in fixed-size blocks of the KV cache, "
           "so that sequences of any length share one pool of memory without fragmentation.", "Hi"]


@pytest.fixture(scope="module")
def hf_hidden(hf_model, tokenizer):
    """HF's last hidden state for each prompt, `[T, hidden]`: `hidden_states[-1]` of `output_hidden_states=True`, which is
    the model's `last_hidden_state`, after the final norm (checked)."""
    out = {}
    with torch.no_grad():
        for p in PROMPTS:
            ids = tokenizer(p, return_tensors="pt").input_ids
            hs = hf_model(ids, output_hidden_states=True).hidden_states[-1][0]
            assert torch.equal(hs, hf_model.model(ids).last_hidden_state[0])
            out[p] = hs
    return out


@pytest.fixture(scope="module")
def llm():
    # a small token budget: the long prompt is read in chunks (chunked prefill) while pooling
    return LLM(dtype="float32", max_model_len=256, max_num_batched_tokens=16, num_gpu_blocks_override=64)


@pytest.fixture(scope="module")
def llm_mean():
    return LLM(dtype="float32", max_model_len=256, max_num_batched_tokens=16, num_gpu_blocks_override=64,
               pooler_config={"pooling_type": "MEAN"})


def test_embed_last_token_normalised_matches_hf(llm, hf_hidden):
    outs = llm.embed(PROMPTS, use_tqdm=False)
    assert all(isinstance(o, EmbeddingRequestOutput) for o in outs) and [o.finished for o in outs] == [True] * 3
    worst = 0.0
    for p, o in zip(PROMPTS, outs):
        want = F.normalize(hf_hidden[p][-1], dim=-1)
        got = torch.tensor(o.outputs.embedding)
        assert o.outputs.hidden_size == want.numel() == 576
        worst = max(worst, (got - want).abs().max().item())
    print(f"LAST pooling, normalised: max |minivllm - HF| = {worst:.2e}")
    assert worst < ATOL


def test_encode_unnormalised_and_dimensions(llm, hf_hidden):
    p = PROMPTS[1]
    o = llm.encode([p], PoolingParams(normalize=False), use_tqdm=False)[0]
    assert isinstance(o, PoolingRequestOutput) and o.prompt_token_ids and o.outputs.data.shape == (576,)
    assert torch.allclose(o.outputs.data, hf_hidden[p][-1], atol=ATOL * 10, rtol=1e-4)   # raw hidden values are O(10)
    d = llm.embed(p, pooling_params=PoolingParams(dimensions=32), use_tqdm=False)[0].outputs.embedding
    assert len(d) == 32 and torch.allclose(torch.tensor(d), F.normalize(hf_hidden[p][-1][:32], dim=-1), atol=ATOL)


def test_mean_pooling_matches_hf(llm_mean, hf_hidden):
    outs = llm_mean.embed(PROMPTS, use_tqdm=False)
    worst = max((torch.tensor(o.outputs.embedding) - F.normalize(hf_hidden[p].mean(0), dim=-1)).abs().max().item()
                for p, o in zip(PROMPTS, outs))
    print(f"MEAN pooling, normalised: max |minivllm - HF| = {worst:.2e}")
    assert worst < ATOL


def test_mixed_batch_generate_and_embed(llm, hf_hidden, hf_greedy, tokenizer):
    "Generation and pooling requests in one engine, in the same steps: both exact, every block free afterwards."
    eng = llm.llm_engine
    eng.add_request("g", PROMPTS[0], SamplingParams(temperature=0, max_tokens=8))
    eng.add_request("e", PROMPTS[1], PoolingParams())
    mixed, done = False, {}
    while eng.has_unfinished_requests():
        outs = eng.step()
        ids = {s.req_id for s in eng.last_step.scheduler_output.seqs}
        mixed |= ids == {"g", "e"}
        done.update({o.request_id: o for o in outs if o.finished})
    assert mixed
    assert done["g"].outputs[0].token_ids == hf_greedy(tokenizer(PROMPTS[0]).input_ids, 8)
    assert torch.allclose(done["e"].outputs.data, F.normalize(hf_hidden[PROMPTS[1]][-1], dim=-1), atol=ATOL)
    kv = eng.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == 64 and not eng.engine_core.extension("pooler").partial


def test_abort_and_bad_params(llm):
    eng = llm.llm_engine
    eng.add_request("a", PROMPTS[1], PoolingParams())
    eng.step()                                   # first chunk read, partial pool kept
    eng.abort_request("a")
    while eng.has_unfinished_requests(): eng.step()
    assert not eng.engine_core.extension("pooler").partial and eng.kv_cache_manager.block_pool.get_num_free_blocks() == 64
    with pytest.raises(ValueError, match="dimensions"): llm.embed("x", pooling_params=PoolingParams(dimensions=10_000), use_tqdm=False)
    with pytest.raises(NotImplementedError, match="truncate_prompt_tokens"): llm.embed("x", truncate_prompt_tokens=3, use_tqdm=False)
    with pytest.raises(NotImplementedError, match="task"): PoolingParams(task="token_classify")


def test_token_embed_matches_hf_per_token(llm, hf_hidden):
    """`pooling_task="token_embed"`: one vector per prompt token, HF's final-norm hidden state of that token, L2-normalised
    (as vLLM's token-embedding head does), cut to `dimensions` first when asked; read in chunks of the 16-token budget."""
    outs = llm.encode(PROMPTS, pooling_task="token_embed", use_tqdm=False)
    worst = 0.0
    for p, o in zip(PROMPTS, outs):
        want = F.normalize(hf_hidden[p], dim=-1)
        assert isinstance(o, PoolingRequestOutput) and o.outputs.data.shape == want.shape == (len(o.prompt_token_ids), 576)
        worst = max(worst, (o.outputs.data - want).abs().max().item())
    print(f"token_embed, normalised: max |minivllm - HF| = {worst:.2e}")
    assert worst < ATOL
    d = llm.encode(PROMPTS[1], PoolingParams(task="token_embed", dimensions=32, normalize=False), use_tqdm=False)[0]
    assert torch.allclose(d.outputs.data, hf_hidden[PROMPTS[1]][:, :32], atol=ATOL * 10, rtol=1e-4)


def test_pooler_config_task_token_embed(hf_hidden):
    "`PoolerConfig(task=\"token_embed\")`: `LLM.embed` returns the per-token matrices (vLLM's); another task is refused."
    llm = LLM(dtype="float32", max_model_len=256, num_gpu_blocks_override=64, pooler_config=PoolerConfig(task="token_embed"))
    outs = llm.embed(PROMPTS, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        assert type(o) is PoolingRequestOutput
        assert torch.allclose(o.outputs.data, F.normalize(hf_hidden[p], dim=-1), atol=ATOL)
    with pytest.raises(ValueError, match=r'PoolerConfig\(task="embed"\)'):
        llm.encode("x", pooling_task="embed", use_tqdm=False)
    with pytest.raises(NotImplementedError, match="token_classify"):
        LLM(dtype="float32", max_model_len=64, pooler_config={"task": "token_classify"})
    with pytest.raises(NotImplementedError, match="step_tag_id"):
        LLM(dtype="float32", max_model_len=64, pooler_config=PoolerConfig(step_tag_id=3))


def _hf_chunk_vectors(hf_model, ids, size, kind):
    "Each chunk of `size` tokens read by HF on its own, pooled (LAST or MEAN) and normalised, with its token count."
    out = []
    with torch.no_grad():
        for i in range(0, len(ids), size):
            h = hf_model.model(torch.tensor([ids[i:i + size]])).last_hidden_state[0]
            out.append((F.normalize(h[-1] if kind == "LAST" else h.mean(0), dim=-1), len(h)))
    return out


def _pool(h, kind):
    return h[-1] if kind == "LAST" else h.mean(0)


@pytest.mark.parametrize("kind", ["MEAN", "LAST"])
def test_chunked_processing_of_long_inputs(kind, hf_model, tokenizer, hf_hidden):
    """`enable_chunked_processing`: an input longer than max_model_len (12) is embedded in chunks of 12 tokens and the
    chunks' vectors combined as vLLM documents (for every pooling type): the mean weighted by token count, normalised
    again; computed by hand from HF reading each chunk on its own. `max_embed_len` caps the input."""
    cfg = PoolerConfig(pooling_type=kind, enable_chunked_processing=True, max_embed_len=64)
    llm = LLM(dtype="float32", max_model_len=12, num_gpu_blocks_override=64, pooler_config=cfg)
    ids = tokenizer(PROMPTS[1]).input_ids
    assert len(ids) > 24 and len(ids) % 12                             # three chunks, the last one shorter
    with torch.no_grad():
        hs = [hf_model.model(torch.tensor([ids[i:i + 12]])).last_hidden_state[0] for i in range(0, len(ids), 12)]
    outs = llm.embed([PROMPTS[1], PROMPTS[0]], use_tqdm=False)
    want = F.normalize(sum(F.normalize(_pool(h, kind), dim=-1) * len(h) for h in hs) / len(ids), dim=-1)
    got = torch.tensor(outs[0].outputs.embedding)
    print(f"chunked {kind}: {[len(h) for h in hs]} tokens, max |minivllm - by hand| = {(got - want).abs().max():.2e}")
    assert torch.allclose(got, want, atol=ATOL) and outs[0].prompt_token_ids == ids
    whole = F.normalize(_pool(hf_hidden[PROMPTS[1]], kind), dim=-1)   # the chunks really were read on their own
    assert (got - whole).abs().max() > 1e-3
    short = hf_hidden[PROMPTS[0]]                                      # fits the model: one request, as without chunking
    assert torch.allclose(torch.tensor(outs[1].outputs.embedding), F.normalize(_pool(short, kind), dim=-1), atol=ATOL)
    raw = llm.encode(PROMPTS[1], PoolingParams(normalize=False), pooling_task="embed", use_tqdm=False)[0].outputs.data
    want_raw = sum(_pool(h, kind) * len(h) for h in hs) / len(ids)     # unnormalised: no normalisation anywhere
    assert torch.allclose(raw, want_raw, atol=ATOL * 10, rtol=1e-4)
    with pytest.raises(ValueError, match="max_embed_len 64"):
        llm.embed("word " * 80, use_tqdm=False)
    with pytest.raises(ValueError, match="maximum model length"):      # token embeddings are not chunked
        llm.encode(PROMPTS[1], pooling_task="token_embed", use_tqdm=False)


def test_server_embeddings_through_openai_client(model_dir, tokenizer, hf_hidden):
    "`client.embeddings.create` of the official `openai` client against a real `minivllm serve`."
    openai = pytest.importorskip("openai")
    from conftest import running_server
    with running_server("--dtype", "float32", "--max-model-len", "256", "--served-model-name", "smol") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x")
        r = client.embeddings.create(model="smol", input=PROMPTS)          # the client asks for base64 and decodes it
        assert [d.index for d in r.data] == [0, 1, 2]
        for p, d in zip(PROMPTS, r.data):
            assert torch.allclose(torch.tensor(d.embedding), F.normalize(hf_hidden[p][-1], dim=-1), atol=ATOL)
        assert r.usage.prompt_tokens == sum(len(tokenizer(p).input_ids) for p in PROMPTS)
        f = client.embeddings.create(model="smol", input="Hi", encoding_format="float", dimensions=16)
        assert len(f.data[0].embedding) == 16
        with pytest.raises(openai.BadRequestError) as e: client.embeddings.create(model="smol", input=[])
        assert e.value.body["param"] == "input"
        # vLLM's /pooling: per-token rows for `token_embed`, HF's final-norm hidden states normalised; its `bytes`
        # answer decoded by vLLM's client helpers (minivllm.entrypoints.pooling.utils)
        import json, requests
        from minivllm.entrypoints.pooling.utils import MetadataItem, decode_pooling_output
        r = requests.post(base + "/pooling", json={"input": PROMPTS, "task": "token_embed"}).json()
        for p, d in zip(PROMPTS, r["data"]):
            assert d["object"] == "pooling"
            assert torch.allclose(torch.tensor(d["data"]), F.normalize(hf_hidden[p], dim=-1), atol=ATOL)
        r = requests.post(base + "/pooling", json={"input": PROMPTS, "encoding_format": "bytes", "embed_dtype": "float16",
                                                   "endianness": "big"})
        items = [MetadataItem(**x) for x in json.loads(r.headers["metadata"])["data"]]
        for p, v in zip(PROMPTS, decode_pooling_output(items, r.content)):
            assert v.dtype == torch.float16 and torch.allclose(v.float(), F.normalize(hf_hidden[p][-1], dim=-1), atol=1e-3)
