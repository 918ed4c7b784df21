"""One profile of batch-1 decode steps of the compiled (CUDA-graph) engine on a random Llama-shaped model of
real_size.py: GPU kernel time per step by kernel and kernels launched per step, against the step's wall time.
Usage: python3 .ci/gpu/profile_decode.py MODEL_DIR OUT.json (MODEL_DIR as `real_size.py --build` saves it)."""
import json, sys, time, torch
from minivllm import LLM, SamplingParams, TokensPrompt

path, dest = sys.argv[1], sys.argv[2]
llm = LLM(model=path, device="cuda", max_model_len=4096, max_num_batched_tokens=8192, gpu_memory_utilization=0.85)
p = [TokensPrompt(prompt_token_ids=list(range(1000, 1512)))]
sp = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
llm.generate(p, sp(8), use_tqdm=False)
from torch.profiler import profile, ProfilerActivity

steps = 32
llm.generate(p, sp(2), use_tqdm=False)  # the prompt is cached: the profiled run's first step is one token too
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    torch.cuda.synchronize(); t = time.perf_counter()
    llm.generate(p, sp(steps + 1), use_tqdm=False)
    torch.cuda.synchronize(); wall = time.perf_counter() - t
ka = prof.key_averages()
gpu = [e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA]
busy = sum(e.self_device_time_total for e in gpu) / 1e3 / (steps + 1)
launches = sum(e.count for e in gpu) / (steps + 1)
lines = [f"wall {wall * 1e3 / (steps + 1):.3f} ms/step (profiled), GPU busy {busy:.3f} ms/step, "
         f"{launches:.0f} kernels/step"]
for e in sorted(gpu, key=lambda e: -e.self_device_time_total)[:14]:
    lines.append(f"{e.self_device_time_total / 1e3 / (steps + 1):8.3f} ms/step {e.count / (steps + 1):5.0f}x  {e.key[:110]}")
cpu = sorted([e for e in ka if e.device_type != torch.autograd.DeviceType.CUDA], key=lambda e: -e.self_cpu_time_total)
for e in cpu[:10]:
    lines.append(f"cpu {e.self_cpu_time_total / 1e3 / (steps + 1):8.3f} ms/step {e.count / (steps + 1):5.0f}x  {e.key[:100]}")
print("\n".join(lines))
json.dump(dict(script=".ci/gpu/profile_decode.py", wall_ms=wall * 1e3 / (steps + 1), gpu_busy_ms=busy,
               kernels_per_step=launches, lines=lines), open(dest, "w"), indent=1)
