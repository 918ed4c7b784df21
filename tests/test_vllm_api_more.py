"""vLLM's engine methods beyond generation, as a vLLM script calls them: `load_format="dummy"` (from `LLM(...)` and
the command line; the same model as its weights written to a checkpoint), `collective_rpc` (one process, and refused
by name under tensor parallelism), `reset_prefix_cache(reset_running_requests=True)` and `AsyncLLM`'s
`pause_generation` / `resume_generation` / `is_paused` in the corners the lessons do not show: a client that leaves
while its request is held, `keep` without clearing the cache, vLLM's deprecated `wait_for_inflight_requests`, a
shutdown while paused — and vLLM's own `pause_resume.py` example, ported by its import lines and model name."""
import asyncio, shutil, tempfile, time
from pathlib import Path
import pytest, torch
from minivllm import LLM, LLMEngine, EngineArgs, SamplingParams, TokensPrompt, RequestOutputKind
from minivllm.async_engine import AsyncLLM, EngineDeadError
from minivllm.cli import FlexibleArgumentParser
from minivllm.config import resolve_model
from minivllm.model import make_tiny_checkpoint
from minivllm.vllm_compat import dummy_weights

pytestmark = pytest.mark.xdist_group("vllm_api_more")
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [TokensPrompt(prompt_token_ids=[5, 17, 99, 3]), TokensPrompt(prompt_token_ids=list(range(30, 52)))]


@pytest.fixture(scope="module")
def bare():
    "A tiny Llama's config.json and SmolLM2's tokenizer, and no weight file."
    d = Path(tempfile.mkdtemp())
    make_tiny_checkpoint(d / "ckpt", tokenizer_from=resolve_model(None), vocab_size=250, hidden_size=96,
                         num_attention_heads=6, num_key_value_heads=3, head_dim=16, intermediate_size=96)
    (d / "bare").mkdir()
    for f in (d / "ckpt").iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, d / "bare")
    yield d / "bare"
    shutil.rmtree(d)


def tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_dummy_equals_its_weights_as_a_checkpoint(bare, tmp_path):
    "The dummy model is the model of `dummy_weights(config, seed)`: written as safetensors and loaded, same tokens."
    from safetensors.torch import save_file
    from transformers import AutoConfig
    dummy = LLM(model=str(bare), load_format="dummy", seed=11, max_model_len=128, num_gpu_blocks_override=32)
    for f in bare.iterdir():
        shutil.copy(f, tmp_path)
    save_file({k: v.contiguous() for k, v in dummy_weights(AutoConfig.from_pretrained(bare), 11)},
              str(tmp_path / "model.safetensors"))
    real = LLM(model=str(tmp_path), max_model_len=128, num_gpu_blocks_override=32)
    assert tokens(dummy) == tokens(real)
    other = LLM(model=str(bare), load_format="dummy", seed=12, max_model_len=128, num_gpu_blocks_override=32)
    assert tokens(other) != tokens(dummy)


def test_load_format_on_the_command_line(bare):
    p = EngineArgs.add_cli_args(FlexibleArgumentParser())
    assert EngineArgs.from_cli_args(p.parse_args(["--load-format", "dummy"])).load_format == "dummy"
    assert EngineArgs.from_cli_args(p.parse_args([])).load_format == "auto"
    for fmt in ("pt", "sharded_state", "bitsandbytes", "gguf"):
        with pytest.raises(NotImplementedError, match=f"load_format='{fmt}'"):
            EngineArgs.from_cli_args(p.parse_args(["--load-format", fmt]))
    with pytest.raises(NotImplementedError, match="load_format='dummy'"):
        EngineArgs(model=str(bare), load_format="dummy", quantization="gguf").create_engine_config()


def test_collective_rpc_and_dummy_under_tensor_parallelism(bare):
    llm = LLM(model=str(bare), load_format="dummy", max_model_len=128, num_gpu_blocks_override=32)
    runner = llm.llm_engine.engine_core.model_runner
    assert llm.collective_rpc(lambda w: w.num_blocks) == [32] == [llm.llm_engine.cache_config.num_gpu_blocks]
    assert llm.collective_rpc("kv_cache_shape") == [tuple(runner.kv_caches[0].shape)]
    assert llm.llm_engine.collective_rpc(lambda w, x: w.model_runner is w and x, args=(5,)) == [5]
    with pytest.raises(TypeError, match="str or a callable"):
        llm.collective_rpc(42)
    want = tokens(llm)
    tp = LLM(model=str(bare), load_format="dummy", tensor_parallel_size=2, max_model_len=128,
             kv_cache_memory_bytes=1 << 22)       # each rank keeps its slice of the same dummy weights
    try:
        assert type(tp.llm_engine.engine_core.model_runner).__name__ == "DummyTPModelRunner"
        assert tokens(tp) == want
        with pytest.raises(NotImplementedError, match="collective_rpc with tensor or pipeline parallelism"):
            tp.collective_rpc(lambda w: w.rank)
    finally:
        tp.llm_engine.shutdown()


