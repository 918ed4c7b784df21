"""vLLM's smaller pieces a script leans on: `LLM.get_metrics()` as vLLM's reader records (its examples read them by
`isinstance`), and `hf_overrides` taking effect in the model (checked against HF transformers with the same override)."""
import pytest, torch
from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.xdist_group("vllm_misc")


def test_get_metrics_reader_types():
    "vLLM's examples/offline_inference/metrics.py, ported: every record is a Counter, Gauge, Histogram or Vector."
    from minivllm.v1.metrics.reader import Counter, Gauge, Histogram, Vector
    llm = LLM(max_model_len=256, num_gpu_blocks_override=64)
    prompts = ["Hello, my name is", "The capital of France is", "The future of AI is"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    ms = llm.get_metrics()
    assert ms and all(isinstance(m, (Counter, Gauge, Histogram, Vector)) for m in ms)
    assert all(m.name.startswith("vllm:") and m.labels["engine"] == "0" for m in ms)
    by = {m.name: m for m in ms if "finished_reason" not in m.labels}
    finished = {m.labels["finished_reason"]: m.value for m in ms if m.name == "vllm:request_success"}
    assert sum(finished.values()) == 3 and isinstance(by["vllm:generation_tokens"], Counter)
    assert by["vllm:generation_tokens"].value == sum(len(o.outputs[0].token_ids) for o in outs)
    assert isinstance(by["vllm:num_requests_running"], Gauge) and by["vllm:num_requests_running"].value == 0
    for name in ["time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"]:
        h = by[f"vllm:{name}"]
        assert isinstance(h, Histogram) and h.count == 3 == h.buckets["+Inf"]
        counts = list(h.buckets.values())
        assert counts == sorted(counts) and h.sum > 0      # cumulative buckets
    itl = by["vllm:inter_token_latency_seconds"]
    assert itl.count == sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    assert not any(isinstance(m, Vector) for m in ms)     # no speculation: no acceptance vector


ROPE = dict(rope_type="default", rope_theta=2000.0)   # the model's is 100000: every position's rotation changes


def test_hf_overrides_take_effect(model_dir, tokenizer):
    "Another rope theta through hf_overrides: minivllm's greedy output is HF's with the same config, not the plain one."
    from transformers import AutoConfig, AutoModelForCausalLM
    prompt = "Here is a list of the planets of the solar system, from the closest to the sun to the farthest one:"
    ids = tokenizer(prompt)["input_ids"]

    def hf_greedy(config):
        m = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
        with torch.no_grad():
            out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, pad_token_id=2)
        return out[0, len(ids):].tolist()

    cfg = AutoConfig.from_pretrained(model_dir)
    plain_ref = hf_greedy(cfg)
    cfg.rope_parameters = dict(ROPE)
    scaled_ref = hf_greedy(cfg)
    assert scaled_ref != plain_ref    # the override matters for this prompt

    def ours(**kw):
        llm = LLM(dtype="float32", max_model_len=256, num_gpu_blocks_override=64, **kw)
        o = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
        llm.llm_engine.engine_core.shutdown()
        return o[0].outputs[0].token_ids

    assert ours(hf_overrides={"rope_parameters": dict(ROPE)}) == scaled_ref
    def as_callable(c):
        c.rope_parameters = dict(ROPE)
        return c
    assert ours(hf_overrides=as_callable) == scaled_ref


def test_hf_overrides_refused_where_minivllm_lacks_it():
    # (YaRN is implemented: lesson 95 registers it; dynamic NTK scaling, which depends on the sequence length, is not)
    dynamic = dict(rope_type="dynamic", rope_theta=100000.0, factor=2.0)
    with pytest.raises(NotImplementedError, match="dynamic"):
        LLM(max_model_len=256, num_gpu_blocks_override=64, hf_overrides={"rope_parameters": dynamic})
