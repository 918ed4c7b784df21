"""Custom logits processors (lesson 06d) as vLLM v1 has them: vLLM's example `offline_inference/logits_processor/custom.py`
and `custom_req.py` ported by their import lines, checked against HF transformers' greedy output for the requests the
processor leaves alone; a batch that changes under the processor (waiting requests, preemptions, chunked prefills);
processors given by name; bad input refused by name."""
import sys
import pytest, torch
from minivllm import LLM, EngineArgs, SamplingParams

pytestmark = pytest.mark.xdist_group("logits_processors")

# vLLM's example, with `vllm` replaced by `minivllm` on the import lines (the rest is vLLM's code)
CUSTOM_PY = '''
import torch
from minivllm import LLM, SamplingParams
from minivllm.core.config import VllmConfig
from minivllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from minivllm.v1.sample.logits_processor.builtin import process_dict_updates


class DummyLogitsProcessor(LogitsProcessor):
    """Fake logit processor to support unit testing and examples"""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.req_info: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None):
        process_dict_updates(
            self.req_info,
            batch_update,
            lambda params, _, __: params.extra_args and (params.extra_args.get("target_token")),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.req_info:
            return logits
        cols = torch.tensor(list(self.req_info.values()), dtype=torch.long, device=logits.device)
        rows = torch.tensor(list(self.req_info.keys()), dtype=torch.long, device=logits.device)
        values_to_keep = logits[rows, cols].clone()
        logits[rows] = float("-inf")
        logits[rows, cols] = values_to_keep
        return logits
'''

CUSTOM_REQ_PY = '''
from typing import Optional
import torch
from minivllm import SamplingParams
from minivllm.v1.sample.logits_processor import AdapterLogitsProcessor, RequestLogitsProcessor


class DummyPerReqLogitsProcessor:
    def __init__(self, target_token: int) -> None:
        self.target_token = target_token

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        val_to_keep = logits[self.target_token].item()
        logits[:] = float("-inf")
        logits[self.target_token] = val_to_keep
        return logits


class WrappedPerReqLogitsProcessor(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> Optional[RequestLogitsProcessor]:
        if not params.extra_args or "target_token" not in params.extra_args:
            return None
        return DummyPerReqLogitsProcessor(params.extra_args["target_token"])


class StrictTarget(WrappedPerReqLogitsProcessor):
    @classmethod
    def validate_params(cls, params):
        t = (params.extra_args or {}).get("target_token")
        if t is not None and not isinstance(t, int):
            raise ValueError(f"target_token must be an int, got {t!r}")


class NotAProcessor:
    pass
'''

PROMPTS = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    "The two examples' processors as an importable module `lp_examples` (so they can also be named 'module:Class')."
    d = tmp_path_factory.mktemp("lp")
    (d / "lp_examples.py").write_text(CUSTOM_PY + CUSTOM_REQ_PY)
    sys.path.insert(0, str(d))
    import lp_examples
    yield lp_examples
    sys.path.remove(str(d))


def example_params(max_tokens=10):
    return [SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args={"target_token": 128}),
            SamplingParams(temperature=0.0, max_tokens=max_tokens),
            SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args={"target_token": 67}),
            SamplingParams(temperature=0.0, max_tokens=max_tokens)]


@pytest.mark.parametrize("which", ["DummyLogitsProcessor", "WrappedPerReqLogitsProcessor", "by name"])
def test_vllm_examples(procs, which, tokenizer, hf_greedy):
    "custom.py / custom_req.py: targeted requests give only their token; the others are HF's greedy continuation."
    lp = "lp_examples:WrappedPerReqLogitsProcessor" if which == "by name" else getattr(procs, which)
    llm = LLM(logits_processors=[lp], dtype="float32", max_model_len=256, num_gpu_blocks_override=64)
    outs = llm.generate(PROMPTS, example_params(), use_tqdm=False)
    assert outs[0].outputs[0].token_ids == [128] * 10 and outs[2].outputs[0].token_ids == [67] * 10
    for k in (1, 3):
        ids = tokenizer(PROMPTS[k])["input_ids"]
        assert outs[k].outputs[0].token_ids == hf_greedy(ids, 10)[: len(outs[k].outputs[0].token_ids)]
    llm.llm_engine.engine_core.shutdown()