@pytest.fixture(scope="module")
def engine(bare):
    "One async engine over the dummy model; each step 5 ms longer, so a test can act in the middle of a request."
    e = AsyncLLM.from_engine_args(EngineArgs(model=str(bare), load_format="dummy", max_model_len=128,
                                             num_gpu_blocks_override=32))
    e.engine.step_observers.append(lambda info: time.sleep(0.005))
    yield e
    e.shutdown()


LONG = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, output_kind=RequestOutputKind.DELTA)


async def run(e, rid, seen, prompt=PROMPTS[0]):
    seen[rid] = []
    async for o in e.generate(prompt, LONG, rid):
        seen[rid] += o.outputs[0].token_ids
    return o


async def until(seen, rid, n):
    while len(seen.get(rid, ())) < n:
        await asyncio.sleep(0.001)


def test_pause_keep_without_clearing_and_the_deprecated_spelling(engine):
    async def main():
        seen = {}
        await run(engine, "ref", seen)
        t = asyncio.create_task(run(engine, "kept", seen))
        await until(seen, "kept", 3)
        pre = engine.engine.scheduler.num_preemptions
        await engine.pause_generation(mode="keep", clear_cache=False)
        await asyncio.sleep(0.05)
        n = len(seen["kept"])
        await asyncio.sleep(0.2)
        assert len(seen["kept"]) == n < 60 and await engine.is_paused()
        await engine.resume_generation()
        await t
        assert seen["kept"] == seen["ref"] and engine.engine.scheduler.num_preemptions == pre  # not recomputed
        t = asyncio.create_task(run(engine, "waited", seen))
        await until(seen, "waited", 3)
        with pytest.warns(DeprecationWarning, match="mode='wait'"):
            await engine.pause_generation(wait_for_inflight_requests=True)
        assert await engine.get_num_unfinished_requests() == 0
        await t
        assert seen["waited"] == seen["ref"]
        await engine.resume_generation()
    asyncio.run(main())


def test_a_client_that_leaves_while_paused_runs_nothing(engine):
    async def main():
        seen = {}
        await engine.pause_generation()
        t = asyncio.create_task(run(engine, "gone", seen))
        t2 = asyncio.create_task(run(engine, "stays", seen, PROMPTS[1]))
        await asyncio.sleep(0.1)
        t.cancel()
        await asyncio.sleep(0.05)
        assert len(engine._held) == 1     # only the request whose client stayed waits
        await engine.resume_generation()
        await t2
        assert seen["gone"] == [] and len(seen["stays"]) == 60
        assert await engine.get_num_unfinished_requests() == 0
        kv = engine.engine.kv_cache_manager.block_pool
        assert kv.get_num_free_blocks() == engine.engine.cache_config.num_gpu_blocks
    asyncio.run(main())


def test_shutdown_while_paused_ends_the_held_request(bare):
    e = AsyncLLM.from_engine_args(EngineArgs(model=str(bare), load_format="dummy", max_model_len=128,
                                             num_gpu_blocks_override=32))
    async def main():
        await e.pause_generation()
        t = asyncio.create_task(run(e, "held", {}))
        await asyncio.sleep(0.1)
        e.shutdown()
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(t, 10)
    asyncio.run(main())


# vLLM's `examples/offline_inference/pause_resume.py` as vLLM ships it (Apache-2.0, (c) the vLLM contributors), at
# vllm-project/vllm commit 53a61e07; `port()` changes only the import lines and the model name.
VLLM_PAUSE_RESUME = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Test for pause/resume with keep mode.

This test uses concurrent tasks to verify the engine truly stops generating
during pause:
1. Generator task: continuously generates and logs time between tokens
2. Controller task: sends pause/resume commands

