"""vLLM's server extras on a real `minivllm serve` (float32, started with `VLLM_SERVER_DEV_MODE=1`), driven by the
official `openai` client where it has the call and by httpx otherwise:
- `/v1/embeddings` with every `embed_dtype` and `endianness`, as `base64`, `bytes` (the `metadata` header's offsets)
  and `bytes_only`, each decoded by hand and compared with the float answer cast to that dtype;
- `response_format={"type": "structural_tag", ...}` on chat and completions: the output is the tag, its content
  follows the schema;
- `/v1/chat/completions/batch`: each choice equals the plain chat on its conversation, usage adds up, refusals;
- `/pause?mode=keep` during a stream: nothing arrives while paused, the stream goes on after `/resume` and equals the
  unpaused greedy text; `mode=abort` ends the stream (finish reason `abort`) and refuses new requests with 503 until
  `/resume`."""
import base64, json, os, re, threading, time

import httpx, jsonschema, numpy as np, openai, pytest, torch
from conftest import running_server

pytestmark = pytest.mark.xdist_group("server_extras")   # its own server: any worker

NAME = "smol"
TEXTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "Bonjour"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.fixture(scope="module")
def server():
    old = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    try:
        with running_server("--served-model-name", NAME, "--max-model-len", "512", "--dtype", "float32") as base:
            yield base
    finally:
        if old is None: os.environ.pop("VLLM_SERVER_DEV_MODE")
        else: os.environ["VLLM_SERVER_DEV_MODE"] = old


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=300)


# ---------------------------------------------------------------- embeddings

def decode(raw: bytes, embed_dtype: str, endianness: str, shape) -> torch.Tensor:
    """Bytes back to a float32 tensor, by hand: numpy reads each number's bytes as an integer in the stated byte order,
    torch reinterprets the integers' bits as the dtype."""
    dt = DTYPES[embed_dtype]
    size = torch.empty(0, dtype=dt).element_size()
    order = {"native": "=", "little": "<", "big": ">"}[endianness]
    words = np.frombuffer(raw, f"{order}i{size}").astype(f"=i{size}")
    return torch.from_numpy(words.copy()).view(dt).float().reshape(shape)


def close_to(got: torch.Tensor, floats: list, embed_dtype: str):
    """`got` is the float answer cast to `embed_dtype`, up to one step of that dtype (the float answer came from another
    request, whose float32 sums may round differently in the last bits)."""
    dt = DTYPES[embed_dtype]
    want = torch.tensor(floats).to(dt).float()
    fi = torch.finfo(dt)
    tol = torch.maximum(want.abs() * fi.eps, torch.tensor(fi.smallest_normal * fi.eps)) + 1e-6
    assert got.shape == want.shape and bool(((got - want).abs() <= tol).all()), (embed_dtype, (got - want).abs().max())


def test_embeddings_dtypes_and_encodings(server, client):
    url = server + "/v1/embeddings"
    floats = [d["embedding"] for d in httpx.post(url, json={"model": NAME, "input": TEXTS}, timeout=300).json()["data"]]
    # the openai client's own base64 (float32, native order) decodes to the same floats
    via_client = client.embeddings.create(model=NAME, input=TEXTS)   # it asks for base64 and decodes it itself
    for d, f in zip(via_client.data, floats):
        close_to(torch.tensor(d.embedding), f, "float32")
    orders = {"float32": ("native", "little", "big"), "float16": ("big",), "bfloat16": ("little",),
              "fp8_e4m3": ("native",), "fp8_e5m2": ("big",)}   # (a byte per number: no order to swap)
    for embed_dtype in DTYPES:
        for endianness in orders[embed_dtype]:
            kw = dict(model=NAME, input=TEXTS, embed_dtype=embed_dtype, endianness=endianness)
            b64 = httpx.post(url, json=kw | {"encoding_format": "base64"}, timeout=300).json()
            for d, f in zip(b64["data"], floats):
                close_to(decode(base64.b64decode(d["embedding"]), embed_dtype, endianness, (576,)), f, embed_dtype)
            r = httpx.post(url, json=kw | {"encoding_format": "bytes"}, timeout=300)
            assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
            meta = json.loads(r.headers["metadata"])
            assert meta["model"] == NAME and meta["usage"]["prompt_tokens"] > 0
            items = sorted(meta["data"], key=lambda it: it["index"])
            assert [it["index"] for it in items] == [0, 1, 2] and items[-1]["end"] == len(r.content)
            for it, f in zip(items, floats):
                assert (it["embed_dtype"], it["endianness"], it["shape"]) == (embed_dtype, endianness, [576])
                close_to(decode(r.content[it["start"]:it["end"]], embed_dtype, endianness, it["shape"]), f, embed_dtype)
            only = httpx.post(url, json=kw | {"encoding_format": "bytes_only"}, timeout=300)
            assert "metadata" not in only.headers and len(only.content) == len(r.content)
        assert len(r.content) == 3 * 576 * DTYPES[embed_dtype].itemsize
    # what vLLM does not have, or what would be ignored, is refused by name
    for bad, field in [({"embed_dtype": "int8", "encoding_format": "base64"}, "embed_dtype"),
                       ({"embed_dtype": "float16"}, "embed_dtype"), ({"endianness": "big"}, "endianness"),
                       ({"encoding_format": "hex"}, "encoding_format")]:
        r = httpx.post(url, json={"model": NAME, "input": "x"} | bad, timeout=300)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (bad, r.text)


