"""Write llama GGUF files from an HF checkpoint (tests and measurements; llama.cpp's converter is not here): the
embedded model's tokenizer metadata, the checkpoint's config, its weights in a chosen block type per tensor. The `gguf`
package quantizes Q4_0/Q4_1/Q8_0 but not the K-quants; a K-quant tensor gets random blocks of realistic scales instead
(its weights are then what those blocks de-quantize to, which is what a test compares with)."""
import numpy as np, torch
import gguf
from minivllm.core.config import embedded_gguf_path

NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
# llama.cpp's mixes (attn_v and ffn_down: its Q4_K_M gives half the layers Q6_K; here the even layers)
MIXES = {
    "Q4_0": lambda name, i: "Q8_0" if name in ("token_embd", "output") else "Q4_0",
    "Q4_K_M": lambda name, i: ("Q6_K" if name in ("token_embd", "output") or (name in ("attn_v", "ffn_down") and i % 2 == 0)
                               else "Q4_K"),
    "Q5_K_M": lambda name, i: ("Q6_K" if name in ("token_embd", "output") or (name in ("attn_v", "ffn_down") and i % 2 == 0)
                               else "Q5_K"),
    "Q6_K": lambda name, i: "Q6_K",
}


def random_k_blocks(kind: str, n: int, k: int, scale: float, rng) -> np.ndarray:
    "Random GGUF rows `[n, bytes]` of a K-quant type: random codes and packed scales, float16 `d` (and `dmin`) ~ `scale`."
    qt = gguf.GGMLQuantizationType[kind]
    per, nbytes = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(n, k // per, nbytes), dtype=np.uint8)
    half = lambda: (rng.random((n, k // per, 1)) * scale).astype(np.float16).view(np.uint8)
    if kind == "Q6_K":
        b[..., 208:210] = half()
    else:
        b[..., 0:2], b[..., 2:4] = half(), half()
    return b.reshape(n, -1)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    "llama.cpp's converter's q/k row order (what minivllm's `unpermute_rows` undoes)."
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path, hf_dir, mix: str = "Q4_0", seed: int = 0, k_scale: float = 2e-4):
    "Write the checkpoint `hf_dir` (llama, mistral, qwen2, qwen3) as a GGUF file of the block types of `MIXES[mix]`."
    from safetensors import safe_open
    from transformers import AutoConfig
    c = AutoConfig.from_pretrained(hf_dir)
    rng = np.random.default_rng(seed)
    src = gguf.GGUFReader(embedded_gguf_path())
    arch = c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    for key, f in src.fields.items():  # the tokenizer and the general fields of the embedded model
        if key.startswith(("GGUF.", "llama.")) or key in ("general.architecture", "general.file_type"):
            continue
        types = [gguf.GGUFValueType(t) for t in f.types]
        w.add_key_value(key, f.contents(), types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    pick = MIXES[mix]
    with safe_open(f"{hf_dir}/model.safetensors", "pt") as f:
        for name in f.keys():
            parts = name.removeprefix("model.").split(".")
            if parts[0] == "layers":
                i, short = int(parts[1]), NAMES[".".join(parts[2:-1])]
                gname = f"blk.{i}.{short}.{parts[-1]}"
            else:
                i, short = -1, {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}[parts[0]]
                gname = f"{short}.weight"
            t = f.get_tensor(name).float().numpy()
            if t.ndim == 1:
                w.add_tensor(gname, t.astype(np.float32))
                continue
            if short in ("attn_q", "attn_k") and arch in ("llama", "mistral"):
                t = _permute(t, c.num_attention_heads if short == "attn_q" else c.num_key_value_heads)
            kind = pick(short, i)
            qt = gguf.GGMLQuantizationType[kind]
            if kind.endswith("_K"):
                raw = random_k_blocks(kind, t.shape[0], t.shape[1], k_scale, rng)
            else:
                raw = gguf.quants.quantize(t, qt)
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
