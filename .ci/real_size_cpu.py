"""Server against server at real sizes on a CPU (issue #46): `minivllm serve` and llama.cpp's `llama-server` on
random-weight models of real shapes (built by `minivllm bench build-model`, lesson 16), one precision at a time:
start-up (spawn to /health 200), memory after load (RssAnon: what the process holds itself; RssFile: mapped file
pages, which is how llama.cpp holds its weights), batch-1 TTFT and time per output token, and a mixed workload.
Both servers get the same KV room (`CTX` tokens: llama.cpp `-c CTX`, minivllm `--kv-cache-memory-bytes` of CTX
tokens) and the same threads. One round per table, the servers alternating; the machine should be otherwise idle.

Usage: python3 .ci/real_size_cpu.py OUT.json --llama-cpp DIR [--work /tmp/real] [--runs llama-3.2-1b:bf16,...]
A run is SHAPE:PRECISION, PRECISION one of bf16 (minivllm: the HF checkpoint in bfloat16; llama.cpp: its BF16 GGUF)
or a llama.cpp type (Q4_K_M ...: both serve that GGUF). `--b1-only SHAPE` skips the mixed workload for that shape.
"""
import argparse, asyncio, json, os, subprocess, sys, time
from pathlib import Path

CTX = 8192


def status_kb(pid: int) -> dict:
    "RssAnon, RssFile and VmHWM (peak resident) of process `pid`, in bytes."
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
            out[k] = int(v.split()[0]) * 1024
    return out


def wait_healthy(url: str, proc, timeout: float = 1800) -> float:
    import httpx

    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return time.perf_counter() - t
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def kv_bytes_per_token(cfg: dict) -> int:
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 2  # K and V, bf16


def start_minivllm(model_dir: Path, precision: str, port: int, log):
    cfg = json.loads((model_dir / "config.json").read_text())
    args = ["minivllm", "serve", "--port", str(port), "--max-model-len", "2048", "--max-num-seqs", "32",
            "--kv-cache-memory-bytes", str(CTX * kv_bytes_per_token(cfg)), "--dtype", "bfloat16"]
    if precision == "bf16":
        args += ["--model", str(model_dir)]
    else:
        args += ["--model", str(model_dir / f"m-{precision}.gguf"), "--tokenizer", str(model_dir),
                 "--quantization", "gguf"]
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env), args


def start_llama(llama_cpp: Path, model_dir: Path, precision: str, port: int, n_parallel: int, log):
    from minivllm.benchmarks import llama_server_args

    gguf = model_dir / ("m-bf16.gguf" if precision == "bf16" else f"m-{precision}.gguf")
    args = llama_server_args(llama_cpp / "build/bin/llama-server", gguf, port, n_parallel, CTX // n_parallel)
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), args


def workloads(tokenizer_dir: Path, mixed_n: int):
    from transformers import AutoTokenizer
    from minivllm.benchmarks import Workload
    import random

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(100, len(tok) - 100) for _ in range(n)]
    b1 = Workload([ids(128) for _ in range(3)], [64] * 3)
    mixed = Workload([ids(rng.randint(16, 256)) for _ in range(mixed_n)],
                     [rng.randint(16, 128) for _ in range(mixed_n)])
    return b1, mixed


def one_server(kind, start, model_dir, wls, out_log):
    from minivllm.benchmarks import Workload, _free_port, _terminate, bench_serve

    port = _free_port()
    t0 = time.perf_counter()
    proc, args = start(port)
    url = f"http://127.0.0.1:{port}"
    try:
        startup = wait_healthy(url, proc)
        mem = status_kb(proc.pid)
        row = dict(server=kind, args=args, startup_s=startup, memory_after_load=mem,
                   load_avg_before=os.getloadavg())
        extra = dict(cache_prompt=False) if kind == "llama.cpp" else None  # no reuse of a prefill
        warm = Workload([wls["batch1"][0].prompts[0][:16]], [4])
        asyncio.run(bench_serve(url, warm, max_concurrency=1, timeout=3600, extra_body=extra))
        for name, (wl, conc) in wls.items():
            res = asyncio.run(bench_serve(url, wl, max_concurrency=conc, timeout=3600, extra_body=extra))
            s = res["summary"]
            row[name] = dict(output_throughput=s["output_throughput"], ttft_ms=s["ttft_ms"]["mean"],
                             tpot_ms=s["tpot_ms"]["mean"], failed=s["failed"], duration_s=s["duration_s"])
            print(kind, name, row[name], flush=True)
        row["memory_after_runs"] = status_kb(proc.pid)
        row["load_avg_after"] = os.getloadavg()
        return row
    finally:
        _terminate(proc)
        print(f"{kind}: {time.perf_counter() - t0:.0f} s in all", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--work", default="/tmp/real", type=Path)
    ap.add_argument("--runs", default="llama-3.2-1b:bf16,llama-3.2-1b:Q4_K_M,llama-3.2-3b:Q4_K_M,llama-3.1-8b:Q4_K_M")
    ap.add_argument("--mixed", type=int, default=16, help="requests in the mixed workload")
    ap.add_argument("--b1-only", default="llama-3.1-8b", help="shapes that run batch 1 only (comma-separated)")
    a = ap.parse_args()
    from minivllm.benchmarks import machine_info

    out = dict(kind="real_size_serve_cpu", machine=machine_info(), ctx_tokens=CTX, runs=[],
               command=" ".join(sys.argv))
    b1_only = set(a.b1_only.split(",")) if a.b1_only else set()
    for run in a.runs.split(","):
        shape, precision = run.split(":")
        model_dir = a.work / shape
        b1, mixed = workloads(model_dir, a.mixed)
        wls = {"batch1": (b1, 1)} | ({} if shape in b1_only else {"mixed": (mixed, None)})
        sizes = {p.name: p.stat().st_size for p in model_dir.iterdir() if p.suffix in (".gguf", ".safetensors")}
        entry = dict(shape=shape, precision=precision, files=sizes, servers=[])
        log = open(a.work / f"{shape}-{precision}.log", "w")
        n_par = 1 if shape in b1_only else a.mixed
        for kind, start in [
            ("minivllm", lambda port: start_minivllm(model_dir, precision, port, log)),
            ("llama.cpp", lambda port: start_llama(a.llama_cpp, model_dir, precision, port, n_par, log)),
        ]:
            try:
                entry["servers"].append(one_server(kind, start, model_dir, wls, log))
            except Exception as e:
                entry["servers"].append(dict(server=kind, error=f"{type(e).__name__}: {e}"))
                print(kind, "failed:", e, flush=True)
        out["runs"].append(entry)
        Path(a.out).write_text(json.dumps(out, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