# ---------------------------------------------------------------- structural tags

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}
TAG = {"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<function="], "at_least_one": True, "stop_after_first": True,
    "tags": [{"begin": "<function=get_weather>", "content": {"type": "json_schema", "json_schema": CITY},
              "end": "</function>"}]}}
CALL = re.compile(r"<function=get_weather>(.*?)</function>", re.S)


def check_tag(text: str):
    m = CALL.search(text)
    assert m is not None, text
    jsonschema.validate(json.loads(m.group(1)), CITY)


def test_structural_tag_chat_and_completions(client):
    msgs = [{"role": "user", "content": "What is the weather in Paris? Use get_weather."}]
    for temperature, seed in ((0, None), (1.0, 1)):
        r = client.chat.completions.create(model=NAME, messages=msgs, response_format=TAG, max_tokens=60,
                                           temperature=temperature, seed=seed)
        check_tag(r.choices[0].message.content)
        assert r.choices[0].finish_reason == "stop"   # stop_after_first: the tag closes the reply
    r = client.completions.create(model=NAME, prompt="Weather lookup for Rome:", max_tokens=60, temperature=0,
                                  extra_body={"response_format": TAG})
    check_tag(r.choices[0].text)
    streamed = client.chat.completions.create(model=NAME, messages=msgs, response_format=TAG, max_tokens=60,
                                              temperature=0, stream=True)
    check_tag("".join(c.choices[0].delta.content or "" for c in streamed if c.choices))
    # the older form (structures + triggers) is taken too; a tag with both forms is a 400 naming the field
    old = {"type": "structural_tag", "triggers": ["<function="],
           "structures": [{"begin": "<function=get_weather>", "schema": CITY, "end": "</function>"}]}
    r = client.chat.completions.create(model=NAME, messages=msgs, response_format=old, max_tokens=24, temperature=0)
    for m in CALL.finditer(r.choices[0].message.content):
        jsonschema.validate(json.loads(m.group(1)), CITY)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, response_format=dict(TAG, triggers=["<"]))
    assert e.value.body["param"] == "response_format"


# ---------------------------------------------------------------- batch chat

