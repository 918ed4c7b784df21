"Run the GPU benchmark cells of nbs/04_paged_attention.ipynb for real; print the tables and save them as JSON."
import json, sys, torch, torch.nn.functional as F
from minivllm.core.attention import *
from minivllm.core.attention import _decode_config, _launch_decode, _launch_prefill, _causal_mask
nb = json.load(open("nbs/04_paged_attention.ipynb"))
cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("#| gpu")
         and 'device="cpu"' not in "".join(c["source"])]
g = dict(globals())
for src in cells[:-1]: exec(src, g)
bw = g["device_copy_bandwidth"]()
print(f"device copy bandwidth: {bw:.0f} GB/s", flush=True)
dec = [g["bench_decode_kernel"](batch=b, context_len=n, dtype=dt, block_size=bs, copy_bw=bw)
       for dt in (torch.float16, torch.bfloat16) for bs in (16, 32) for b, n in [(1, 8192), (8, 4096), (32, 2048), (64, 4096), (256, 1024)]]
exec(cells[-1].split("if torch.cuda.is_available()")[0], g)
g["show"](dec)
pre = [g["bench_prefill_kernel"](batch=b, query_len=ql, context_len=c, dtype=dt)
       for dt in (torch.float16, torch.bfloat16) for b, ql, c in [(8, 1024, 0), (2, 4096, 0), (4, 1024, 3072), (1, 8192, 0)]]
g["show"](pre)
json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_bandwidth_gbs=bw, decode=dec, prefill=pre),
          open(sys.argv[1], "w"), indent=1)
