"""Quantized GGUF weights (lesson 04b): the repacked int4/int8 kernels hold exactly the reference de-quantization, the C
kernel on GGUF's blocks (`qgemm.c`) multiplies by exactly those weights, and the engine with `quantization="gguf"`
generates what a dense model with the same (de-quantized) weights generates."""
import numpy as np, pytest, torch
import gguf
from torch import nn
from minivllm.kernels.quantization import (BlockLinear, Int4Linear, Int8Linear, block_gemm, blocks_supported, dequantize,
                                   int4_affine, int4_reference, read_gguf, split_blocks, gguf_linear, tiled_gemm,
                                   prompt_logprob_stats, logprob_agreement as agreement)
from minivllm.core.arg_utils import EngineArgs
from minivllm.core.model_files import embedded_gguf_path
from minivllm.kernels.model_kernels import Linear

pytestmark = pytest.mark.xdist_group("quantization")  # one worker builds its module fixtures (engines, checkpoints) once


def held_weight(m: nn.Module) -> torch.Tensor:
    "The weights a weight-only kernel multiplies by: `I @ W.T`, transposed."
    return m(torch.eye(m.in_features, dtype=torch.bfloat16)).T


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_int4_repack_is_exact(kind):
    w = np.random.default_rng(1).standard_normal((96, 128)).astype(np.float32) * np.linspace(0.05, 3, 96)[:, None]
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind]))
    q, d, m = split_blocks(raw, kind)
    llama = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[kind]))
    assert torch.equal(dequantize(q, d, m, kind), llama)                       # our reference == llama.cpp's
    lin = Int4Linear(*int4_affine(q, d, m, kind))
    assert torch.equal(held_weight(lin), int4_reference(*int4_affine(q, d, m, kind)))   # the kernel == the reference, bit for bit
    assert (held_weight(lin).float() - llama).abs().max() <= 2 ** -7 * llama.abs().max()   # bf16 scales only


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_hybrid_int4_both_paths_match_reference(kind):
    "A hybrid 4-bit layer: the int4 kernel up to `max_int4_rows` rows, the dense copy above; both = the reference matmul."
    w = np.random.default_rng(3).standard_normal((96, 128)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind]))
    q, d, m = split_blocks(raw, kind)
    ref = int4_reference(*int4_affine(q, d, m, kind)).float()
    lin = Int4Linear(*int4_affine(q, d, m, kind), max_int4_rows=4)
    assert lin.dense is not None and lin.dense.numel() == 96 * 128
    g = torch.Generator().manual_seed(0)
    outs = {}
    for rows in (1, 4, 5, 40):
        x = torch.randn(rows, 128, generator=g).bfloat16()
        exp = x.float() @ ref.T
        outs[rows] = y = lin(x).float()
        assert (y - exp).abs().max() <= 2 ** -7 * exp.abs().max(), rows   # one bf16 rounding of the output
    x = torch.randn(4, 128, generator=g).bfloat16()
    by_int4 = lin(x); lin.max_int4_rows = 0; by_dense = lin(x)           # the same rows through both paths
    assert (by_int4.float() - by_dense.float()).abs().max() <= 2 ** -7 * by_dense.float().abs().max()
    assert Int4Linear(*int4_affine(q, d, m, kind)).dense is None        # without max_int4_rows: int4 only


def test_q8_0_int8_rows():
    w = np.random.default_rng(2).standard_normal((64, 96)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
    ref = dequantize(*split_blocks(raw, "Q8_0"), "Q8_0")
    lin = Int8Linear(ref)
    held = held_weight(lin).float()
    assert torch.equal(held, (lin.weight.float() * lin.scales.float()[:, None]).bfloat16().float())
    step = ref.abs().amax(1, keepdim=True) / 127
    assert ((held - ref).abs() <= 1.5 * step).all()
    hyb = Int8Linear(ref, max_int8_rows=4)                              # hybrid: the dense copy above 4 rows
    assert hyb.dense is not None and lin.dense is None
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(0)).bfloat16()
    exp = x.float() @ held.T                                             # the reference matmul of the held weights
    for rows in (1, 4, 5, 40):
        assert (hyb(x[:rows]).float() - exp[:rows]).abs().max() <= 2 ** -7 * exp.abs().max(), rows


needs_blocks = pytest.mark.skipif(not blocks_supported("cpu", torch.float32),
                                  reason="qgemm.c needs a CPU with AVX-512 (this one has none)")


def test_gguf_linear_picks_the_block_kernel_where_it_runs():
    w = np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1))
    for dtype in (torch.float32, torch.bfloat16):
        lin = gguf_linear(raw, "Q4_1", dtype)
        assert isinstance(lin, BlockLinear if blocks_supported("cpu", dtype) else Int4Linear), dtype


