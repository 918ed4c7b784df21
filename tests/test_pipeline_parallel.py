"""Pipeline parallelism on gloo (CPU), through the whole engine: pipeline_parallel_size=2 (with 1, 2 and 3 micro-batches per
step) and tensor_parallel_size=2 × pipeline_parallel_size=2 (4 processes) give the same greedy tokens as one process on
a tiny random model; the refusals are clear errors; and two `torchrun` "nodes" on their own loopback addresses
(external_launcher) give the same tokens on every rank."""
import json, os, subprocess, sys, textwrap, time
import psutil, pytest
from minivllm.core.arg_utils import EngineArgs
from minivllm.core.config import SamplingParams, TokensPrompt
from minivllm.core.llm_engine import LLMEngine
from conftest import free_port

pytestmark = pytest.mark.xdist_group("tp")   # one xdist worker: these tests start processes of their own

PROMPTS = [[5, 17, 99, 1024], list(range(300, 340)), [7] * 11, [2000, 3, 41, 9, 18, 27, 1, 40000]]
ARGS = dict(dtype="float32", kv_cache_memory_bytes=4 << 20, max_model_len=256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_dir):
    "5 layers (stages of 3 + 2), 6 heads in 3 KV groups (TP ranks of 2 + 1 groups), tied embeddings, SmolLM2's tokenizer."
    from minivllm.core.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny_pp")
    make_tiny_checkpoint(d, "llama", seed=1, tokenizer_from=model_dir, vocab_size=49152, hidden_size=96,
                         num_attention_heads=6, num_key_value_heads=3, intermediate_size=192, num_hidden_layers=5,
                         tie_word_embeddings=True, initializer_range=0.2)
    return str(d)


def workers():
    "Processes under this one that run a tensor- or pipeline-parallel worker."
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "minivllm.parallel.tensor" in " ".join(p.cmdline() if p.is_running() else [])]


def greedy(engine, prompts, max_tokens=12):
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts): engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=p), sp)
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o.outputs[0].token_ids
    return [done[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def reference(tiny):
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny, **ARGS))
    try: return greedy(engine, PROMPTS)
    finally: engine.shutdown()


@pytest.mark.parametrize("tp,pp,mb", [(1, 2, 1), (1, 2, 2), (2, 2, 2), (1, 2, 3)])
def test_pipeline_matches_one_process(tiny, reference, tp, pp, mb):
    "PP=2 with one micro-batch (the stages take turns), two and three (they overlap), and TP=2 x PP=2 with two."
    from minivllm.parallel.pipeline import PPModelRunner
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                                   pipeline_micro_batches=mb, **ARGS))
    try:
        runner = engine.engine_core.model_runner
        assert isinstance(runner, PPModelRunner) and len(runner.worker_pids) == tp * pp - 1
        assert len(runner.kv_caches) == 3   # rank 0 holds stage 0's 3 layers
        assert runner.model.micro_batches == mb
        out = greedy(engine, PROMPTS)
    finally:
        engine.shutdown()
    assert out == reference
    assert len({tuple(t) for t in reference}) > 1   # the prompts do not all continue alike
    deadline = time.monotonic() + 15
    while workers() and time.monotonic() < deadline: time.sleep(0.1)
    assert workers() == []


@pytest.fixture(scope="module")
def tiny_head_named(tiny, tmp_path_factory):
    "The tiny tied model with its one embedding tensor stored as `lm_head.weight` (as the embedded model's copy)."
    import shutil
    from safetensors.torch import load_file, save_file
    d = tmp_path_factory.mktemp("tiny_pp_head")
    for f in os.listdir(tiny):
        if not f.endswith(".safetensors"): shutil.copy(os.path.join(tiny, f), d)
    w = load_file(os.path.join(tiny, "model.safetensors"))
    w["lm_head.weight"] = w.pop("model.embed_tokens.weight")
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    return str(d)


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)])
def test_tied_head_named_checkpoint(tiny_head_named, reference, tp, pp):
    "Tied embeddings stored under the LM head's name: the first stage's embedding and the last one's head load from it."
    one = LLMEngine.from_engine_args(EngineArgs(model=tiny_head_named, **ARGS))
    try: assert greedy(one, PROMPTS) == reference
    finally: one.shutdown()
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny_head_named, tensor_parallel_size=tp,
                                                   pipeline_parallel_size=pp, **ARGS))
    try: assert greedy(engine, PROMPTS) == reference
    finally: engine.shutdown()


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)])
def test_embedded_model(model_dir, tp, pp):
    "The embedded SmolLM2 (tied, 30 layers, 3 KV heads) under PP=2 and PP=2 x TP=2: the tokens of one process."
    prompts, args = PROMPTS[:2], dict(ARGS, kv_cache_memory_bytes=16 << 20)
    outs = []
    for kw in ({}, dict(tensor_parallel_size=tp, pipeline_parallel_size=pp)):
        engine = LLMEngine.from_engine_args(EngineArgs(model=model_dir, **kw, **args))
        try: outs.append(greedy(engine, prompts, max_tokens=6))
        finally: engine.shutdown()
    assert outs[0] == outs[1]


