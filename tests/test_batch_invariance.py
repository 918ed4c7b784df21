"""Batch-invariant greedy output (VLLM_BATCH_INVARIANT=1): the same tokens and the same log-probabilities, to the bit,
with and without prefix-cache hits, alone and inside a batch with chunked prefill. The embedded model, default dtype
(and its GGUF's 4-bit blocks)."""
import pytest, torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.gemm import gemm_supported

# vLLM's examples/offline_inference/automatic_prefix_caching.py, shortened
PREFIX = (
    "You are an expert school principal, skilled in effectively managing faculty and staff. Draft 10-15 questions for "
    "a potential first grade Head Teacher for my K-12, all-girls', independent school that emphasizes community, joy "
    "in learning, and diversity. Be sure to include questions that explore the candidate's approach to teaching and "
    "managing children, ability to work with a diverse group of people, and sense of humour. Here is the question: "
)
QUESTIONS = ["Hello, my name is", "The president of the United States is", "The capital of France is",
             "The future of AI is"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0)


def _dtype_default():
    from minivllm.core.arg_utils import EngineArgs
    return EngineArgs().create_engine_config().model_config.dtype


@pytest.fixture
def invariant(monkeypatch):
    dtype = _dtype_default()
    if not gemm_supported(torch.zeros(16, 2, dtype=dtype)):
        pytest.skip(f"the C GEMM (needed for batch invariance) does not run {dtype} on this CPU")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")


def _result(outputs):
    "Per request: the generated token ids and the log-probability of each (exact floats)."
    return [(list(o.outputs[0].token_ids), [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outputs]


def test_prefix_cache_hits_do_not_change_greedy_output(invariant):
    prompts = [PREFIX + q for q in QUESTIONS]
    plain = LLM(enable_prefix_caching=False, seed=0)
    expected = _result(plain.generate(prompts, GREEDY, use_tqdm=False))
    split = _result([plain.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts])  # one at a time
    del plain
    cached = LLM(enable_prefix_caching=True, seed=0)
    cached.generate(prompts[0], GREEDY, use_tqdm=False)  # warm up: the prefix is now in the cache
    hits = _result(cached.generate(prompts, GREEDY, use_tqdm=False))
    assert split == expected
    assert hits == expected


@pytest.mark.parametrize("weights", ["float", "gguf"])
def test_request_alone_and_in_a_batch_of_30_with_chunked_prefill(invariant, weights):
    "Float weights (the C GEMM), and the GGUF's own 4-bit blocks (lesson 04b's qgemm.c at every size)."
    quant = dict(quantization="gguf") if weights == "gguf" else {}
    llm = LLM(enable_prefix_caching=False, enable_chunked_prefill=True, max_num_batched_tokens=96, seed=0, **quant)
    target = PREFIX + "Write one question about teamwork."
    alone = _result(llm.generate([target], GREEDY, use_tqdm=False))[0]
    others = [f"Question {i}: name {i % 7 + 2} animals of the {'rivers' if i % 2 else 'deserts'}."
              for i in range(30)]
    batch = others[:15] + [target] + others[15:]
    together = _result(llm.generate(batch, GREEDY, use_tqdm=False))[15]
    assert together == alone
