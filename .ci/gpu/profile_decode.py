"""One profile of batch-1 decode steps of the compiled (CUDA-graph) engine on the random Llama-3.2-1B-shaped model of
real_size.py: GPU kernel time per step by kernel, against the step's wall time."""
import glob, sys, time, torch
sys.path.insert(0, ".ci/gpu")
from real_size import llama_1b
from minivllm import LLM, SamplingParams, TokensPrompt
path = (glob.glob("/tmp/llama1b-*") or [None])[0]
if path is None or not glob.glob(path + "/*.safetensors"):
    import tempfile; path = tempfile.mkdtemp(prefix="llama1b-"); llama_1b(path, "cuda")
llm = LLM(model=path, device="cuda", max_model_len=4096, max_num_batched_tokens=8192, gpu_memory_utilization=0.85)
p = [TokensPrompt(prompt_token_ids=list(range(1000, 1512)))]
sp = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
llm.generate(p, sp(8), use_tqdm=False)
from torch.profiler import profile, ProfilerActivity
steps = 32
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    torch.cuda.synchronize(); t = time.perf_counter()
    llm.generate(p, sp(steps + 1), use_tqdm=False)
    torch.cuda.synchronize(); wall = time.perf_counter() - t
ka = prof.key_averages()
gpu = [e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA]
tot = sum(e.self_device_time_total for e in gpu) / 1e3
print(f"wall {wall*1e3/steps:.3f} ms/step (incl. the prompt's step), GPU busy {tot/steps:.3f} ms/step")
for e in sorted(gpu, key=lambda e: -e.self_device_time_total)[:14]:
    print(f"{e.self_device_time_total/1e3/steps:8.3f} ms/step {e.count//steps:5d}x  {e.key[:110]}")
cpu = sorted([e for e in ka if e.device_type != torch.autograd.DeviceType.CUDA], key=lambda e: -e.self_cpu_time_total)[:10]
for e in cpu:
    print(f"cpu {e.self_cpu_time_total/1e3/steps:8.3f} ms/step {e.count//steps:5d}x  {e.key[:100]}")
