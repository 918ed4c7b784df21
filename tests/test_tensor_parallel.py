"""Tensor parallelism on gloo (CPU): tensor_parallel_size 2 and 3 on the embedded SmolLM2 give the same greedy
tokens as one process; workers never outlive the engine (shutdown, garbage collection, a dead parent); a failing
worker is a clear error in rank 0; a rank started by hand (the multi-machine recipe) joins through MASTER_ADDR/PORT."""
import gc, os, signal, socket, subprocess, sys, tempfile, textwrap, time
import psutil, pytest, torch
from minivllm.core.arg_utils import EngineArgs
from minivllm.core.config import SamplingParams, TokensPrompt
from minivllm.core.model_files import resolve_model
from minivllm.core.llm_engine import LLMEngine

pytestmark = pytest.mark.xdist_group("tp")   # one xdist worker: these tests start processes of their own


def greedy(engine, prompts, max_tokens):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts): engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=p), sp)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o.outputs[0].token_ids
    return [done[f"r{i}"] for i in range(len(prompts))]


def alive(pids):
    "The pids that still run (zombies count as gone: their process has ended)."
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE: out.append(p)
        except psutil.NoSuchProcess: pass
    return out


def wait_gone(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline: time.sleep(0.1)
    return alive(pids)


def tp_children():
    "Processes under this one that run a tensor-parallel worker."
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "minivllm.parallel.tensor" in " ".join(p.cmdline() if p.is_running() else [])]


@pytest.fixture(scope="module", autouse=True)
def no_orphans():
    yield
    assert wait_gone(tp_children(), 10) == [], "tensor-parallel workers outlived the tests"


# -- the embedded SmolLM2 (9 query heads, 3 KV heads): 2 ranks split 6+3 heads, 3 ranks 3+3+3, 4 ranks 3+2+2+2
#    (KV heads copied)

SMOL = dict(kv_cache_memory_bytes=32 << 20, max_model_len=512, dtype="float32")


@pytest.fixture(scope="module")
def smol_prompts(tokenizer):
    texts = ["The capital of France is", "Write a haiku about the sea.",
             "List three prime numbers and explain why each of them is prime, in one short sentence each:", "Hi"]
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False) for t in texts]
    return [tokenizer(c, add_special_tokens=False).input_ids for c in chats]   # 4 prompts of 30-50 tokens


@pytest.fixture(scope="module")
def smol_ref(smol_prompts):
    return greedy(LLMEngine.from_engine_args(EngineArgs(**SMOL)), smol_prompts, 16)


def test_tp2_matches_single_process(smol_prompts, smol_ref):
    engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **SMOL))
    runner = engine.engine_core.model_runner
    assert [c.shape[3] for c in runner.kv_caches[:1]] == [2]    # rank 0: 2 of the 3 KV heads (6 of 9 query heads)
    pids = runner.worker_pids
    assert len(pids) == 1 and alive(pids) == pids
    assert greedy(engine, smol_prompts, 16) == smol_ref
    runner.shutdown()
    assert alive(pids) == []                                    # shutdown() reaps the worker
    engine.add_request("x", "hi")
    with pytest.raises(RuntimeError, match="shut down"): engine.step()   # a step after shutdown: a clear error


def test_tp3_matches_single_process_and_gc_ends_workers(smol_prompts, smol_ref):
    engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=3, **SMOL))
    pids = engine.engine_core.model_runner.worker_pids
    assert len(pids) == 2 and alive(pids) == pids
    assert greedy(engine, smol_prompts, 16) == smol_ref
    del engine; gc.collect()                                    # garbage collection shuts the workers down
    assert wait_gone(pids) == []
    # the process group is gone with them: a new tensor-parallel engine can start in this process (next tests do)


def test_tp4_replicates_kv_heads_and_matches_single_process(smol_prompts, smol_ref):
    """4 ranks on 3 KV heads (vLLM replicates KV heads when the ranks outnumber them): query heads 3+2+2+2, rank 2
    holds KV heads 1 and 2, the others one each; greedy tokens equal one process's."""
    engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=4, **SMOL))
    runner = engine.engine_core.model_runner
    assert runner.plan.kv_index == [[0], [1], [1, 2], [2]] and runner.kv_caches[0].shape[3] == 1
    assert greedy(engine, smol_prompts, 16) == smol_ref
    pids = runner.worker_pids
    runner.shutdown()
    assert wait_gone(pids) == []


