"""Write llama GGUF files from an HF checkpoint (tests and measurements; llama.cpp's converter is not here): the
embedded model's tokenizer metadata, the checkpoint's config, its weights in a chosen block type per tensor. The `gguf`
package quantizes Q4_0/Q4_1/Q8_0 but not the K-quants; a K-quant tensor gets random blocks of realistic scales instead
(its weights are then what those blocks de-quantize to, which is what a test compares with)."""
import functools
import numpy as np, torch
import gguf
from minivllm.core.model_files import embedded_gguf_path

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


def _permute_back(w: np.ndarray, n_head: int) -> np.ndarray:
    "HF's q/k row order of rows in llama.cpp's (the inverse of `_permute`)."
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


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


@functools.cache
def _embedded_fields() -> list:
    "The tokenizer and general fields of the embedded model's GGUF file: `(key, value, (type, array type))`."
    fields = []
    for key, f in gguf.GGUFReader(embedded_gguf_path()).fields.items():
        if key.startswith(("GGUF.", "llama.")) or key in ("general.architecture", "general.file_type"):
            continue
        types = [gguf.GGUFValueType(t) for t in f.types]
        fields.append((key, f.contents(), (types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)))
    return fields


MOE_NAMES = {"mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
             "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
             "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
MOE_ARCHS = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama"}  # (llama.cpp: Mixtral is llama)


def write_moe_gguf(path, hf, kind="Q8_0", expert_kind=None, embed_kind="Q8_0", arch=None):
    """Write the HF MoE model `hf` (Qwen2-MoE, Qwen3-MoE, Mixtral) as llama.cpp does: the stacked experts as 3-D
    tensors `ffn_{gate,up,down}_exps` `[E, N, K]`, the router (and the shared expert's gate, 1-D) in float32, the other
    matrices in `kind` and the experts' in `expert_kind` (default `kind`), embedding and LM head in
    `embed_kind`; `arch`: the file's architecture name (default llama.cpp's for the family: Mixtral's is `llama`, its
    q/k rows in llama.cpp's order, no expert size of its own: `feed_forward_length` is each expert's). Returns `{HF
    name: (block type, what the file de-quantizes it to)}` (the `gguf` package's de-quantization), HF's names and
    shapes."""
    c, sd = hf.config, hf.state_dict()
    arch, mixtral = arch or MOE_ARCHS[c.model_type], c.model_type == "mixtral"
    w = gguf.GGUFWriter(str(path), arch)
    for key, value, types in _embedded_fields():
        w.add_key_value(key, value, *types)
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    for add, v in [(w.add_block_count, c.num_hidden_layers), (w.add_context_length, c.max_position_embeddings),
                   (w.add_embedding_length, c.hidden_size), (w.add_feed_forward_length, c.intermediate_size),
                   (w.add_head_count, c.num_attention_heads), (w.add_head_count_kv, c.num_key_value_heads),
                   (w.add_key_length, hd), (w.add_value_length, hd), (w.add_rope_dimension_count, hd),
                   (w.add_layer_norm_rms_eps, c.rms_norm_eps), (w.add_vocab_size, c.vocab_size),
                   (w.add_expert_count, c.num_local_experts if mixtral else c.num_experts),
                   (w.add_expert_used_count, c.num_experts_per_tok)]:
        add(v)
    if not mixtral:   # (Mixtral's experts' features: feed_forward_length)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_rope_freq_base(float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]))
    if getattr(c, "shared_expert_intermediate_size", 0):
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    out = {}

    def put(gname, t, k):   # write `t` (float, [..., K]) as type `k`; return what the file de-quantizes to
        t = t.float().numpy()
        if k == "F32":
            w.add_tensor(gname, t.astype(np.float32))
            return torch.from_numpy(t.astype(np.float32))
        qt = gguf.GGMLQuantizationType[k]
        raw = gguf.quants.quantize(t, qt)
        w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=qt)
        return torch.from_numpy(gguf.quants.dequantize(raw, qt).reshape(t.shape))

    for name, t in sd.items():
        parts = name.removeprefix("model.").split(".")
        if parts[0] != "layers":
            short = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}[parts[0]]
            k = "F32" if t.ndim == 1 else embed_kind
            out[name] = k, put(f"{short}.weight", t, k)
            continue
        b, mid = f"blk.{parts[1]}.", ".".join(parts[2:-1])
        if mid == "mlp.experts":       # HF's stacked experts: gate_up [E, 2I, H] -> gate, up; down [E, H, I]
            k = expert_kind or kind
            if parts[-1] == "gate_up_proj":
                gate, up = t.chunk(2, dim=1)
                halves = [put(b + f"ffn_{x}_exps.weight", h, k) for x, h in (("gate", gate), ("up", up))]
                out[name] = k, torch.cat(halves, 1)
            else:
                out[name] = k, put(b + "ffn_down_exps.weight", t, k)
            continue
        short = MOE_NAMES.get(mid) or NAMES[mid]
        gname = f"{b}{short}.{parts[-1]}"
        if short == "ffn_gate_inp_shexp":   # llama.cpp's shared-expert gate: a vector [H]
            out[name] = "F32", put(gname, t.reshape(-1), "F32").reshape(t.shape)
        else:
            k = "F32" if t.ndim == 1 or short == "ffn_gate_inp" else kind
            if short in ("attn_q", "attn_k") and arch in ("llama", "mistral"):   # llama.cpp's q/k row order
                heads = c.num_attention_heads if short == "attn_q" else c.num_key_value_heads
                p = torch.from_numpy(_permute(t.numpy(), heads))
                out[name] = k, torch.from_numpy(_permute_back(put(gname, p, k).numpy(), heads))
            else:
                out[name] = k, put(gname, t, k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
