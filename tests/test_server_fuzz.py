"""The server fuzzed against the OpenAPI schema it publishes (schemathesis), on a tiny random model so that the
generated requests (any `max_tokens`, `n` up to 128) finish quickly: no response is a 5xx, every status, content type,
header and body is the one the schema documents, and the server is healthy afterwards. All three phases run: the
explicit examples, the coverage phase (every boundary and every negative form of each field, deterministically) and
random fuzzing (bounded by `-n`, so the run stays within a few minutes on 2 cores)."""
import shutil, subprocess
import httpx, pytest

pytestmark = pytest.mark.xdist_group("server_fuzz")
# every schemathesis check but `positive_data_acceptance`: that one expects every schema-valid body to succeed, and no
# JSON schema can say that a grammar must parse, that a token id must be below the vocabulary size or that a
# `logit_bias` key must be a token id — such requests get a 400 that names the field, which the schema documents.
# `--max-response-time` is generous: a request may generate up to the 128-token context on a loaded 2-core CPU; the
# server's latency is not what this test checks. One worker: schemathesis' generation in two threads at once hits a
# CPython 3.11 bug in `ast.parse` ("AST constructor recursion depth mismatch"), a crash of the fuzzer, not the server.
CHECKS = ["--checks", "all", "--exclude-checks", "positive_data_acceptance", "--max-response-time", "120"]


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, model_dir):
    from conftest import running_server
    from minivllm.core.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint(d, "llama", tokenizer_from=model_dir, vocab_size=49152, tie_word_embeddings=True)
    with running_server(str(d), "--max-model-len", "128") as base: yield base


def test_published_schema(tiny_server):
    spec = httpx.get(tiny_server + "/openapi.json").json()
    assert spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}
    assert "text/event-stream" in spec["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert spec["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}
    for body in ({"prompt": ""}, {"prompt": [[False]]}, {"prompt": [1.5]}, {"prompt": [[1], [2]]}):   # what the schema forbids
        r = httpx.post(tiny_server + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt"), (body, r.text)
    r = httpx.post(tiny_server + "/v1/completions", json={"prompt": [3.0, 4], "max_tokens": 1})   # JSON Schema's integer
    assert r.status_code == 200, r.text
    r = httpx.get(tiny_server + "/health")
    assert (r.status_code, r.text, r.headers["content-type"].split(";")[0]) == (200, "OK", "text/plain")


@pytest.mark.skipif(shutil.which("st") is None, reason="schemathesis is not installed")
def test_schemathesis_fuzz(tiny_server, tmp_path):
    r = subprocess.run(["st", "run", tiny_server + "/openapi.json", *CHECKS, "--continue-on-failure", "--phases", "examples,coverage,fuzzing",
                        "-n", "20", "--seed", "16", "--workers", "1", "--request-timeout", "120"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:]
    assert "failures" not in r.stdout.split("SUMMARY")[-1].lower() or " 0 failures" in r.stdout
    assert httpx.get(tiny_server + "/health").status_code == 200
    m = httpx.get(tiny_server + "/metrics").text
    free = float(next(l.split()[1] for l in m.splitlines() if l.startswith("minivllm_kv_cache_free_blocks ")))
    total = float(next(l.split()[1] for l in m.splitlines() if l.startswith("minivllm_kv_cache_total_blocks ")))
    assert free == total   # nothing left running, every block back
