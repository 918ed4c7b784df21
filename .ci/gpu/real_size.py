"""A real-size model on the GPU: Llama-3.2-1B's shape (16 layers, hidden 2048, GQA 32:8, vocabulary 128,256, tied
embeddings, llama3 RoPE) or Llama-3.1-8B's (`--shape 8b`: 32 layers, hidden 4096, intermediate 14336, untied) with
random bf16 weights and a word-level tokenizer of the same vocabulary (the real weights cannot travel to the GPU
machine). Measures, each engine in a fresh process:
  ceilings  a device-to-device copy (bytes read + written per second) and an 8192^3 bf16 matmul (FLOP/s);
  decode    time per decode step at batch 1..256 (prompt 512, 64 steps), as bytes read per step (weights once + each
            sequence's KV) per second, against the copy ceiling;
  prefill   one 8 x 1024-token prefill step as FLOP/s against the matmul ceiling;
  nano      nano-vllm's benchmark workload: 256 sequences, input and output lengths uniform in 100..1024, random
            token ids, temperature 0.6, ignore_eos; output tokens per second (nano-vllm's bench.py counts the same).
  host      the engine's own seconds per phase of the timed batch-1 decode steps (no GPU sync per phase: the host's
            time to schedule, prepare, launch, wait for the sampled token and update);
for the eager engine and the CUDA default (torch.compile + CUDA graphs of decode steps).
Usage: python3 .ci/gpu/real_size.py OUT.json [eager,compiled] [--shape 1b|8b] [--model DIR] [--batches 1,8,...]
[--no-nano] (on a CPU, `--cpu` runs a 2-layer toy of the same script end to end, to check it before a lease);
`--build DIR` only saves the model (to build it while something else runs; BUILD_ON=cuda builds it on the GPU);
GC_FREEZE=0 runs the engine without its frozen heap; each decode row records the collections during its steps."""
import json, os, subprocess, sys, tempfile, time

ONE = r'''
import json, random, sys, time, torch
from minivllm import LLM, SamplingParams, TokensPrompt
path, mode, dev, batches, nano = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
small = dev == "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
kw = dict(enforce_eager=True) if mode == "eager" else {}
t = time.perf_counter()
llm = LLM(model=path, device=dev, max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=256,
          gpu_memory_utilization=0.85, seed=0, **kw)
out = dict(mode=mode, startup_s=time.perf_counter() - t,
           runner=type(llm.llm_engine.engine_core.model_runner).__name__)
print("started", out, flush=True)
rng = random.Random(0)
def ids(n):
    return [rng.randrange(100, 120000 if not small else 1000) for _ in range(n)]
def run(prompts, n, temp=0.0):
    sp = SamplingParams(temperature=temp, max_tokens=n, ignore_eos=True)
    sync(); t = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    sync(); return time.perf_counter() - t
run([ids(16)], 4)  # warm-up
import contextlib, gc, os
if os.environ.get("GC_FREEZE") == "0":            # without the engine's frozen heap (lesson 13's frozen_heap)
    import minivllm.core.llm as _llm; _llm.frozen_heap = contextlib.nullcontext
gcs = {}                                          # collections by generation: [count, seconds]
def on_gc(phase, info, t0=[0.0]):
    if phase == "start": t0[0] = time.perf_counter(); return
    c = gcs.setdefault(info["generation"], [0, 0.0]); c[0] += 1; c[1] += time.perf_counter() - t0[0]
gc.callbacks.append(on_gc)
core = llm.llm_engine.engine_core
phases = []                                       # the host's seconds per phase of each step (no GPU sync)
def timed_step(step=core.step):
    o = step(); phases.append(o.step_info.timings); return o
core.step = timed_step
plen, steps = (512, 64) if not small else (64, 8)
out["decode"] = []
for b in ([int(x) for x in batches.split(",")] if not small else (1, 4)):
    ps = [ids(plen) for _ in range(b)]
    run(ps, 2)                                   # caches the prompts: both timed runs below hit the prefix cache
    phases.clear(); gcs.clear(); t_all = run(ps, steps + 1)
    gc_steps = {g: [c, t / steps * 1e3] for g, (c, t) in gcs.items()}  # collections and their ms a step
    dec = phases[1:]                             # the decode steps (the first step is the prompts' last token)
    t_one = run(ps, 1)
    out["decode"].append(dict(batch=b, context=plen + steps // 2, step_ms=(t_all - t_one) / steps * 1e3,
                              host_ms={k: sum(p.get(k, 0) for p in dec) / len(dec) * 1e3 for k in dec[0]},
                              gc=gc_steps))
    print("decode", out["decode"][-1], flush=True)
core.step = timed_step.__defaults__[0]
seqs, plen = (8, 1024) if not small else (2, 128)
run([ids(plen) for _ in range(seqs)], 1)         # warm-up of the prefill shapes
pre = [run([ids(plen) for _ in range(seqs)], 1) for _ in range(3)]
out["prefill"] = dict(seqs=seqs, prompt_len=plen, step_s=sorted(pre)[1])
print("prefill", out["prefill"], flush=True)
if not nano:
    print("RESULT " + json.dumps(out), flush=True); sys.exit(0)
n, lo, hi = (256, 100, 1024) if not small else (8, 10, 40)
prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(0, 10000 if not small else 1000) for _ in range(rng.randint(lo, hi))])
           for _ in range(n)]
sps = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rng.randint(lo, hi)) for _ in range(n)]
llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)
sync(); t = time.perf_counter()
res = llm.generate(prompts, sps, use_tqdm=False)
sync(); dt = time.perf_counter() - t
toks = sum(len(r.outputs[0].token_ids) for r in res)
assert toks == sum(s.max_tokens for s in sps), (toks, sum(s.max_tokens for s in sps))
out["nano"] = dict(seqs=n, output_tokens=toks, prompt_tokens=sum(len(p["prompt_token_ids"]) for p in prompts),
                   seconds=dt, output_tok_s=toks / dt)
print("nano", out["nano"], flush=True)
print("RESULT " + json.dumps(out), flush=True)
'''


