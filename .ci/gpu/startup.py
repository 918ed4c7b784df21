"Start-up on the GPU: eager vs compiled (cold and warm Inductor cache), each in a fresh process; first request; decode steps."
import json, subprocess, sys, tempfile
MEASURE = r'''
import json, sys, time, torch
from minivllm import LLM, SamplingParams, TokensPrompt
kw = dict(enforce_eager=True) if sys.argv[1] == "eager" else dict(compilation_config={"level": 3, "cache_dir": sys.argv[2]})
t = time.perf_counter(); llm = LLM(model="/tmp/smol", max_model_len=1024, **kw); startup = time.perf_counter() - t
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
t = time.perf_counter(); llm.generate(TokensPrompt(prompt_token_ids=list(range(1000, 1128))), SamplingParams(max_tokens=8), use_tqdm=False); first = time.perf_counter() - t
r = llm.llm_engine.engine_core.model_runner
out = dict(startup_s=startup, first_request_s=first, runner=type(r).__name__, graphs=len(getattr(r, "graphs", {})),
           compile_s=getattr(getattr(r, "cc", None), "compile_time", None))
for b in (1, 8, 32, 128):
    ps = [TokensPrompt(prompt_token_ids=list(range(1000 + i, 1128 + i))) for i in range(b)]
    llm.generate(ps, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    torch.cuda.synchronize(); t = time.perf_counter()
    llm.generate(ps, SamplingParams(temperature=0, max_tokens=129, ignore_eos=True), use_tqdm=False)
    t1 = time.perf_counter()
    llm.generate(ps, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    t2 = time.perf_counter()
    out[f"b{b}_decode_ms"] = ((t1 - t) - (t2 - t1)) / 128 * 1e3   # per decode step: (prefill + 128 steps) - prefill
print(json.dumps(out))
'''
res, cache = {}, tempfile.mkdtemp()
for name, args in [("eager", ["eager", cache]), ("compiled_cold", ["compiled", cache]), ("compiled_warm", ["compiled", cache])]:
    p = subprocess.run([sys.executable, "-c", MEASURE, *args], capture_output=True, text=True)
    if p.returncode: print(p.stderr[-3000:]); continue
    res[name] = json.loads(p.stdout.strip().splitlines()[-1]); print(name, res[name], flush=True)
import torch
res["note"] = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, random SmolLM2-135M-shaped weights, bf16"
json.dump(res, open(sys.argv[1], "w"), indent=1)
