"Embeddings (`LLM.embed` / `LLM.encode`, `/v1/embeddings`) against HF transformers' final-norm hidden states on the same weights."
import pytest, torch
import torch.nn.functional as F
from minivllm import LLM, SamplingParams, PoolingParams, EmbeddingRequestOutput, PoolingRequestOutput

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
    assert kv.block_pool.get_num_free_blocks() == 64 and not eng.engine_core.pooler.partial


def test_abort_and_bad_params(llm):
    eng = llm.llm_engine
    eng.add_request("a", PROMPTS[1], PoolingParams())
    eng.step()                                   # first chunk read, partial pool kept
    eng.abort_request("a")
    while eng.has_unfinished_requests(): eng.step()
    assert not eng.engine_core.pooler.partial and eng.kv_cache_manager.block_pool.get_num_free_blocks() == 64
    with pytest.raises(ValueError, match="dimensions"): llm.embed("x", pooling_params=PoolingParams(dimensions=10_000), use_tqdm=False)
    with pytest.raises(NotImplementedError, match="truncate_prompt_tokens"): llm.embed("x", truncate_prompt_tokens=3, use_tqdm=False)
    with pytest.raises(NotImplementedError, match="task"): PoolingParams(task="classify")


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
