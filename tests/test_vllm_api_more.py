"""vLLM's engine methods beyond generation, as a vLLM script calls them: `load_format="dummy"` (from `LLM(...)` and
the command line; the same model as its weights written to a checkpoint), `load_format="sharded_state"` with
`engine_core.save_sharded_state` (the embedded model saved and loaded back: the same greedy tokens), `collective_rpc` (one process, and refused
by name under tensor parallelism), `reset_prefix_cache(reset_running_requests=True)` and `AsyncLLM`'s
`pause_generation` / `resume_generation` / `is_paused` in the corners the lessons do not show: a client that leaves
while its request is held, `keep` without clearing the cache, vLLM's deprecated `wait_for_inflight_requests`, a
shutdown while paused — and vLLM's own `pause_resume.py` example, ported by its import lines and model name."""
import asyncio, shutil, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest, torch
from minivllm import LLM, LLMEngine, EngineArgs, SamplingParams, TokensPrompt, RequestOutputKind
from minivllm.serve.async_engine import AsyncLLM, EngineDeadError
from minivllm.serve.cli import FlexibleArgumentParser
from minivllm.core.model_files import resolve_model
from minivllm.core.model import make_tiny_checkpoint
from minivllm.compat.vllm import dummy_weights

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
    assert EngineArgs.from_cli_args(p.parse_args(["--load-format", "sharded_state"])).load_format == "sharded_state"
    for fmt in ("pt", "tensorizer", "bitsandbytes", "gguf"):
        with pytest.raises(NotImplementedError, match=f"load_format='{fmt}'"):
            EngineArgs.from_cli_args(p.parse_args(["--load-format", fmt]))
    with pytest.raises(NotImplementedError, match="load_format='dummy'"):
        EngineArgs(model=str(bare), load_format="dummy", quantization="gguf").create_engine_config()


def test_sharded_state_saved_and_loaded_gives_the_same_tokens(model_dir, tmp_path):
    """vLLM's `save_sharded_state_offline.py` / `load_sharded_state_offline.py` flow on the embedded model: the running
    engine's state saved by `llm.llm_engine.engine_core.save_sharded_state(path=, pattern=, max_size=)` (parts of at
    most 64 MB), the metadata files copied, loaded with `load_format="sharded_state"`: greedy tokens identical to the
    original engine's. Loading reads only this rank's files; a pattern vLLM needs pipeline parallelism for is refused."""
    from minivllm.compat.vllm import ShardedStateLoader
    args = EngineArgs(model=str(model_dir), dtype="float32", max_model_len=256, num_gpu_blocks_override=64)
    llm = LLM.from_engine_args(args)
    prompts = ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):"]
    want = tokens(llm, prompts, SamplingParams(temperature=0, max_tokens=24))
    out = tmp_path / "sharded"
    out.mkdir()
    llm.llm_engine.engine_core.save_sharded_state(path=str(out), pattern=None, max_size=64 << 20)
    for f in Path(model_dir).iterdir():                               # the example's metadata copy
        if f.suffix not in (".bin", ".pt", ".safetensors") and f.is_file():
            shutil.copy(f, out)
    parts = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(parts) > 1 and parts[0] == ShardedStateLoader.TP_ONLY_PATTERN.format(rank=0, part=0)
    (out / "model-rank-1-part-0.safetensors").write_bytes(b"not this rank's")   # never opened
    del llm
    loaded = LLM(model=str(out), load_format="sharded_state", dtype="float32", max_model_len=256,
                 num_gpu_blocks_override=64)
    assert tokens(loaded, prompts, SamplingParams(temperature=0, max_tokens=24)) == want
    loaded.llm_engine.engine_core.save_sharded_state(str(tmp_path / "custom"), pattern="w-{tp_rank}-{part}.st")
    assert [p.name for p in (tmp_path / "custom").iterdir()] == ["w-0-0.st"]
    with pytest.raises(ValueError, match="pp_rank"):
        loaded.llm_engine.engine_core.save_sharded_state(str(tmp_path / "pp"), pattern=ShardedStateLoader.PP_AND_TP_PATTERN)


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
        with pytest.raises(NotImplementedError, match="takes a method name"):
            tp.collective_rpc(lambda w: w.rank)
        assert [shape[3] for shape in tp.collective_rpc("kv_cache_shape")] == [2, 1]   # every rank's: 2 + 1 KV heads
        with pytest.raises(NotImplementedError, match="save_sharded_state with tensor or pipeline parallelism"):
            tp.llm_engine.engine_core.save_sharded_state(path=str(bare.parent / "tp_shards"))
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


def arun(coro):
    "Run `coro` to its end on a fresh event loop in a thread of its own (whatever loop this thread may hold)."
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


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
    arun(main())


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
    arun(main())


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
    arun(main())


def test_keep_pause_leaves_a_gap_and_every_token(bare):
    """The pattern of vLLM's pause/resume example: pause in `keep` mode after 5 tokens, sleep, resume. The largest
    gap between two tokens is the pause, and the request still gets all of its 30 tokens."""
    pause = 1.0

    async def main():
        e = AsyncLLM.from_engine_args(EngineArgs(model=str(bare), load_format="dummy", enforce_eager=True,
                                                 max_model_len=128, num_gpu_blocks_override=32))
        times = []

        async def gen():
            sp = SamplingParams(max_tokens=30, ignore_eos=True)
            async for o in e.generate(PROMPTS[1], sp, request_id="dragon"):
                times.append(time.monotonic())
            return o

        async def control():
            while len(times) < 5:
                await asyncio.sleep(0.01)
            await e.pause_generation(mode="keep")
            await asyncio.sleep(pause)
            await e.resume_generation()

        try:
            out, _ = await asyncio.gather(gen(), control())
        finally:
            e.shutdown()
        return out, max(b - a for a, b in zip(times[1:], times[2:]))   # from the 2nd token: TTFT left out

    out, gap = arun(main())
    assert gap >= 0.9 * pause, gap
    assert out.finished and len(out.outputs[0].token_ids) == 30


def test_pause_and_preemption_refused_with_data_parallelism(bare):
    "Data parallelism's engines run in their own processes: pausing them, or preempting their requests, is refused."
    e = AsyncLLM.from_engine_args(EngineArgs(model=str(bare), load_format="dummy", data_parallel_size=2,
                                             max_model_len=128, num_gpu_blocks_override=32))
    try:
        with pytest.raises(NotImplementedError, match="pause_generation with data_parallel_size > 1"):
            arun(e.pause_generation())
        from minivllm.core.llm_engine import preempt_running
        with pytest.raises(NotImplementedError, match="data_parallel_size > 1"):
            preempt_running(e.engine)
    finally:
        e.shutdown()
