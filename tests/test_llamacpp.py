"""llama.cpp as a benchmark system: the client code (`LlamaServer`, `run_llamacpp`, `latency_llamacpp`,
`llamacpp_top_logprobs`, `bench ... --llama-server`) against `llama_stub.py`, a small server speaking llama.cpp's
`/health` + `/completion` protocol, started as the binary would be; and against the real `llama-server` when
MINIVLLM_LLAMA_SERVER names it (how to build it: the benchmarks notebook)."""
import json, os, stat, sys
from pathlib import Path
import pytest

STUB = Path(__file__).with_name("llama_stub.py")
sys.path.insert(0, str(STUB.parent))
import llama_stub  # noqa: E402  (the stub's "model", to know what it must answer)
from test_benchmarks import tiny_dir  # noqa: E402,F401  (the tiny checkpoint fixture, shared)

pytestmark = pytest.mark.xdist_group("bench")


@pytest.fixture(scope="module")
def stub_binary(tmp_path_factory):
    "An executable that starts the stub with the arguments `LlamaServer` passes to `llama-server`."
    p = tmp_path_factory.mktemp("bin") / "llama-server"
    p.write_text(f"#!/bin/sh\nexec {sys.executable} {STUB} \"$@\"\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


@pytest.fixture(scope="module")
def stub(stub_binary):
    from minivllm.benchmarks import LlamaServer
    with LlamaServer(stub_binary, n_parallel=4, ctx_per_slot=512, threads=1, startup_timeout=30) as srv: yield srv


def expected_tokens(prompt, n):
    ids, out = list(prompt), []
    for _ in range(n): out.append(llama_stub.next_token(ids)); ids.append(out[-1])
    return out


def test_server_process_starts_waits_for_health_and_stops(stub_binary):
    from minivllm.benchmarks import LlamaServer
    srv = LlamaServer(stub_binary, n_parallel=2, ctx_per_slot=300, threads=1, startup_timeout=30)
    assert srv.name == "llama.cpp Q4_1" and srv.proc is None
    with srv:
        import httpx
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}     # the stub answers 503 for its first 0.5 s
        proc = srv.proc
        assert srv.args[srv.args.index("-c") + 1] == "600" and "--no-webui" in srv.args
    assert proc.poll() is not None and srv.proc is None                       # stopped
    assert srv.version() == "version: 0 (stub)"


def _alive(pid) -> bool:
    try: return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError: return False