def test_refusals(tiny):
    with pytest.raises(ValueError, match="pipeline_parallel_size=6 is more stages than the model's 5 layers"):
        EngineArgs(model=tiny, pipeline_parallel_size=6, **ARGS).create_engine_config()
    with pytest.raises(ValueError, match="pipeline_parallel_size must be a positive integer"):
        EngineArgs(model=tiny, pipeline_parallel_size=0, **ARGS).create_engine_config()
    with pytest.raises(ValueError, match="pipeline_micro_batches must be a positive integer or None, got 0"):
        EngineArgs(model=tiny, pipeline_parallel_size=2, pipeline_micro_batches=0, **ARGS).create_engine_config()
    with pytest.raises(ValueError, match="pipeline_micro_batches must be a positive integer or None, got 1.5"):
        EngineArgs(model=tiny, pipeline_parallel_size=2, pipeline_micro_batches=1.5, **ARGS).create_engine_config()
    with pytest.raises(ValueError, match="pipeline_micro_batches=2 needs pipeline_parallel_size > 1"):
        EngineArgs(model=tiny, pipeline_micro_batches=2, **ARGS).create_engine_config()
    assert EngineArgs(model=tiny, pipeline_parallel_size=2, **ARGS).create_engine_config() \
        .parallel_config.pipeline_micro_batches == 2   # default: one per stage
    assert EngineArgs(model=tiny, pipeline_micro_batches=1, **ARGS).create_engine_config() \
        .parallel_config.pipeline_micro_batches == 1
    with pytest.raises(NotImplementedError, match="enable_lora with pipeline_parallel_size"):
        EngineArgs(model=tiny, pipeline_parallel_size=2, enable_lora=True, **ARGS).create_engine_config()
    with pytest.raises(NotImplementedError, match="distributed_executor_backend='ray'"):
        EngineArgs(model=tiny, distributed_executor_backend="ray", **ARGS).create_engine_config()
    with pytest.raises(RuntimeError, match="torchrun with WORLD_SIZE=4"):   # not under a launcher
        LLMEngine.from_engine_args(EngineArgs(model=tiny, tensor_parallel_size=2, pipeline_parallel_size=2,
                                              distributed_executor_backend="external_launcher", **ARGS))


SCRIPT = """
import json, os, sys
from minivllm import LLM, SamplingParams
from minivllm.core.config import TokensPrompt
llm = LLM(model=sys.argv[1], tensor_parallel_size=2, pipeline_parallel_size=2,
          distributed_executor_backend="external_launcher", **json.loads(sys.argv[3]))
prompts = [TokensPrompt(prompt_token_ids=p) for p in json.loads(sys.argv[4])]
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump([o.outputs[0].token_ids for o in outs], f)
"""


def test_two_torchrun_nodes(tiny, reference, tmp_path):
    "Two torchrun invocations, --nnodes 2, node 0 at 127.0.0.2 (the master) and node 1 at 127.0.0.3."
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    port = free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MINIVLLM_TP_TIMEOUT="120")
    nodes = [subprocess.Popen([torchrun, "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2",
                               "--master-addr", "127.0.0.2", "--master-port", str(port), "--local-addr", f"127.0.0.{2 + n}",
                               str(script), tiny, str(tmp_path), json.dumps(ARGS), json.dumps(PROMPTS)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for n in range(2)]
    try:
        logs = [p.communicate(timeout=400)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, 9); p.wait()
    def tail(log):  # C++ stack frames say nothing here: each node's last Python lines
        return "\n".join(ln for ln in log.splitlines() if "frame #" not in ln)[-3000:]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(f"--- node {n}:\n{tail(log)}" for n, log in enumerate(logs))
    for r in range(4):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == reference, r
