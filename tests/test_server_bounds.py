"""Every route bounded before it works, and client mistakes answered with a 4xx that names them (`minivllm serve` on a
tiny random model with SmolLM2's tokenizer, through httpx):

- `/tokenize` and `/detokenize` take the generation routes' bounds: a prompt longer (in characters) than the context
  can hold, a text of more tokens than `max_model_len`, and more token ids than `max_model_len` are 400s that name
  the field, answered within a second; a big `/tokenize` runs off the event loop (`/health` answers meanwhile).
- A lone surrogate (`"\\ud800"`, not valid Unicode: UTF-8 cannot encode it) in chat content or a `/tokenize` prompt
  is a 400 naming the field, as `/v1/completions` answers (it was a 500: the tokenizer raised `TypeError`).
- An invalid tool schema (`{"type": "bogus"}`, `{"$ref": "#/nowhere"}`) with `tool_choice` `"required"` or a named
  function, on chat and on `/v1/responses`, is a 400 naming `tool_choice` (it was a 500).
- `max_tokens` (`max_completion_tokens`, `max_output_tokens`) beyond what the context holds after the prompt is a 400
  naming it, as vLLM answers (it was accepted).
- A structured-outputs grammar that matches no text at all (the regex `[^\\s\\S]`) is a 400 naming the
  field (`structured_outputs`, `guided_regex`; it was a 200 whose output ended with `finish_reason: "abort"`).
- `/v2` routes ask for the API key, as `/v1` routes do.
- A connection whose request line and headers are not all in within `--header-timeout` seconds gets a 408 and is
  closed (they were held open for as long as the client liked), while `/health` answers."""

import json, socket, threading, time
from urllib.parse import urlsplit

import httpx, pytest
from conftest import running_server

pytestmark = pytest.mark.xdist_group("tp")  # one xdist worker: a server process of its own

MAX_LEN = 512
KEY = "k3y"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    from minivllm.core.model import make_tiny_checkpoint

    d = tmp_path_factory.mktemp("tiny_bounds")
    make_tiny_checkpoint(d, "llama", seed=1, tokenizer_from=model_dir, vocab_size=49152, hidden_size=64,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, num_hidden_layers=2,
                         tie_word_embeddings=True)
    with running_server(str(d), "--served-model-name", "tiny", "--max-model-len", str(MAX_LEN), "--dtype", "float32",
                        "--kv-cache-memory-bytes", str(8 << 20), "--api-key", KEY, "--header-timeout", "1") as base:
        yield base


def post(base, path, body, timeout=30):
    t0 = time.monotonic()
    # (json.dumps writes a lone surrogate as its `\ud800` escape, as a client's JSON encoder does)
    r = httpx.post(base + path, content=json.dumps(body), headers={"content-type": "application/json", **AUTH},
                   timeout=timeout)
    return r, time.monotonic() - t0


def check_400(r, dt, param, *words):
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], (w, err)
    assert dt < 1, dt


def test_tokenize_and_detokenize_are_bounded(server):
    chat = [{"role": "user", "content": "Hi"}]
    r, _ = post(server, "/tokenize", dict(prompt="Hello world", return_token_strs=True))
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["token_strs"]), r.text
    # a text too long (in characters) for any tokenization to fit: refused before it is tokenized
    check_400(*post(server, "/tokenize", dict(prompt="a" * 2_000_000, return_token_strs=True)), "prompt",
              "2000000 characters")
    check_400(*post(server, "/tokenize", dict(messages=[{"role": "user", "content": "a" * 2_000_000}])), "messages",
              "characters")
    # within the character bound but over max_model_len tokens: refused, naming the length
    check_400(*post(server, "/tokenize", dict(prompt="1 " * 1000)), "prompt", "maximum model length")
    r, _ = post(server, "/tokenize", dict(messages=chat))
    assert r.status_code == 200, r.text
    # more ids than the context holds, and an id past the vocabulary
    check_400(*post(server, "/detokenize", dict(tokens=[5] * (MAX_LEN + 1))), "tokens", "maximum model length")
    check_400(*post(server, "/detokenize", dict(tokens=[5, 49152])), "tokens", "vocabulary size 49152")
    ids = post(server, "/tokenize", dict(prompt="Hello world", add_special_tokens=False))[0].json()["tokens"]
    r, _ = post(server, "/detokenize", dict(tokens=ids))
    assert r.status_code == 200 and r.json()["prompt"] == "Hello world", r.text


