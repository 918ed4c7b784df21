"""Resident memory after load (lessons 04b, 05a): a model holds its weights once, in the one layout its kernels read,
plus the KV cache it allocated and a small constant: its anonymous resident memory (`RssAnon`: what the process
itself holds; the pages of torch's and Triton's libraries are file-backed, shared, and differ between CPUs)
<= 1.2 x the file's size + the KV cache + 0.5 GB, measured in a fresh process (`LLM(model=...)`), on a float checkpoint of real proportions (a Llama with
SmolLM2's vocabulary, 1024 wide: 0.34 GB in bfloat16) and on the embedded GGUF's 4-bit blocks. A second copy of the
weights (a float copy beside the GGUF's blocks, or an fp32 copy of a bf16 checkpoint) breaks the bound."""
import json, os, subprocess, sys
import pytest, torch
from minivllm.core.model_files import embedded_gguf_path, resolve_model
from minivllm.kernels.quantization import blocks_supported

pytestmark = pytest.mark.xdist_group("memory")  # one worker builds its module fixtures (engines, checkpoints) once

CHILD = r"""
import json, sys
from minivllm import LLM
llm = LLM(**json.loads(sys.argv[1]))
kv = sum(c.numel() * c.element_size() for c in llm.llm_engine.engine_core.model_runner.kv_caches)
out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], use_tqdm=False)[0].outputs[0].token_ids   # it runs
with open("/proc/self/status") as f:
    anon = next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))
print("RESULT", json.dumps(dict(rss=anon, kv=kv, tokens=len(out))))
"""


def resident(**args) -> dict:
    "`{rss, kv}` bytes (anonymous resident, KV cache) of a fresh process after `LLM(**args)` and one request."
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert res["tokens"] > 0
    return res


def bound(file_bytes: int, kv: int) -> float:
    return 1.2 * file_bytes + kv + 0.5e9


@pytest.fixture(scope="module")
def real_shape_checkpoint(tmp_path_factory):
    "A random-weight Llama of real proportions (Llama-3.2-1B's, 1024 wide, 8 layers), bfloat16, SmolLM2's tokenizer."
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    d = tmp_path_factory.mktemp("real_shape")
    tok = AutoTokenizer.from_pretrained(resolve_model(None))
    c = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
                    num_key_value_heads=4, head_dim=64, tie_word_embeddings=True, vocab_size=len(tok),
                    max_position_embeddings=2048, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(c).to(torch.bfloat16).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_float_checkpoint_holds_its_weights_once(real_shape_checkpoint):
    size = sum(f.stat().st_size for f in real_shape_checkpoint.glob("*.safetensors"))
    r = resident(model=str(real_shape_checkpoint), dtype="bfloat16", kv_cache_memory_bytes=64 << 20,
                 max_model_len=512)
    assert r["rss"] <= bound(size, r["kv"]), (r, size)


def test_gguf_holds_its_blocks_once():
    size = embedded_gguf_path().stat().st_size
    r = resident(quantization="gguf", dtype="bfloat16", kv_cache_memory_bytes=64 << 20, max_model_len=512)
    assert r["rss"] <= bound(size, r["kv"]), (r, size)


@pytest.mark.skipif(not blocks_supported("cpu", torch.bfloat16),
                    reason="the GGUF blocks run as blocks only where qgemm.c runs (AVX-512): elsewhere the layers hold "
                           "repacked int4 weights, not the file's blocks")
def test_serve_says_what_it_holds():
    "`minivllm serve` prints, at start-up, its weights, its KV cache and the resident memory (now and at its peak)."
    from conftest import free_port
    cmd = ["minivllm", "serve", "--port", str(free_port()), "--quantization", "gguf", "--dtype", "bfloat16",
           "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 << 20)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"HF_HUB_OFFLINE": "1"})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("minivllm: holding"):
                break
        held = dict(kv.rsplit(" ", 2)[:2] for kv in lines[-1].removeprefix("minivllm: holding ").split(", "))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert set(held) == {"weights", "kv_cache", "resident", "peak"}, lines[-5:]
    size = embedded_gguf_path().stat().st_size / 2**30
    assert 0.9 * size < float(held["weights"]) < 1.2 * size          # the file's blocks, once
    assert abs(float(held["kv_cache"]) - 64 / 1024) < 0.01
    assert float(held["weights"]) + float(held["kv_cache"]) < float(held["resident"]) <= float(held["peak"])