def test_batch_changes_under_the_processor(procs):
    """More requests than max_num_seqs, different lengths, a KV cache small enough to preempt, prefills in chunks:
    each request is forced to its own token only, whatever batch index it has from step to step."""
    llm = LLM(logits_processors=[procs.DummyLogitsProcessor], dtype="float32", max_model_len=64, block_size=4,
              num_gpu_blocks_override=16, max_num_seqs=5, max_num_batched_tokens=16)
    prompts = [" ".join(["word"] * (3 + 2 * i)) for i in range(10)]
    params = [SamplingParams(temperature=0.0 if i % 3 else 0.8, seed=i, max_tokens=10 + 4 * (i % 4),
                             extra_args={"target_token": 400 + i} if i % 5 != 4 else None) for i in range(10)]
    before = llm.llm_engine.engine_core.scheduler.num_preemptions
    outs = llm.generate(prompts, params, use_tqdm=False)
    for i, o in enumerate(outs):
        ids = o.outputs[0].token_ids
        assert len(ids) == params[i].max_tokens
        if i % 5 != 4:
            assert ids == [400 + i] * len(ids), (i, ids)
        else:  # untouched: never the targets of the others
            assert not set(ids) & set(range(400, 410)), ids
    assert llm.llm_engine.engine_core.scheduler.num_preemptions > before  # the cache was small enough
    llm.llm_engine.engine_core.shutdown()


def test_argmax_invariant_skipped_when_greedy():
    from minivllm.v1.sample.logits_processor import LogitsProcessor

    class Counting(LogitsProcessor):
        calls = 0

        def __init__(self, vllm_config, device, is_pin_memory):
            assert vllm_config.model_config.max_model_len == 128 and device.type == "cpu" and is_pin_memory is False

        def is_argmax_invariant(self):
            return True

        def update_state(self, batch_update):
            pass

        def apply(self, logits):
            type(self).calls += 1
            assert logits.dtype == torch.float32
            return logits

    llm = LLM(logits_processors=[Counting], max_model_len=128, num_gpu_blocks_override=32)
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert Counting.calls == 0
    llm.generate(PROMPTS, SamplingParams(temperature=0.7, max_tokens=3), use_tqdm=False)
    assert Counting.calls == 3
    llm.llm_engine.engine_core.shutdown()


def test_bad_input_refused(procs):
    llm = LLM(logits_processors=[procs.StrictTarget], max_model_len=128, num_gpu_blocks_override=32)
    with pytest.raises(ValueError, match="target_token must be an int"):
        llm.generate("Hi", SamplingParams(max_tokens=2, extra_args={"target_token": "x"}), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()   # refused before anything was queued
    assert llm.generate("Hi", SamplingParams(max_tokens=2, extra_args={"target_token": 7}), use_tqdm=False)[0] \
        .outputs[0].token_ids == [7, 7]
    llm.llm_engine.engine_core.shutdown()
    with pytest.raises(ValueError, match="not a subclass of LogitsProcessor"):
        LLM(logits_processors=[procs.NotAProcessor], max_model_len=128, num_gpu_blocks_override=32)
    with pytest.raises(ValueError, match="cannot load 'lp_examples:NoSuch'"):
        LLM(logits_processors=["lp_examples:NoSuch"], max_model_len=128, num_gpu_blocks_override=32)
    with pytest.raises(ValueError, match="a list of classes"):
        EngineArgs(logits_processors="lp_examples:StrictTarget").create_engine_config()
    with pytest.raises(NotImplementedError, match="logits_processors with speculative_config"):
        LLM(logits_processors=[procs.StrictTarget], speculative_config={"method": "ngram", "num_speculative_tokens": 2},
            num_gpu_blocks_override=32)
