"""Scoring as vLLM does it for an embedding model: `LLM.score`, the server's `/score` and `/rerank` (lesson 09b, 15) give
the cosine similarity of the embeddings `LLM.embed` returns, paired 1:1, 1:N or N:N; uneven sides are a clear error."""
import pytest, torch
from fastapi.testclient import TestClient

pytestmark = pytest.mark.xdist_group("scoring")  # one worker builds its module fixtures (engines, checkpoints) once

QUERY = "Where do cats sleep?"
DOCS = ["Cats nap in sunny spots.", "Bond yields rose on Tuesday.", "The tax form is due in May.", "Kittens sleep a lot."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_dir):
    "A tiny random Llama with the embedded model's tokenizer (its vocabulary), so the texts are real texts."
    from minivllm.core.model import make_tiny_checkpoint
    d = str(tmp_path_factory.mktemp("tiny"))
    make_tiny_checkpoint(d, "llama", tokenizer_from=model_dir, vocab_size=49152)
    return d


@pytest.fixture(scope="module")
def llm(tiny):
    from minivllm import LLM
    return LLM(model=tiny, max_model_len=128)


@pytest.fixture(scope="module")
def embeds(llm):
    "The texts' embeddings by `LLM.embed`, as tensors."
    outs = llm.embed([QUERY] + DOCS, use_tqdm=False)
    return {t: torch.tensor(o.outputs.embedding) for t, o in zip([QUERY] + DOCS, outs)}


def cos(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_llm_score_is_the_cosine_of_llm_embed(llm, embeds):
    out = llm.score(QUERY, DOCS, use_tqdm=False)                      # 1:N
    assert [type(o).__name__ for o in out] == ["ScoringRequestOutput"] * len(DOCS)
    want = [cos(embeds[QUERY], embeds[d]) for d in DOCS]
    assert [o.outputs.score for o in out] == pytest.approx(want, abs=1e-5)
    assert len({round(w, 4) for w in want}) == len(want)              # the scores tell the documents apart
    pairs = llm.score(DOCS[:2], DOCS[2:], use_tqdm=False)               # N:N, side by side
    assert [o.outputs.score for o in pairs] == pytest.approx(
        [cos(embeds[DOCS[0]], embeds[DOCS[2]]), cos(embeds[DOCS[1]], embeds[DOCS[3]])], abs=1e-5)
    tok = llm.get_tokenizer()
    pad = [] if tok.pad_token_id is None else [tok.pad_token_id]
    one = llm.score(QUERY, DOCS[0], use_tqdm=False)                   # 1:1; the pair's ids joined
    assert one[0].prompt_token_ids == tok(QUERY).input_ids + pad + tok(DOCS[0]).input_ids


def test_llm_score_refuses_uneven_sides(llm):
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        llm.score(DOCS[:2], DOCS[:3], use_tqdm=False)
    with pytest.raises(ValueError, match="At least one text_pair"):
        llm.score(QUERY, [], use_tqdm=False)
    with pytest.raises(NotImplementedError, match="cross-encoders"):
        llm.score(QUERY, DOCS, chat_template="{{ x }}", use_tqdm=False)


@pytest.fixture(scope="module")
def client(tiny):
    from minivllm.serve.async_engine import AsyncLLMEngine
    from minivllm.core.arg_utils import EngineArgs
    from minivllm.serve.server import build_app
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(model=tiny, max_model_len=128))
    yield TestClient(build_app(engine, served_model_name="tiny", api_key="k"))
    engine.shutdown()