@needs_blocks
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_kernel_is_the_reference_product(kind):
    """qgemm.c multiplies by exactly the de-quantized weights (float32 sums: within float32 rounding of the float64
    product), at every row count, with a row's result independent of the others (bit for bit), in both dtypes, with a
    bias; the hybrid layer's dense copy gives the same product."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((72, 160)).astype(np.float32) * np.linspace(0.05, 3, 72)[:, None]
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind]))
    q, d, m = split_blocks(raw, kind)
    ref = dequantize(q, d, m, kind).double()
    blocks, bk = raw, kind                                                 # the file's bytes as they are
    x = torch.randn(21, 160, generator=torch.Generator().manual_seed(1))
    y = block_gemm(x, blocks, bk)
    exp = x.double() @ ref.T
    assert (y.double() - exp).abs().max() <= 1e-5 * exp.abs().max()
    for rows in (1, 3, 4, 5, 9, 17):
        assert torch.equal(block_gemm(x[:rows], blocks, bk), y[:rows]), rows
        assert torch.equal(block_gemm(x[rows:rows + 1], blocks, bk), y[rows:rows + 1]), rows
    bias = torch.randn(72)
    assert torch.allclose(block_gemm(x, blocks, bk, bias), y + bias, atol=1e-5 * exp.abs().max().item())
    xb = x.bfloat16()
    yb = block_gemm(xb, blocks, bk)
    assert yb.dtype == torch.bfloat16
    expb = xb.double() @ ref.T
    assert (yb.double() - expb).abs().max() <= 2 ** -7 * expb.abs().max()
    lin = BlockLinear(raw, kind, max_rows=4)                             # hybrid: dense tiles above 4 rows
    assert lin.blocks.data_ptr() == raw.data_ptr()                       # the blocks themselves: no copy, no dense copy
    assert [n for n, _ in lin.named_buffers()] == ["blocks"]
    for rows in (1, 4, 5, 21):
        assert (lin(x[:rows]).double() - exp[:rows]).abs().max() <= 1e-5 * exp.abs().max(), rows
    assert (tiled_gemm(x, raw, kind, tile=16).double() - exp).abs().max() <= 1e-5 * exp.abs().max()


@needs_blocks
def test_block_gemm_refuses_bad_arguments():
    kind, blocks = "Q4_1", torch.randint(0, 256, (16, 2 * 20), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"x must be \[rows, 64\]"):
        block_gemm(torch.randn(2, 32), blocks, kind)
    with pytest.raises(ValueError, match="bias must be"):
        block_gemm(torch.randn(2, 64), blocks, kind, torch.randn(8))
    with pytest.raises(NotImplementedError, match="IQ2_XS does not run as blocks"):
        block_gemm(torch.randn(2, 64), blocks, "IQ2_XS")
    with pytest.raises(ValueError, match="must be uint8 rows"):
        block_gemm(torch.randn(2, 64), blocks.float(), kind)
    with pytest.raises(ValueError, match="does not run torch.float16"):
        block_gemm(torch.randn(2, 64).half(), blocks, kind)
    assert block_gemm(torch.randn(0, 64), blocks, kind).shape == (0, 16)


def test_read_gguf_matches_gguf_package():
    arch, ts = read_gguf(embedded_gguf_path())
    r = gguf.GGUFReader(embedded_gguf_path())
    assert arch == "llama" and len(ts) == len(r.tensors)
    for t in r.tensors:
        kind, a = ts[t.name]
        assert kind == t.tensor_type.name and np.array_equal(a.numpy(), np.array(t.data)), t.name


def test_bad_quantization_values(model_dir):
    with pytest.raises(NotImplementedError, match="quantization='awq'"): EngineArgs(quantization="awq")
    with pytest.raises(ValueError, match="quantization='gguf'"):    # a float checkpoint has no GGUF blocks to run
        EngineArgs(model=str(model_dir), quantization="gguf").create_engine_config()


@pytest.fixture(scope="module")
def quant_llm():
    from minivllm import LLM
    return LLM(quantization="gguf", dtype="bfloat16", max_model_len=512, enable_prefix_caching=False)


QUANTIZED = (Int4Linear, Int8Linear, BlockLinear)


def _set_limit(m, rows):
    "Make a hybrid quantized layer take its quantized kernel up to `rows` rows."
    if isinstance(m, BlockLinear):
        m.max_rows = rows
    else:
        m.max_int4_rows = m.max_int8_rows = rows


def _densify(model):
    "Replace every weight-only quantized module by a dense bf16 `Linear` holding exactly the kernel's weights."
    for name, m in list(model.named_modules()):
        if isinstance(m, QUANTIZED):
            lin = Linear(m.in_features, m.out_features, bias=False, dtype=torch.bfloat16)
            lin.weight.data.copy_(held_weight(m))
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, lin)


TEXTS = ["The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafes, and about two million "
         "people live in the city itself.",
         "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
         "print([fibonacci(i) for i in range(10)])",
         "Water boils at 100 degrees Celsius at sea level. At higher altitudes the air pressure is lower, so water boils at a "
         "lower temperature.",
         "<|im_start|>user\nList three colors.<|im_end|>\n<|im_start|>assistant\nRed, green and blue are three colors.<|im_end|>"]


prompt_stats = lambda llm: prompt_logprob_stats(llm, TEXTS)


def test_engine_matches_dense_reference_and_fp32(quant_llm):
    """The quantized engine vs (1) the same engine with dense bf16 linears holding the de-quantized weights (the torch
    reference, same dtype) and (2) the float32 expansion of the same GGUF. Both differ from it only by bf16 rounding
    (activations; accumulation order), which alone moves logprobs by up to ~0.3-0.45 nats at a few positions and flips
    the top-1 token at ~1-3% of them (measured: 97% / 98% top-1, mean |diff| 0.04 / 0.05 over 136 positions). A wrong
    repacking (a wrong zero point, scale or row order) breaks agreement completely, which is what these bounds catch."""
    from minivllm import LLM
    runner = quant_llm.llm_engine.engine_core.model_runner
    quantized = [m for m in runner.model.modules() if isinstance(m, QUANTIZED)]
    assert len(quantized) == 121                                         # 4 × 30 projections and the LM head
    blocks = blocks_supported("cpu", torch.bfloat16)
    assert {type(m) for m in quantized} == ({BlockLinear} if blocks else {Int4Linear, Int8Linear})
    if blocks:                                                           # qgemm.c (AVX-512): the layers are hybrid
        assert all(m.max_rows is not None for m in quantized)
        assert all([n for n, _ in m.named_buffers()] == ["blocks"] for m in quantized)   # and hold the blocks only
    else:                                  # elsewhere repacked for PyTorch's int4/int8 kernels, with no dense copy
        assert all(m.dense is None for m in quantized)
        assert {tuple(n for n, _ in m.named_buffers()) for m in quantized} == {("packed", "scales_and_zeros"),
                                                                              ("weight", "scales")}
    hybrid = prompt_stats(quant_llm)                                     # prefills: dense tiles
    for m in quantized: _set_limit(m, 10 ** 9)                           # the quantized kernels at every row count
    sq = prompt_stats(quant_llm)
    both = agreement(sq, hybrid)
    assert both["top1_agreement"] >= 0.9 and both["mean_abs_logprob_diff"] < 0.1 and both["max_abs_logprob_diff"] < 1.0, both
    _densify(runner.model)
    ref = agreement(sq, prompt_stats(quant_llm))
    assert ref["positions"] > 100 and ref["top1_agreement"] >= 0.9 and ref["mean_abs_logprob_diff"] < 0.1, ref
    assert ref["max_abs_logprob_diff"] < 1.0, ref
    fp32 = agreement(sq, prompt_stats(LLM(dtype="float32", max_model_len=512, enable_prefix_caching=False)))
    assert fp32["top1_agreement"] >= 0.9 and fp32["mean_abs_logprob_diff"] < 0.1 and fp32["max_abs_logprob_diff"] < 1.0, fp32


@needs_blocks
def test_float32_block_kernel_is_the_float32_expansion():
    """In float32 the block kernel multiplies by the expansion's own weights: at every row count (every prefill run by
    qgemm.c, not dense tiles) the teacher-forced logprobs are the float32 expansion's up to the order of additions."""
    from minivllm import LLM
    llm = LLM(quantization="gguf", dtype="float32", max_model_len=512, enable_prefix_caching=False)
    layers = [m for m in llm.llm_engine.engine_core.model_runner.model.modules() if isinstance(m, BlockLinear)]
    assert len(layers) == 121
    for m in layers: m.max_rows = 10 ** 9
    blocks = prompt_stats(llm)
    del llm, layers
    fp32 = agreement(blocks, prompt_stats(LLM(dtype="float32", max_model_len=512, enable_prefix_caching=False)))
    assert fp32["positions"] > 100 and fp32["top1_agreement"] == 1.0 and fp32["max_abs_logprob_diff"] < 1e-3, fp32