SHAPES = {  # Llama-3.2-1B and Llama-3.1-8B (their config.json), and the 2-layer toy of `--cpu`
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "toy": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}


def llama_1b(path, dev, shape="1b"):
    "Save a random Llama-shaped bf16 checkpoint (`SHAPES[shape]`) and a word-level tokenizer of its vocabulary."
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    sh = SHAPES["toy" if dev == "cpu" else shape]
    build = "cuda" if os.environ.get("BUILD_ON") == "cuda" else "cpu"
    V = sh["vocab_size"]
    cfg = LlamaConfig(
        **sh, max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        rope_scaling=dict(rope_type="llama3", factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                          original_max_position_embeddings=8192),
        rope_theta=500000.0, torch_dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)            # built in bf16 on the host: 16 GB at 8B, no GPU memory
    with torch.device(build):
        m = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    m.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(V)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(path)
    c = m.config
    n_params = sum(p.numel() for p in m.parameters())  # tied: the embedding once (it is also the LM head)
    del m
    info = dict(params=n_params, hidden=c.hidden_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads, head_dim=c.head_dim, vocab=V, intermediate=c.intermediate_size,
                tied=c.tie_word_embeddings)
    json.dump(info, open(os.path.join(path, "shape.json"), "w"))
    return info


def ceilings():
    import torch
    a = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    a.random_()
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): b.copy_(a)
    torch.cuda.synchronize(); copy = 2 * a.numel() * 10 / (time.perf_counter() - t)
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); y = torch.randn_like(x)
    for _ in range(3): x @ y
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): x @ y
    torch.cuda.synchronize(); mm = 2 * 8192**3 * 10 / (time.perf_counter() - t)
    return dict(copy_GBps=copy / 1e9, bf16_matmul_TFLOPs=mm / 1e12, device=torch.cuda.get_device_name(),
                torch=torch.__version__)