def test_server_dies_with_the_benchmark_process(stub_binary):
    "A benchmark killed outright (no `stop()`, no context manager exit) leaves no llama-server behind."
    import subprocess, time
    code = (f"import time; from minivllm.benchmarks import LlamaServer; s = LlamaServer({stub_binary!r}, startup_timeout=30).start(); "
            "print(s.proc.pid, flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    assert _alive(pid)
    p.kill(); p.wait()
    for _ in range(100):
        if not _alive(pid): break
        time.sleep(0.1)
    assert not _alive(pid)


def test_server_that_exits_is_an_error_with_its_log(tmp_path):
    from minivllm.benchmarks import LlamaServer
    bad = tmp_path / "llama-server"
    bad.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n"); bad.chmod(0o755)
    with pytest.raises(RuntimeError, match="failed to load model"): LlamaServer(str(bad), startup_timeout=30).start()


def test_throughput_runner_counts_exact_tokens(stub):
    from minivllm.benchmarks import make_workload, run_llamacpp, Workload
    wl = make_workload(6, seed=2, prompt_len=(3, 40), output_len=(2, 12), vocab_size=1000, low_id=20)
    r = run_llamacpp(stub, wl)
    assert (r.system, r.output_tokens, r.num_requests, r.prompt_tokens) == ("llama.cpp Q4_1", wl.num_output_tokens, 6, wl.num_prompt_tokens)
    assert r.extra["tokens"] == [expected_tokens(p, n) for p, n in zip(wl.prompts, wl.output_lens)] and r.seconds > 0
    with pytest.raises(RuntimeError, match="wrong output lengths"):        # the server generated one token too few
        run_llamacpp(stub, Workload([[llama_stub.SHORT_PROMPT, 50, 60]], [5]))


def test_latency_runner_times_the_stream(stub):
    from minivllm.benchmarks import make_workload, latency_llamacpp
    wl = make_workload(3, seed=0, prompt_len=20, output_len=10, vocab_size=1000, low_id=20)
    lat = latency_llamacpp(stub, wl)
    assert (lat.system, lat.concurrency, lat.prompt_len, lat.output_len, len(lat.ttft)) == ("llama.cpp Q4_1", 3, 20, 10, 3)
    assert all(t >= 0.05 for t in lat.ttft)                                   # the stub's "prefill" sleeps 50 ms before the first token
    assert all(0 < t < 1.0 for t in lat.tpot)


def test_top_logprobs_are_read_from_completion_probabilities(stub):
    from minivllm.benchmarks import llamacpp_top_logprobs, compare_top_logprobs
    toks, tops = llamacpp_top_logprobs(stub.url, [101, 202, 303], 4, k=3)
    assert toks == expected_tokens([101, 202, 303], 4) and len(tops) == 4
    ids = [101, 202, 303]
    for t, top in zip(toks, tops):
        assert top == {d["id"]: d["logprob"] for d in llama_stub.top_logprobs(ids, 3)} and max(top, key=top.get) == t
        ids.append(t)
    r = compare_top_logprobs((toks, tops), (toks, tops))
    assert (r["steps"], r["top1_agree"], r["compared"], r["max_abs_diff"]) == (4, 4, 12, 0.0)


def test_bad_request_is_an_error(stub):
    import httpx
    from minivllm.benchmarks import _llama_request, run_coroutine
    async def go():
        async with httpx.AsyncClient() as c: return await _llama_request(c, stub.url, "not token ids", 3)
    with pytest.raises(RuntimeError, match="HTTP 400"): run_coroutine(go())


def test_compare_logprobs_against_the_stub(stub, tiny_dir):
    "The comparison's plumbing (per-prompt rows, summary, errors): the stub's arithmetic model is not the tiny model, so little agrees."
    from minivllm.benchmarks import compare_logprobs_llamacpp
    from minivllm.core.llm import LLM
    llm = LLM(model=tiny_dir, max_model_len=128)
    r = compare_logprobs_llamacpp(stub, llm=llm, prompts=[[5, 6, 7], [10, 11, 12, 13]], k=3, num_tokens=4)   # (the tiny vocabulary: ids)
    assert r["llama_cpp"] == "llama.cpp Q4_1" and (r["k"], r["num_tokens"], r["minivllm"]["quantization"]) == (3, 4, None)
    assert [(p["prompt"], p["prompt_len"]) for p in r["prompts"]] == [(None, 3), (None, 4)]
    assert all(1 <= p["steps"] <= 4 for p in r["prompts"]) and r["summary"]["steps"] == sum(p["steps"] for p in r["prompts"])
    with pytest.raises(FileNotFoundError, match="--llama-server"): compare_logprobs_llamacpp("/nonexistent/llama-server", llm=llm)


def test_bench_commands_with_llama_server(tiny_dir, stub_binary, tmp_path, capsys):
    from minivllm.serve.cli import main
    from minivllm.core.model_files import embedded_gguf_path
    t, l = tmp_path / "t.json", tmp_path / "l.json"
    assert main(["bench", "throughput", "--model", tiny_dir, "--max-model-len", "128", "--num-prompts", "5", "--prompt-len", "4", "30",
                 "--output-len", "2", "9", "--systems", "minivllm", "--llama-server", stub_binary, "--llama-gguf", str(embedded_gguf_path()),
                 "--llama-parallel", "2", "--rounds", "2", "--json", str(t)]) == 0
    assert "llama.cpp Q4_1" in capsys.readouterr().out
    doc = json.loads(t.read_text())
    assert sorted(doc["summary"]) == ["llama.cpp Q4_1", "minivllm"] and "ratio" in doc["summary"]["llama.cpp Q4_1"]
    assert [r["system"] for r in doc["results"]] == ["minivllm", "llama.cpp Q4_1", "llama.cpp Q4_1", "minivllm"]   # rotated
    assert len({r["output_tokens"] for r in doc["results"]}) == 1
    ll = doc["llama_cpp"]
    assert (ll["file_type"], ll["version"], ll["args"][ll["args"].index("-np") + 1]) == ("Q4_1", "version: 0 (stub)", "2")
    assert ll["args"][ll["args"].index("-c") + 1] == str(2 * 256)              # 2 slots of (30 + 9 + 1 rounded up to 256) tokens
    assert main(["bench", "latency", "--model", tiny_dir, "--max-model-len", "128", "--prompt-len", "16", "--output-len", "4",
                 "--concurrency", "1", "2", "--systems", "minivllm", "--llama-server", stub_binary, "--json", str(l)]) == 0
    lat = json.loads(l.read_text())
    assert [(r["system"], r["concurrency"], len(r["ttft"])) for r in lat["results"]] == [
        ("minivllm", 1, 1), ("llama.cpp Q4_1", 1, 1), ("minivllm", 2, 2), ("llama.cpp Q4_1", 2, 2)]
    assert lat["llama_cpp"]["args"][lat["llama_cpp"]["args"].index("-np") + 1] == "2"   # slots = the largest concurrency


def test_bench_without_the_binary_names_the_flag(tiny_dir, capsys):
    from minivllm.serve.cli import main
    assert main(["bench", "throughput", "--model", tiny_dir, "--llama-server", "/nonexistent/llama-server"]) == 2
    assert "--llama-server" in capsys.readouterr().err
    assert main(["bench", "latency", "--model", tiny_dir, "--llama-gguf", "x.gguf"]) == 2
    assert "--llama-gguf needs --llama-server" in capsys.readouterr().err


REAL = os.environ.get("MINIVLLM_LLAMA_SERVER")
needs_real = pytest.mark.skipif(not REAL, reason="MINIVLLM_LLAMA_SERVER does not name a llama.cpp server binary (see the benchmarks notebook)")


@needs_real
def test_real_llama_server():
    "The real binary on the embedded Q4_1 GGUF: exact lengths; its 4-bit log-probs near minivllm's float32 expansion of the same file."
    from minivllm.benchmarks import LlamaServer, make_workload, run_llamacpp, latency_llamacpp, compare_logprobs_llamacpp
    with LlamaServer(REAL, n_parallel=2, ctx_per_slot=512) as srv:
        wl = make_workload(3, seed=0, prompt_len=(8, 40), output_len=(4, 8))
        r = run_llamacpp(srv, wl)
        assert r.output_tokens == wl.num_output_tokens and [len(t) for t in r.extra["tokens"]] == wl.output_lens
        lat = latency_llamacpp(srv, make_workload(2, seed=1, prompt_len=16, output_len=6))
        assert all(0 < x for x in lat.ttft + lat.tpot)
        cmp = compare_logprobs_llamacpp(srv.url, prompts=["The capital of France is", "def fibonacci(n):"], quantization=None,
                                        num_tokens=8, dtype="float32")
    s = cmp["summary"]
    assert s["steps"] >= 2 and s["top1_agreement"] >= 0.75, cmp
    assert s["max_abs_logprob_diff"] < 0.6, cmp   # llama.cpp's Q4_1 kernels round activations to 8 bits (0.36 measured); minivllm's: fp32


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    "The embedded GGUF expanded to F32 by llama.cpp's own `llama-quantize` (beside the server binary), or MINIVLLM_LLAMA_F32_GGUF."
    import subprocess
    from minivllm.core.model_files import embedded_gguf_path
    if os.environ.get("MINIVLLM_LLAMA_F32_GGUF"): return os.environ["MINIVLLM_LLAMA_F32_GGUF"]
    q = Path(REAL).with_name("llama-quantize")
    if not q.exists(): pytest.skip(f"no llama-quantize beside {REAL} and no MINIVLLM_LLAMA_F32_GGUF: no F32 GGUF to compare with")
    out = tmp_path_factory.mktemp("gguf") / "smollm2-f32.gguf"
    subprocess.run([str(q), "--allow-requantize", str(embedded_gguf_path()), str(out), "F32"], check=True, capture_output=True)
    return str(out)


@needs_real
def test_real_llama_server_f32_equals_minivllm_float32(f32_gguf):
    "Same values on both sides (the Q4_1 weights expanded to float32): the same greedy tokens and log-probs within 0.05."
    from minivllm.benchmarks import LlamaServer, compare_logprobs_llamacpp
    with LlamaServer(REAL, f32_gguf) as srv:
        assert srv.name == "llama.cpp F32"
        cmp = compare_logprobs_llamacpp(srv.url, prompts=["The capital of France is", "def fibonacci(n):", "Once upon a time,"],
                                        quantization=None, num_tokens=10, dtype="float32")
    s = cmp["summary"]
    assert s["steps"] == 30 and s["top1_agreement"] == 1.0, cmp    # no greedy choice differs in 3 x 10 steps
    assert s["max_abs_logprob_diff"] < 0.05, cmp                   # 0.012 measured (summation order, fp32)


@needs_real
def test_real_llama_server_against_minivllm_serve(tmp_path, capsys):
    "`bench serve` with --llama-server: one client, the same workloads, both servers complete every request exactly."
    from conftest import running_server
    from minivllm.serve.cli import main
    out = tmp_path / "cmp.json"
    with running_server("--max-model-len", "512") as base:
        assert main(["bench", "serve", "--base-url", base, "--llama-server", REAL, "--num-prompts", "4", "--max-concurrency", "2",
                     "--prompt-len", "8", "40", "--output-len", "4", "12", "--vocab-size", "49152", "--rounds", "2",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["comparison"]) == [base, "llama.cpp Q4_1"] and doc["llama_cpp"]["file_type"] == "Q4_1"
    a, b = (doc["summaries"][k] for k in doc["comparison"])
    assert [s["total_output_tokens"] for s in a] == [s["total_output_tokens"] for s in b]   # ignore_eos on both
    assert all(s["failed"] == 0 and s["completed"] == 4 for s in a + b)
    assert doc["comparison"]["llama.cpp Q4_1"]["decode_speed_vs_base"] == 1.0   # llama.cpp is the base
