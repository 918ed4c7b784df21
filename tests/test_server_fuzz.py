"""The server fuzzed against the OpenAPI schema it publishes (schemathesis), on a tiny random model so that the
generated requests (any `max_tokens`, `n` up to 128) finish quickly: no response is a 5xx, every status, content type,
header and body is the one the schema documents, and the server is healthy afterwards."""
import shutil, subprocess
import httpx, pytest

pytestmark = pytest.mark.xdist_group("server_fuzz")
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance"


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, model_dir):
    from conftest import running_server
    from minivllm.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint(d, "llama", tokenizer_from=model_dir, vocab_size=49152, tie_word_embeddings=True)
    with running_server(str(d), "--max-model-len", "128") as base: yield base


def test_published_schema(tiny_server):
    spec = httpx.get(tiny_server + "/openapi.json").json()
    assert spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}
    assert "text/event-stream" in spec["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert spec["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}
    r = httpx.get(tiny_server + "/health")
    assert (r.status_code, r.text, r.headers["content-type"].split(";")[0]) == (200, "OK", "text/plain")


@pytest.mark.skipif(shutil.which("st") is None, reason="schemathesis is not installed")
def test_schemathesis_fuzz(tiny_server, tmp_path):
    r = subprocess.run(["st", "run", tiny_server + "/openapi.json", "--checks", CHECKS, "--phases", "examples,fuzzing",
                        "-n", "60", "--seed", "16", "--workers", "2", "--request-timeout", "120"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:]
    assert "failures" not in r.stdout.split("SUMMARY")[-1].lower() or " 0 failures" in r.stdout
    assert httpx.get(tiny_server + "/health").status_code == 200
    m = httpx.get(tiny_server + "/metrics").text
    free = float(next(l.split()[1] for l in m.splitlines() if l.startswith("minivllm_kv_cache_free_blocks ")))
    total = float(next(l.split()[1] for l in m.splitlines() if l.startswith("minivllm_kv_cache_total_blocks ")))
    assert free == total   # nothing left running, every block back