def derive(r, shape, ceil):
    "Bytes per decode step and prefill FLOPs from the model's shape, as fractions of the ceilings."
    D, L, H, KV, hd, V = (shape[k] for k in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"))
    untied = not shape.get("tied", True)               # an untied embedding is read one row a token: not counted
    weight_bytes = 2 * (shape["params"] - untied * V * D)   # bf16; a tied embedding is read whole as the LM head
    for d in r.get("decode", []):
        kv_bytes = d["batch"] * d["context"] * L * 2 * KV * hd * 2
        d["GB_per_step"] = (weight_bytes + kv_bytes) / 1e9
        d["GBps"] = d["GB_per_step"] / (d["step_ms"] / 1e3)
        d["frac_of_copy"] = d["GBps"] / ceil["copy_GBps"] if ceil else None
    if "prefill" in r:
        p = r["prefill"]; T, S = p["prompt_len"], p["seqs"]
        body = shape["params"] - (1 + untied) * V * D  # every weight but the embedding (and LM head), every token
        flops = 2 * body * T * S + 2 * V * D * S + S * L * 2 * H * hd * T * T   # + LM head on the last tokens + causal attention
        p["TFLOP"] = flops / 1e12
        p["TFLOPs"] = flops / p["step_s"] / 1e12
        p["frac_of_matmul"] = p["TFLOPs"] / ceil["bf16_matmul_TFLOPs"] if ceil else None
    return r


def opt(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    cpu, shape = "--cpu" in sys.argv, opt("--shape", "1b")
    dev = "cpu" if cpu else "cuda"
    if "--build" in sys.argv:
        path = opt("--build", None); os.makedirs(path, exist_ok=True)
        t = time.perf_counter(); print("model", llama_1b(path, dev, shape), round(time.perf_counter() - t, 1), "s")
        return
    dest = sys.argv[1]
    modes = (sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else "eager,compiled").split(",")
    batches = opt("--batches", "1,8,32,128,256")
    res = dict(date=time.strftime("%Y-%m-%d"), ceilings=None if cpu else ceilings())
    print("ceilings", res["ceilings"], flush=True)
    path = opt("--model", None)
    if path and os.path.exists(os.path.join(path, "shape.json")):
        res["shape"] = json.load(open(os.path.join(path, "shape.json")))
    else:
        path = path or tempfile.mkdtemp(prefix=f"llama{shape}-"); os.makedirs(path, exist_ok=True)
        t = time.perf_counter(); res["shape"] = llama_1b(path, dev, shape)
        print("model", res["shape"], round(time.perf_counter() - t, 1), "s", flush=True)
    budget = dict(eager=170, compiled=230) if not cpu else dict(eager=600, compiled=900)
    budget = {k: int(opt("--budget", v)) for k, v in budget.items()}
    for mode in modes:
        try:
            p = subprocess.run([sys.executable, "-c", ONE, path, mode, dev, batches,
                                "0" if "--no-nano" in sys.argv else "1"], capture_output=True, text=True,
                               timeout=budget[mode])
            lines = p.stdout.splitlines()
            got = [json.loads(l[7:]) for l in lines if l.startswith("RESULT ")]
            if got:
                res[mode] = derive(got[0], res["shape"], res["ceilings"])
            else:
                res[mode] = dict(error=p.stderr[-2500:], partial=lines[-8:])
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            res[mode] = dict(error=f"timed out after {budget[mode]} s", partial=out.splitlines()[-8:])
        print(mode, json.dumps(res[mode])[:3000], flush=True)
        json.dump(res, open(dest, "w"), indent=1)
    for mode in modes:
        r = res.get(mode, {})
        for d in r.get("decode", []):
            print(f"{mode:9s} decode b={d['batch']:3d} {d['step_ms']:7.2f} ms/step {d['GBps']:7.0f} GB/s "
                  f"({(d['frac_of_copy'] or 0):.0%} of copy) host " +
                  " ".join(f"{k} {v:.3f}" for k, v in d.get("host_ms", {}).items()) + f" gc {d.get('gc')}")
        if "prefill" in r:
            p = r["prefill"]; print(f"{mode:9s} prefill {p['TFLOPs']:.0f} TFLOP/s ({(p['frac_of_matmul'] or 0):.0%} of matmul)")
        if "nano" in r:
            print(f"{mode:9s} nano-vllm workload {r['nano']['output_tok_s']:.0f} output tok/s in {r['nano']['seconds']:.1f} s")


if __name__ == "__main__":
    main()