def test_impossible_split():
    with pytest.raises(ValueError, match="9 query heads"): EngineArgs(tensor_parallel_size=10).create_engine_config()


# -- a tiny random model for the lifecycle tests (cheap to load; 6 query heads in 3 KV groups)

@pytest.fixture(scope="module")
def tiny():
    from minivllm.core.model import make_tiny_checkpoint
    d = tempfile.mkdtemp()
    make_tiny_checkpoint(d, "llama", tokenizer_from=resolve_model(None), hidden_size=96, num_attention_heads=6,
                         num_key_value_heads=3, vocab_size=250, intermediate_size=96)
    args = dict(model=d, kv_cache_memory_bytes=1 << 22, max_model_len=128)
    prompts = [[5, 17, 99], list(range(30, 60)), [7] * 9]
    return args, prompts, greedy(LLMEngine.from_engine_args(EngineArgs(**args)), prompts, 8)


def test_dead_worker_is_a_clear_error(tiny):
    args, prompts, ref = tiny
    engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **args))
    [pid] = engine.engine_core.model_runner.worker_pids
    os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code -9"): greedy(engine, prompts, 8)
    assert time.monotonic() - t < 10                            # an error, not a hang until the timeout
    with pytest.raises(RuntimeError, match="shut down"): engine.engine_core.model_runner.execute_model(None)


def test_worker_startup_failure_shows_its_traceback(tiny, monkeypatch):
    args, _, _ = tiny
    monkeypatch.setenv("MINIVLLM_TP_THREADS", "many")           # int("many") fails inside the worker
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1.*invalid literal for int"):
        LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **args))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def test_rank_started_by_hand(tiny, monkeypatch):
    "The multi-machine recipe on one machine: rank 0 starts no worker, rank 1 is started with the documented command."
    args, prompts, ref = tiny
    port = free_port()
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MINIVLLM_TP_LOCAL_SIZE="1").items(): monkeypatch.setenv(k, v)
    env = dict(os.environ, WORLD_SIZE="2", RANK="1", LOCAL_RANK="0", MINIVLLM_TP_THREADS="1")
    env.pop("MINIVLLM_TP_LOCAL_SIZE")
    worker = subprocess.Popen([sys.executable, "-c", "from minivllm.parallel.tensor import worker_main; worker_main()"], env=env)
    try:
        engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **args))
        assert engine.engine_core.model_runner.worker_pids == []
        assert greedy(engine, prompts, 8) == ref
        engine.shutdown()
        assert worker.wait(timeout=15) == 0                     # the "remote" rank ends on rank 0's stop message
    finally:
        if worker.poll() is None: worker.kill(); worker.wait()


def test_workers_die_with_their_parent(tiny):
    "SIGKILL the engine's process (no atexit, no finalizers) after the engine started: its worker must not stay behind."
    args, _, _ = tiny
    code = textwrap.dedent(f"""
        import os, signal
        from minivllm.core.arg_utils import EngineArgs
        from minivllm.core.llm_engine import LLMEngine
        engine = LLMEngine.from_engine_args(EngineArgs(tensor_parallel_size=2, **{args!r}))
        print(*engine.engine_core.model_runner.worker_pids, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=240)
    assert p.returncode == -9
    pids = [int(x) for x in p.stdout.split()]
    assert len(pids) == 1 and wait_gone(pids, 10) == []


def test_parent_watch_without_any_connection():
    """The two guards of `die_with_parent` on their own (no socket that could close): a child that would sleep for
    a minute ends within seconds of its parent's death, with PR_SET_PDEATHSIG and with the parent-pid watch alone."""
    parent = textwrap.dedent("""
        import os, signal, subprocess, sys
        kids = []
        for sig in ("1", "0"):
            env = dict(os.environ, MINIVLLM_TP_PARENT_PID=str(os.getpid()), MINIVLLM_TP_PDEATHSIG=sig)
            kids.append(subprocess.Popen([sys.executable, "-c", "from minivllm.parallel.tensor import die_with_parent; "
                "die_with_parent(); print('ready', flush=True); import time; time.sleep(60)"], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True))
        for k in kids: assert k.stdout.readline().strip() == "ready"
        print(*[k.pid for k in kids], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, timeout=120)
    pids = [int(x) for x in p.stdout.split()]
    assert len(pids) == 2
    assert wait_gone(pids, 5) == []