def test_batch_chat_equals_single_chats(server, client):
    convs = [[{"role": "user", "content": "Name a colour."}],
             [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Say hello."}],
             [{"role": "user", "content": "Count to three."}]]
    r = httpx.post(server + "/v1/chat/completions/batch", timeout=300,
                   json={"model": NAME, "messages": convs, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "chat.completion" and [c["index"] for c in b["choices"]] == [0, 1, 2]
    n_in = n_out = 0
    for conv, ch in zip(convs, b["choices"]):
        one = client.chat.completions.create(model=NAME, messages=conv, max_tokens=12, temperature=0)
        assert (ch["message"]["role"], ch["message"]["content"]) == ("assistant", one.choices[0].message.content)
        assert ch["finish_reason"] == one.choices[0].finish_reason
        n_in, n_out = n_in + one.usage.prompt_tokens, n_out + one.usage.completion_tokens
    assert (b["usage"]["prompt_tokens"], b["usage"]["completion_tokens"]) == (n_in, n_out)
    for bad, field in [({"stream": True}, "stream"), ({"n": 2}, "n"), ({"messages": []}, "messages"),
                       ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")]:
        r = httpx.post(server + "/v1/chat/completions/batch", json={"model": NAME, "messages": convs} | bad, timeout=300)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (bad, r.text)


# ---------------------------------------------------------------- pause / resume

def read_stream(server, body, log):
    "Read a streamed completion, logging (arrival time, text, finish reason) per chunk."
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ch = json.loads(line[6:])["choices"][0]
                log.append((time.monotonic(), ch["text"], ch["finish_reason"]))


def test_pause_keep_during_a_stream_then_resume(server, client):
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    want = httpx.post(server + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
    log = []
    reader = threading.Thread(target=read_stream, args=(server, body | {"stream": True}, log))
    reader.start()
    while len(log) < 5:
        time.sleep(0.01)
    r = httpx.post(server + "/pause", params={"mode": "keep", "clear_cache": "false"}, timeout=60)
    assert r.json() == {"status": "paused"}
    assert httpx.get(server + "/is_paused").json() == {"is_paused": True}
    paused_at, n_paused = time.monotonic(), len(log)
    time.sleep(2.0)
    assert len(log) <= n_paused + 1 and len(log) < 40   # (one chunk may have been on its way)
    assert httpx.post(server + "/resume").json() == {"status": "resumed"}
    resumed_at = time.monotonic()
    reader.join(300)
    assert httpx.get(server + "/is_paused").json() == {"is_paused": False}
    assert "".join(t for _, t, _ in log) == want and log[-1][2] == "length"
    assert not [t for t, *_ in log if paused_at + 0.5 < t < resumed_at]   # nothing while paused
    assert sum(t > resumed_at for t, *_ in log) >= 40 - n_paused - 1
    # keep with the default clear_cache: the frozen request gives its blocks back and recomputes; it still finishes
    log2 = []
    reader = threading.Thread(target=read_stream, args=(server, body | {"stream": True}, log2))
    reader.start()
    while len(log2) < 5:
        time.sleep(0.01)
    assert httpx.post(server + "/pause", params={"mode": "keep"}, timeout=60).json() == {"status": "paused"}
    queued = []   # a new request in keep mode waits for /resume
    short = dict(model=NAME, prompt="Hi", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    waiter = threading.Thread(target=lambda: queued.append(client.completions.create(**short)))
    waiter.start()
    time.sleep(1.0)
    assert not queued
    httpx.post(server + "/resume")
    reader.join(300), waiter.join(300)
    assert len(log2) == 40 and log2[-1][2] == "length" and queued[0].usage.completion_tokens == 3


def test_pause_abort_ends_streams_and_refuses_new_requests(server, client):
    body = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    log = []
    reader = threading.Thread(target=read_stream, args=(server, body, log))
    reader.start()
    while len(log) < 3:
        time.sleep(0.01)
    assert httpx.post(server + "/pause", timeout=60).json() == {"status": "paused"}   # mode=abort, the default
    reader.join(60)
    assert log[-1][2] == "abort" and len(log) < 200
    with pytest.raises(openai.InternalServerError) as e:   # 503 until /resume
        client.completions.create(model=NAME, prompt="Hi", max_tokens=2)
    assert e.value.status_code == 503 and e.value.body["type"] == "ServiceUnavailableError"
    r = httpx.post(server + "/v1/embeddings", json={"model": NAME, "input": "x"})
    assert r.status_code == 503
    r = httpx.post(server + "/v1/responses", json={"model": NAME, "input": "Hi", "stream": True})
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"   # before any event
    assert httpx.post(server + "/pause", params={"mode": "sometimes"}).status_code == 400
    httpx.post(server + "/resume")
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    # wait mode: /pause answers once the request in flight has finished, whole
    log = []
    reader = threading.Thread(target=read_stream, args=(server, body | {"max_tokens": 30}, log))
    reader.start()
    while len(log) < 3:
        time.sleep(0.01)
    assert httpx.post(server + "/pause", params={"mode": "wait"}, timeout=300).json() == {"status": "paused"}
    reader.join(10)   # (its last chunk may still be on the wire)
    assert not reader.is_alive() and len(log) == 30 and log[-1][2] == "length"
    assert httpx.post(server + "/v1/completions", json={"model": NAME, "prompt": "Hi"}).status_code == 503
    httpx.post(server + "/resume")