If the engine properly pauses, we should see a gap in token timestamps
matching the pause duration.
"""

import asyncio
import time

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

PAUSE_DURATION = 3.0  # seconds


async def main():
    # Create engine with a small model
    engine_args = AsyncEngineArgs(
        model="facebook/opt-125m",
        enforce_eager=True,
    )
    engine = AsyncLLM.from_engine_args(engine_args)

    prompt = "Write a story about a dragon. Once upon a time"
    sampling_params = SamplingParams(max_tokens=30, ignore_eos=True)

    # Track token arrival times
    token_times: list[tuple[int, float]] = []  # (token_count, timestamp)
    pause_time: float = 0
    resume_time: float = 0

    async def generator_task():
        """Generate tokens and record timestamps."""
        async for output in engine.generate(
            request_id="test-req",
            prompt=prompt,
            sampling_params=sampling_params,
        ):
            token_count = len(output.outputs[0].token_ids)
            token_times.append((token_count, time.monotonic()))
            print(
                f"Token {token_count} arrived:"
                f"T={token_times[-1][1] - token_times[0][1]:.3f}s"
            )
        return output

    async def controller_task():
        """Pause and resume the engine after some tokens generated."""
        nonlocal pause_time, resume_time

        # Wait for some tokens to be generated
        while len(token_times) < 5:
            await asyncio.sleep(0.01)

        print(f"\\nPausing engine (keep mode) at token {len(token_times)}")
        pause_time = time.monotonic()
        await engine.pause_generation(mode="keep")
        print(f"Paused! Sleeping for {PAUSE_DURATION}s...")

        # Sleep while paused - no tokens should be generated during this time
        await asyncio.sleep(PAUSE_DURATION)

        print("Resuming engine...")
        await engine.resume_generation()
        resume_time = time.monotonic()
        print("Resumed!\\n")

    # Run both tasks concurrently
    gen_task = asyncio.create_task(generator_task())
    ctrl_task = asyncio.create_task(controller_task())

    final_output, _ = await asyncio.gather(gen_task, ctrl_task)

    # Analyze token timing gaps
    print("\\n=== Token Timing Analysis ===")
    max_gap = 0.0
    max_gap_tokens = (0, 0)
    # Start from index 2 to exclude TTFT (time to first token)
    for i in range(2, len(token_times)):
        gap = token_times[i][1] - token_times[i - 1][1]
        if gap > max_gap:
            max_gap = gap
            max_gap_tokens = (token_times[i - 1][0], token_times[i][0])
        if gap > 0.5:  # Log significant gaps
            print(
                f"  Gap of {gap:.3f}s"
                f" between token {token_times[i - 1][0]} and {token_times[i][0]}"
            )

    print(
        f"\\nLargest gap: {max_gap:.3f}s "
        f"(between tokens {max_gap_tokens[0]} and {max_gap_tokens[1]})"
    )
    print(f"Pause duration: {PAUSE_DURATION}s")
    print(f"Final token count: {len(final_output.outputs[0].token_ids)}")
    print(f"Request finished: {final_output.finished}")

    # Verify the pause actually stopped generation.
    # The max gap should be approximately the pause duration.
    if max_gap >= PAUSE_DURATION * 0.9:
        print(f"\\n\\u2713 Test passed! Engine paused for ~{max_gap:.1f}s")
    else:
        print(f"\\n\\u2717 Test failed! Expected ~{PAUSE_DURATION}s gap, got {max_gap:.3f}s")
        raise AssertionError("Engine did not properly pause")

    # Verify request completed
    assert final_output.finished, "Request should have finished"
    assert len(final_output.outputs[0].token_ids) == 30, "Should have all tokens"

    engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
'''


def test_vllm_pause_resume_example(capsys):
    "vLLM's own pause/resume example, ported by its import lines and model name, passes its own checks."
    import re
    code = re.sub(r"^from vllm(\S*) import", r"from minivllm\1 import", VLLM_PAUSE_RESUME, flags=re.M)
    code = code.replace('model="facebook/opt-125m"', "model=None")
    changed = [(a, b) for a, b in zip(VLLM_PAUSE_RESUME.splitlines(), code.splitlines()) if a != b]
    assert len(changed) == 4 and all("import" in a or "facebook/opt-125m" in a for a, _ in changed)
    exec(compile(code, "pause_resume.py", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "Test passed! Engine paused" in out and "Final token count: 30" in out, out


def test_pause_and_preemption_refused_with_data_parallelism(bare):
    "Data parallelism's engines run in their own processes: pausing them, or preempting their requests, is refused."
    e = AsyncLLM.from_engine_args(EngineArgs(model=str(bare), load_format="dummy", data_parallel_size=2,
                                             max_model_len=128, num_gpu_blocks_override=32))
    try:
        with pytest.raises(NotImplementedError, match="pause_generation with data_parallel_size > 1"):
            asyncio.run(e.pause_generation())
        from minivllm.llm_more import preempt_running
        with pytest.raises(NotImplementedError, match="data_parallel_size > 1"):
            preempt_running(e.engine)
    finally:
        e.shutdown()
