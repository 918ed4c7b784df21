"""`minivllm bench serve` against a real `minivllm serve` process, and `minivllm bench throughput|latency` on a tiny
checkpoint: the commands run, count exactly the tokens asked for, agree with the server's own counters, and save JSON."""
import json, os, re, socket, subprocess, time
import httpx, pytest
from conftest import running_server

pytestmark = pytest.mark.xdist_group("bench")
KEY = "bench-key"


@pytest.fixture(scope="module")
def server():
    with running_server("--api-key", KEY, "--served-model-name", "smol", "--max-model-len", "256") as base: yield base


def generated_tokens(base) -> float:
    m = re.search(r"^minivllm_generation_tokens_total ([0-9.e+]+)$", httpx.get(base + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_bench_serve(server, tmp_path, capsys):
    from minivllm.serve.cli import main
    from minivllm.benchmarks import make_workload, poisson_arrivals
    before = generated_tokens(server)
    out = tmp_path / "serve.json"
    args = ["bench", "serve", "--base-url", server, "--api-key", KEY, "--num-prompts", "6", "--request-rate", "20",
            "--prompt-len", "8", "48", "--output-len", "4", "12", "--vocab-size", "49152", "--seed", "1", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "time to first token (ms)" in printed and "p99" in printed
    doc = json.loads(out.read_text())
    wl = make_workload(6, 1, (8, 48), (4, 12), 49152)
    s = doc["summary"]
    assert (doc["kind"], doc["model"], s["completed"], s["failed"]) == ("serve", "smol", 6, 0)
    assert [r["output_tokens"] for r in doc["results"]] == wl.output_lens           # ignore_eos: exactly what was asked
    assert [r["prompt_len"] for r in doc["results"]] == list(map(len, wl.prompts))
    assert generated_tokens(server) - before == wl.num_output_tokens                 # the server counted the same
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert 0 < s[k]["p50"] <= s[k]["p90"] <= s[k]["p99"], (k, s[k])
    assert s["ttft_ms"]["p50"] <= s["e2el_ms"]["p50"] and s["output_throughput"] > 0 and doc["machine"]["date"]
    assert all(r["send_time"] >= a - 1e-3 for r, a in zip(doc["results"], poisson_arrivals(6, 20.0, 1)))


def test_bench_serve_against_several_servers(server, tmp_path, capsys):
    "Several --base-url: the same client and a fresh workload each round against each, side by side, saved."
    from minivllm.serve.cli import main
    from minivllm.benchmarks import make_workload
    before, out = generated_tokens(server), tmp_path / "cmp.json"
    urls = [server, server + "/v1"]  # the same server under two names
    assert main(["bench", "serve", "--base-url", *urls, "--api-key", KEY, "--num-prompts", "3", "--max-concurrency", "1",
                 "--prompt-len", "8", "24", "--output-len", "3", "6", "--vocab-size", "49152", "--seed", "5",
                 "--rounds", "2", "--json", str(out)]) == 0
    assert "speed" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    rounds = [make_workload(3, 5 + r, (8, 24), (3, 6), 49152) for r in range(2)]   # seed + round: no prompt repeats
    assert rounds[0].prompts != rounds[1].prompts
    for u in urls:
        assert [s["total_output_tokens"] for s in doc["summaries"][u]] == [wl.num_output_tokens for wl in rounds]
        assert doc["comparison"][u]["failed"] == 0 and doc["comparison"][u]["rounds"] == 2
    assert doc["comparison"][server]["throughput_vs_base"] == 1.0
    assert generated_tokens(server) - before == 2 * sum(wl.num_output_tokens for wl in rounds)


def test_bench_serve_reports_failures_and_too_long_prompts(server, capsys):
    from minivllm.serve.cli import main
    # a wrong key: /v1/models answers 401 before anything is sent
    assert main(["bench", "serve", "--base-url", server, "--api-key", "wrong", "--num-prompts", "2"]) != 0
    # requests that do not fit max_model_len=256: a clear error, nothing sent
    assert main(["bench", "serve", "--base-url", server, "--api-key", KEY, "--num-prompts", "4", "--prompt-len", "200", "250",
                 "--output-len", "100", "100"]) == 2
    assert "max_model_len=256" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from minivllm.core.model import make_tiny_checkpoint
    from minivllm.core.model_files import resolve_model
    d = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint(d, "llama", tokenizer_from=resolve_model(None))
    return str(d)


def test_bench_throughput_and_latency_commands(tiny_dir, tmp_path):
    from minivllm.serve.cli import main
    t, l = tmp_path / "t.json", tmp_path / "l.json"
    assert main(["bench", "throughput", "--model", tiny_dir, "--max-model-len", "128", "--num-prompts", "5", "--prompt-len", "4", "30",
                 "--output-len", "2", "9", "--hf-batch-size", "2", "4", "--json", str(t)]) == 0
    doc = json.loads(t.read_text())
    assert sorted(doc["summary"]) == ["hf-generate b2", "hf-generate b4", "hf-generate_batch", "minivllm"]
    assert len({r["output_tokens"] for r in doc["results"]}) == 1 and all(r["seconds"] > 0 for r in doc["results"])
    assert all("ratio" in v for k, v in doc["summary"].items() if k != "minivllm")
    assert main(["bench", "latency", "--model", tiny_dir, "--max-model-len", "128", "--prompt-len", "16", "--output-len", "4",
                 "--concurrency", "1", "3", "--systems", "minivllm", "hf-generate", "--json", str(l)]) == 0
    lat = json.loads(l.read_text())["results"]
    assert [(r["system"], r["concurrency"], len(r["ttft"])) for r in lat] == [("minivllm", 1, 1), ("hf-generate", 1, 1),
                                                                              ("minivllm", 3, 3), ("hf-generate", 3, 3)]
    assert all(0 < x for r in lat for x in r["ttft"] + r["tpot"])


def test_bench_build_model_tiny(tmp_path, capsys):
    "`bench build-model` on the tiny shape: sharded safetensors that transformers loads, whose log-probs minivllm's LLM matches."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from minivllm import LLM, SamplingParams, TokensPrompt
    from minivllm.serve.cli import main
    d, j = tmp_path / "m", tmp_path / "b.json"
    assert main(["bench", "build-model", "--shape", "tiny", "--out", str(d), "--seed", "3", "--json", str(j)]) == 0
    b = json.loads(j.read_text())["build"]
    assert (b["shape"], b["vocab_size"], b["shards"]) == ("tiny", 49152, 1) and b["gguf"].startswith("not made")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00001.safetensors"} and len(index["weight_map"]) == 20
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings and hf.config.rope_parameters["rope_type"] == "llama3"
    ids = AutoTokenizer.from_pretrained(d)("Random weights, real shapes.").input_ids
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
    llm = LLM(model=str(d), dtype="float32", max_model_len=64)
    (o,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=5, logprobs=5, temperature=0),
                        use_tqdm=False)
    steps = o.prompt_logprobs[1:] + o.outputs[0].logprobs
    assert len(steps) == len(ids)
    for i, dist in enumerate(steps):
        for t, x in dist.items():
            assert abs(x.logprob - float(lp[i, t])) < 1e-4, (i, t, x.logprob, float(lp[i, t]))
    assert o.outputs[0].token_ids[0] == int(lp[-1].argmax())
