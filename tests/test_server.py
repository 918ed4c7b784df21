"""A real `minivllm serve` on loopback, driven by the official `openai` client and by raw HTTP: completions and chat,
streamed and not, n=2, stop, logprobs, usage, errors; then a bounded load test with clients that disconnect midway."""
import asyncio, json, os, re, socket, subprocess, sys, time
import httpx, pytest
from conftest import running_server
import openai

pytestmark = pytest.mark.xdist_group("server")   # one worker runs the whole module against one server

KEY = "test-key"
NAME = "smol"


@pytest.fixture(scope="module")
def server():
    with running_server("--api-key", KEY, "--served-model-name", NAME, "--max-model-len", "512") as base: yield base


@pytest.fixture(scope="module")
def client(server): return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference():
    "Greedy texts from `LLM.generate`, the offline path, for the same prompts."
    from minivllm import LLM, SamplingParams
    llm = LLM(max_model_len=512)
    tok = llm.get_tokenizer()
    prompt = "The capital of France is"
    chat = [{"role": "user", "content": "Name three colors."}]
    comp = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    chat_text = llm.chat(chat, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    return dict(prompt=prompt, completion=comp, chat=chat, chat_text=chat_text)


def metrics(server) -> dict:
    text = httpx.get(server + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(minivllm_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", text, re.M)}


def test_models(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_completion_greedy_equals_llm_generate(client, reference):
    r = client.completions.create(model=NAME, prompt=reference["prompt"], max_tokens=16, temperature=0)
    assert r.choices[0].text == reference["completion"]
    assert r.usage.completion_tokens == 16 or r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_equals_non_stream(client, reference):
    chunks = list(client.completions.create(model=NAME, prompt=reference["prompt"], max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference["completion"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_chat_greedy_stream_and_not(client, reference):
    r = client.chat.completions.create(model=NAME, messages=reference["chat"], max_tokens=16, temperature=0)
    assert r.choices[0].message.content == reference["chat_text"] and r.choices[0].message.role == "assistant"
    s = client.chat.completions.create(model=NAME, messages=reference["chat"], max_tokens=16, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == reference["chat_text"]


def test_n2_and_seed(client):
    r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, n=2, temperature=1.0, seed=3)
    assert sorted(c.index for c in r.choices) == [0, 1]
    again = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, n=2, temperature=1.0, seed=3)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_stop(client, reference):
    full = reference["completion"]
    stop = full.strip().split()[1] if len(full.strip().split()) > 1 else full.strip()[:3]
    r = client.completions.create(model=NAME, prompt=reference["prompt"], max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
    assert full.startswith(r.choices[0].text)


def test_logprobs(client, reference):
    r = client.completions.create(model=NAME, prompt=reference["prompt"], max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and all(v <= 0 for v in lp.token_logprobs)
    # greedy: the chosen token is the most likely one
    for tok, best in zip(lp.token_logprobs, lp.top_logprobs): assert abs(tok - max(best.values())) < 1e-4
    c = client.chat.completions.create(model=NAME, messages=reference["chat"], max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    assert len(c.choices[0].logprobs.content) == 3 and len(c.choices[0].logprobs.content[0].top_logprobs) == 2


@pytest.mark.parametrize("body, field", [
    (b'{"model": "smol", "prompt": "hi", "max_tokens": ', "JSON"),
    (b'{"model": "smol", "prompt": "hi", "max_tokens": "ten"}', "max_tokens"),
    (b'{"model": "smol", "prompt": "hi", "max_tokens": -1}', "max_tokens"),
    (b'{"model": "smol", "prompt": "hi", "n": 0}', "n"),
    (b'{"model": "smol", "prompt": "hi", "temperature": "hot"}', "temperature"),
    (b'{"model": "smol", "prompt": "hi", "best_of_three": 2}', "best_of_three"),
    (b'{"model": "smol"}', "prompt"),
    (json.dumps({"model": "smol", "prompt": "word " * 600}).encode(), "maximum model length"),
])
def test_bad_input_is_a_clear_4xx(server, body, field):
    r = httpx.post(server + "/v1/completions", content=body, headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]
    ok = httpx.post(server + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2}, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert ok.status_code == 200   # still serving


def test_auth_and_unknown_model(server, client):
    assert httpx.get(server + "/v1/models").status_code == 401
    assert httpx.get(server + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert httpx.get(server + "/health").status_code == 200


def test_load_with_disconnects(server, reference):
    "40 concurrent streaming clients of mixed lengths, every fifth disconnecting after 2 chunks; bounded in time."
    N = 40
    async def one(i, ac):
        usage = None
        n = 4 + (i * 7) % 23
        prompt = f"Story {i}: " + "once upon a time, " * (1 + i % 12)          # prompts of mixed lengths
        stream = await ac.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0.8, seed=i, stream=True,
                                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        got, finish = 0, None
        async for c in stream:
            if c.usage is not None: usage = c.usage.completion_tokens
            if not c.choices: continue
            got += 1
            finish = c.choices[0].finish_reason or finish
            if i % 5 == 0 and got == 2:
                await stream.close()
                return "dropped", n, got
        return finish, n, usage

    async def main():
        async with openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=240) as ac:
            return await asyncio.wait_for(asyncio.gather(*(one(i, ac) for i in range(N))), timeout=400)

    results = asyncio.run(main())
    done = [r for r in results if r[0] != "dropped"]
    assert len(done) == N - N // 5 and all(r[0] == "length" and r[2] == r[1] for r in done)   # each got all its n tokens
    # the server is still up, and once idle no request is left running and every KV block is free
    deadline = time.time() + 60
    while time.time() < deadline:
        m = metrics(server)
        if m["minivllm_num_requests_running"] == 0 and m["minivllm_num_requests_waiting"] == 0: break
        time.sleep(0.5)
    assert m["minivllm_num_requests_running"] == 0 and m["minivllm_num_requests_waiting"] == 0
    assert m["minivllm_kv_cache_free_blocks"] == m["minivllm_kv_cache_total_blocks"]
    assert m['minivllm_requests_total{finish_reason="abort"}'] >= N // 5
    r = httpx.post(server + "/v1/completions", json={"model": NAME, "prompt": reference["prompt"], "max_tokens": 16, "temperature": 0},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.json()["choices"][0]["text"] == reference["completion"]
