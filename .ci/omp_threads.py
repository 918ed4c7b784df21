# Run on an idle machine: python .ci/omp_threads.py [ROUNDS]
"""Batch-1 decode time per token of the same LLM on the main thread and on a background thread (as
AsyncLLMEngine runs it), with and without handing back the main thread's OpenMP team first."""
import threading, time, statistics, sys
from minivllm import LLM, SamplingParams
from minivllm.kernels.gemm import release_openmp_threads

llm = LLM(max_model_len=512)
sp = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
prompt = "Tell me about the history of Paris."

def per_token():
    t = time.perf_counter(); llm.generate([prompt], sp, use_tqdm=False)
    return (time.perf_counter() - t) / sp.max_tokens * 1e3

def in_thread(release):
    out = []
    if release: release_openmp_threads()
    th = threading.Thread(target=lambda: out.append(per_token())); th.start(); th.join()
    return out[0]

per_token()  # warm-up
res = {"main": [], "thread": [], "thread+release": []}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    res["main"].append(per_token())
    res["thread"].append(in_thread(False))
    per_token()  # the main thread's team is back
    res["thread+release"].append(in_thread(True))
for k, v in res.items():
    print(f"{k:16s} median {statistics.median(v):6.2f} ms/token  runs {[round(x, 2) for x in v]}")