def test_health_answers_during_a_big_tokenize(server):
    "The largest prompt the bound lets through is tokenized off the event loop: /health answers meanwhile."
    big = dict(prompt="ab " * 60_000, return_token_strs=True)  # 180,000 characters: within the bound
    slowest, done = [0.0], threading.Event()

    def probe():
        while not done.is_set():
            t0 = time.monotonic()
            assert httpx.get(server + "/health", timeout=10).status_code == 200
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.01)

    t = threading.Thread(target=probe)
    t.start()
    try:
        for _ in range(3):
            r, _ = post(server, "/tokenize", big, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text  # over max_model_len
    finally:
        done.set()
        t.join()
    assert slowest[0] < 1, slowest[0]  # (a stall of the event loop is seconds; a shared 2-core machine adds noise)


LONE = "caf\ud800e"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": LONE}], max_tokens=2),
     "messages.0.content"),
    ("/v1/chat/completions", dict(model="tiny", max_tokens=2,
                                  messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
     "messages.0.content.0.text"),
    ("/tokenize", dict(prompt=LONE), "prompt"),
    ("/tokenize", dict(messages=[{"role": "user", "content": LONE}]), "messages.0.content"),
    ("/v1/completions", dict(model="tiny", prompt=LONE, max_tokens=2), "prompt"),
    ("/v1/responses", dict(model="tiny", input=LONE, max_output_tokens=4), "input"),
])
def test_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    check_400(*post(server, path, body), param, "surrogate", "\\ud800")


NOTHING = r"[^\s\S]"  # a character neither space nor not space: a regex no text matches
BAD_SCHEMAS = [{"type": "bogus"}, {"$ref": "#/nowhere"}]


def tool(params):
    return {"type": "function", "function": {"name": "f", "parameters": params}}


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_invalid_tool_schema_is_a_400_on_chat(server, schema, choice):
    body = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, tools=[tool(schema)],
                tool_choice=choice)
    check_400(*post(server, "/v1/chat/completions", body), "tool_choice")


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "f"}])
def test_invalid_tool_schema_is_a_400_on_responses(server, schema, choice):
    body = dict(model="tiny", input="Hi", max_output_tokens=16, tool_choice=choice,
                tools=[{"type": "function", "name": "f", "parameters": schema}])
    check_400(*post(server, "/v1/responses", body), "tool_choice")


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", dict(model="tiny", prompt="Hi", max_tokens=10**9), "max_tokens"),
    ("/v1/completions", dict(model="tiny", prompt="Hi", max_tokens=2**63 - 1), "max_tokens"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=10**9),
     "max_tokens"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                  max_completion_tokens=MAX_LEN), "max_completion_tokens"),
    ("/v1/responses", dict(model="tiny", input="Hi", max_output_tokens=10**12), "max_tokens"),
])
def test_max_tokens_beyond_the_context_is_a_400(server, path, body, param):
    check_400(*post(server, path, body), param, "is too large", f"maximum context length is {MAX_LEN}")
    ok = dict(body, **{k: 2 for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if k in body})
    r, _ = post(server, path, ok)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", dict(model="tiny", prompt="Hi", max_tokens=4, structured_outputs={"regex": NOTHING}),
     "structured_outputs"),
    ("/v1/chat/completions", dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                  structured_outputs={"regex": NOTHING}), "structured_outputs"),
    ("/v1/completions", dict(model="tiny", prompt="Hi", max_tokens=4, guided_regex=NOTHING), "guided_regex"),
])
def test_a_grammar_that_matches_nothing_is_a_400(server, path, body, param):
    check_400(*post(server, path, body), param, "matches no text at all")
    ok = {k: v for k, v in body.items() if k not in ("structured_outputs", "guided_regex")}
    r, _ = post(server, path, dict(ok, structured_outputs={"regex": "[ab]"}))
    assert r.status_code == 200, r.text


def test_v2_needs_the_api_key(server):
    body = dict(model="tiny", query="a", documents=["b", "c"])
    assert httpx.post(server + "/v2/rerank", json=body).status_code == 401
    assert httpx.post(server + "/v2/rerank", json=body, headers=AUTH).status_code != 401


def test_batch_chat_is_bounded(server):
    from minivllm.serve.more_routes import MAX_BATCH_CONVERSATIONS
    convs = [[{"role": "user", "content": "Hi"}]] * (MAX_BATCH_CONVERSATIONS + 1)
    check_400(*post(server, "/v1/chat/completions/batch", dict(model="tiny", messages=convs, max_tokens=1)), "messages",
              f"at most {MAX_BATCH_CONVERSATIONS}")


def test_internal_errors_carry_no_internals():
    from minivllm.serve.server import internal_error
    e = internal_error(RuntimeError("/usr/lib/gloo/something.cpp:42 <object at 0x7f>"))
    assert e.status == 500 and "gloo" not in e.message and "0x7f" not in e.message and "RuntimeError" in e.message


def test_slow_request_heads_are_cut_off(server):
    "50 clients that never finish their headers: each gets a 408 and is closed after the header timeout (1 s)."
    addr = urlsplit(server)
    socks = [socket.create_connection((addr.hostname, addr.port), timeout=10) for _ in range(50)]
    for s in socks: s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n")
    t0 = time.monotonic()
    assert httpx.get(server + "/health", timeout=5).status_code == 200   # served meanwhile
    answers = [s.recv(200) for s in socks]
    waited = time.monotonic() - t0
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert all(s.recv(10) == b"" for s in socks)   # closed by the server
    for s in socks: s.close()
    assert 0.5 < waited < 10, waited
