"""Engines that come and go: each engine kind (`LLM`, `data_parallel_size=2`, `tensor_parallel_size=2`,
`pipeline_parallel_size=2`, `AsyncLLMEngine`) is built, used and dropped again and again in one process, every
other time with an explicit `shutdown()` and every other time only by dropping it (`del`, then garbage
collection). The process must end (dropping a data-parallel `LLM` used to hang in ZeroMQ's `Context.term`), and
afterwards no child process, no extra Python thread and no open socket may remain, and resident memory must be
flat (within 100 MB of what it was after the first round).

Each kind runs in a fresh Python process (this file, run as a script) under a timeout, so a hang fails the test
instead of stopping the suite. The multi-process kinds start two processes that each import torch every round
(seconds each on a 2-core machine). By default the single-process kinds run 10 rounds and the multi-process ones
4; `MINIVLLM_SHUTDOWN_ROUNDS=20` runs 20 of every kind."""

import gc, json, os, subprocess, sys, threading

import pytest

pytestmark = pytest.mark.xdist_group("tp")  # one xdist worker: these tests start processes of their own

KINDS = {
    "llm": {},
    "dp": dict(data_parallel_size=2),
    "tp": dict(tensor_parallel_size=2),
    "pp": dict(pipeline_parallel_size=2),
    "async": {},
}
SINGLE = ("llm", "async")


def rounds(kind: str) -> int:
    if "MINIVLLM_SHUTDOWN_ROUNDS" in os.environ: return int(os.environ["MINIVLLM_SHUTDOWN_ROUNDS"])
    return 10 if kind in SINGLE else 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_dir):
    from minivllm.core.model import make_tiny_checkpoint

    d = tmp_path_factory.mktemp("tiny_shutdown")
    make_tiny_checkpoint(d, "llama", seed=1, tokenizer_from=model_dir, vocab_size=49152, hidden_size=64,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         num_hidden_layers=2, tie_word_embeddings=True)
    return str(d)


def sockets() -> list:
    "This process's open sockets (TCP, UDP and Unix: ZeroMQ's ipc sockets are Unix sockets)."
    import psutil

    return [(c.family, c.laddr) for c in psutil.Process().net_connections(kind="all")]


def threads() -> list:
    # (tqdm's monitor thread is tqdm's own, started once per process by the first progress bar)
    return sorted(t.name for t in threading.enumerate() if t.name != "tqdm_monitor")


def state(baseline=None) -> dict:
    """What the process holds. With a `baseline` list of threads, first give a dropped engine's thread up to 10 s
    to end: an `AsyncLLMEngine` dropped while its thread finishes a turn is collected by the next collection."""
    import psutil, time

    me = psutil.Process()
    gc.collect()
    for _ in range(200 if baseline is not None else 0):
        if threads() == baseline:
            break
        time.sleep(0.05)
        gc.collect()
    return dict(
        children=[p.pid for p in me.children(recursive=True)],
        threads=threads(),
        sockets=len(sockets()),
        rss=me.memory_info().rss,
    )


def one_round(kind: str, model: str, explicit: bool):
    "Build an engine of `kind`, generate with it, then shut it down (`explicit`) or just drop it."
    from minivllm import LLM, AsyncEngineArgs, AsyncLLMEngine, SamplingParams

    kw = dict(dtype="float32", max_model_len=128, kv_cache_memory_bytes=2 << 20, **KINDS[kind])
    sp = SamplingParams(max_tokens=4, temperature=0)
    if kind == "async":
        import asyncio

        engine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **kw))

        async def go():
            async for out in engine.generate("Hello", sp, "r"):
                pass
            return out.outputs[0].token_ids

        assert len(asyncio.run(go())) == 4
    else:
        engine = LLM(model, **kw)
        assert len(engine.generate(["Hello", "Hi"], sp, use_tqdm=False)[1].outputs[0].token_ids) == 4
    held = None
    if explicit:
        engine.shutdown()
        held = state()  # what the engine still holds after `shutdown()`, before it is dropped
    del engine
    gc.collect()
    return held


def main(kind: str, model: str, n: int):
    "(the child process) Run `n` rounds; print what stayed behind, as JSON."
    before = state()
    after, held = [], []
    for i in range(n):
        held.append(one_round(kind, model, explicit=i % 2 == 0))
        after.append(state(before["threads"]))
    print("RESULT " + json.dumps(dict(before=before, after=after, held=held)), flush=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_build_and_drop(kind, tiny):
    n = rounds(kind)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # (180 s a round is far more than any round needs: a longer one is a hang)
    p = subprocess.run([sys.executable, __file__, kind, tiny, str(n)], env=env, capture_output=True, text=True,
                       timeout=60 + 180 * n)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    before, after = res["before"], res["after"]
    assert len(after) == n
    for i, a in enumerate(after + [h for h in res["held"] if h is not None]):
        assert a["children"] == [], (i, a)  # every worker process reaped
        assert a["threads"] == before["threads"], (i, a["threads"], before["threads"])
        assert a["sockets"] == before["sockets"], (i, a["sockets"], before["sockets"])
    grown = (after[-1]["rss"] - after[0]["rss"]) / 2**20
    assert grown < 100, f"resident memory grew {grown:.0f} MB over {n} rounds"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