def test_score_route_is_the_cosine_of_llm_embed(client, embeds):
    r = client.post("/score", json={"model": "tiny", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == list(range(len(DOCS)))
    assert [d["score"] for d in body["data"]] == pytest.approx([cos(embeds[QUERY], embeds[d]) for d in DOCS], abs=1e-5)
    assert body["usage"]["prompt_tokens"] > 0
    r = client.post("/v1/score", headers={"Authorization": "Bearer k"}, json={"text_1": DOCS[:2], "text_2": DOCS[2:]})
    assert [d["score"] for d in r.json()["data"]] == pytest.approx(
        [cos(embeds[DOCS[0]], embeds[DOCS[2]]), cos(embeds[DOCS[1]], embeds[DOCS[3]])], abs=1e-5)


@pytest.mark.parametrize("left,right", [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")])
def test_score_takes_vllms_other_forms(client, embeds, left, right):
    "vLLM 0.33's request forms (`queries`/`documents` first) score as `text_1`/`text_2` do."
    r = client.post("/score", json={left: QUERY, right: DOCS})
    assert r.status_code == 200, r.text
    assert [d["score"] for d in r.json()["data"]] == pytest.approx([cos(embeds[QUERY], embeds[d]) for d in DOCS], abs=1e-5)
    r = client.post("/score", json={left: DOCS[:2], right: DOCS[2:]})
    assert [d["score"] for d in r.json()["data"]] == pytest.approx(
        [cos(embeds[DOCS[0]], embeds[DOCS[2]]), cos(embeds[DOCS[1]], embeds[DOCS[3]])], abs=1e-5)


def test_rerank_orders_by_the_cosine_of_llm_embed(client, embeds):
    want = sorted(((cos(embeds[QUERY], embeds[d]), i) for i, d in enumerate(DOCS)), reverse=True)
    for path, top_n in (("/rerank", 0), ("/v1/rerank", 2), ("/v2/rerank", 3)):
        headers = {"Authorization": "Bearer k"} if path.startswith("/v") else {}
        r = client.post(path, headers=headers, json={"query": QUERY, "documents": DOCS, "top_n": top_n})
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert len(res) == (top_n or len(DOCS))
        assert [(x["index"], x["document"]["text"]) for x in res] == [(i, DOCS[i]) for _, i in want[: len(res)]]
        assert [x["relevance_score"] for x in res] == pytest.approx([s for s, _ in want[: len(res)]], abs=1e-5)
    r = client.post("/rerank", json={"query": QUERY, "documents": DOCS[1]})    # one document, as a string
    assert r.json()["results"][0]["relevance_score"] == pytest.approx(cos(embeds[QUERY], embeds[DOCS[1]]), abs=1e-5)
    assert r.json()["usage"]["prompt_tokens"] == r.json()["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("path,body,param", [
    ("/score", {"text_1": DOCS[:2], "text_2": DOCS[:3]}, "text_1"),         # 2:3
    ("/score", {"text_1": QUERY, "text_2": []}, "text_2"),
    ("/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False}, "return_documents"),
    ("/score", {"text_1": QUERY, "text_2": DOCS, "model": "nope"}, "model"),
    ("/score", {"queries": DOCS[:2], "documents": DOCS[:3]}, "queries"),     # 2:3
    ("/score", {"queries": QUERY}, "documents"),                              # half a pair
    ("/score", {"queries": QUERY, "documents": DOCS, "items": DOCS}, "items"),  # two forms at once
    ("/score", {}, "queries"),
])
def test_bad_scoring_requests_are_clear_4xx(client, path, body, param):
    r = client.post(path, json=body)
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text


def maxsim(q, d) -> float:
    "ColBERT's MaxSim, written out: each query token's best dot product with a document token, summed."
    return sum(max(float(qi @ dj) for dj in d) for qi in q)


def test_token_embed_model_scores_by_late_interaction(tiny):
    """A model that pools for `token_embed` scores as vLLM's late-interaction models do: `LLM.score` and the server's
    `/score` are the MaxSim of the per-token matrices `LLM.encode` returns (not a cosine)."""
    from minivllm import LLM
    from minivllm.serve.async_engine import AsyncLLMEngine
    from minivllm.core.arg_utils import EngineArgs
    from minivllm.serve.server import build_app
    llm = LLM(model=tiny, max_model_len=128, pooler_config={"task": "token_embed"})
    mats = {t: o.outputs.data for t, o in zip([QUERY] + DOCS, llm.encode([QUERY] + DOCS, pooling_task="token_embed",
                                                                         use_tqdm=False))}
    assert all(m.ndim == 2 and m.shape[0] > 1 for m in mats.values())
    want = [maxsim(mats[QUERY], mats[d]) for d in DOCS]
    assert [o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)] == pytest.approx(want, abs=1e-4)
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(model=tiny, max_model_len=128,
                                                        pooler_config={"task": "token_embed"}))
    try:
        r = TestClient(build_app(engine)).post("/score", json={"queries": QUERY, "documents": DOCS})
        assert [d["score"] for d in r.json()["data"]] == pytest.approx(want, abs=1e-4)
    finally:
        engine.shutdown()
