"End-to-end tests share one HF reference model and one tokenizer (the embedded SmolLM2, de-quantized once and cached)."
import contextlib, os, socket, subprocess, time

# Inductor compiles in a pool of worker processes (one per core by default); on 2 cores, starting that pool beside
# the other xdist worker costs more than it saves: one thread compiles a test's graphs in half the time.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
import pytest, torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Each pytest-xdist worker gets its share of the cores: torch's default (one thread per core in every worker)
# oversubscribes the machine, and on 2 cores with 2 workers that made the engine 5-20x slower.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_threads = max(1, (os.cpu_count() or 1) // _workers)
torch.set_num_threads(_threads)
os.environ.setdefault("OMP_NUM_THREADS", str(_threads))   # and the same for the processes tests start (nbdev_test, servers)


@pytest.fixture(scope="session")
def model_dir():
    from minivllm.core.model_files import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    "Greedy continuation by HF transformers' own `generate`, one prompt at a time (memoised)."
    cache = {}
    def run(prompt_ids, max_new_tokens):
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in cache:
            with torch.no_grad():
                out = hf_model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                                        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=2)
            cache[key] = out[0, len(prompt_ids):].tolist()
        return cache[key]
    return run


def hf_greedy_refs(hf, prompts, n: int) -> list[tuple[list[int], list[float]]]:
    "HF's greedy continuation of each prompt (token ids) and the logprob of each token it chose."
    refs = []
    for p in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=n, do_sample=False)
            lp = hf(out).logits[0].log_softmax(-1)
        toks = out[0, len(p):].tolist()
        refs.append((toks, [lp[len(p) - 1 + i, t].item() for i, t in enumerate(toks)]))
    return refs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, startup_timeout: float = 300):
    "A real `minivllm serve ARGS` process on a free loopback port: yields its base URL, stops it afterwards."
    import httpx
    port = free_port()
    proc = subprocess.Popen(["minivllm", "serve", "--port", str(port), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    base, deadline = f"http://127.0.0.1:{port}", time.time() + startup_timeout
    try:
        while True:
            if proc.poll() is not None: raise RuntimeError("server exited:\n" + proc.stdout.read())
            if time.time() > deadline: raise RuntimeError("server did not start")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200: break
            except httpx.HTTPError: time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try: proc.wait(timeout=30)
        except subprocess.TimeoutExpired: proc.kill()
