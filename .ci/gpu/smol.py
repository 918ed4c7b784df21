"A SmolLM2-135M-shaped Llama with random weights (bf16) and the real tokenizer: the GPU machine cannot receive the real weights."
import shutil, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
out = Path(sys.argv[1]); tok = Path(".gpu/tok")
cfg = AutoConfig.from_pretrained(tok)
torch.manual_seed(0)
m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained(out)
for f in tok.iterdir():
    if f.name != "config.json": shutil.copy(f, out / f.name)
print("saved", out, sum(p.numel() for p in m.parameters()) / 1e6, "M params")
