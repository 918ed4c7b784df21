"""Data parallelism behind the server: `minivllm serve --data-parallel-size 2` gives every request of a mixed workload
(completions and chats, streamed or not) the same greedy output as one engine through the `openai` client; both
engines are used (per-engine /metrics); killing one engine mid-load fails only its in-flight requests, with an error
naming it, and the server keeps serving: /health stays 200 and says "degraded" (each engine's state in its JSON
body, `X-Engines-Alive: 1/2`), /metrics says which engine died; when the last engine dies, /health answers 503 and
the server exits with status 1. Two "nodes" on loopback addresses: a front end at 127.0.0.2 with one engine and a
`--headless` node at 127.0.0.3 with the other give the same outputs, and the front end sees the remote engine die;
the other way round, a headless node whose front end is killed exits with status 1 within seconds (its engine says
why), and one whose front end shuts down (Ctrl-C) stops with status 0.
Offline `LLM(data_parallel_size=2)` is checked in nbs/14b_data_parallel.ipynb."""
import contextlib, os, re, signal, socket, subprocess, threading, time
import httpx, psutil, pytest, openai
from conftest import running_server

pytestmark = pytest.mark.xdist_group("tp")   # one xdist worker: these tests start processes of their own

ARGS = ("--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", str(8 << 20), "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_dir):
    from minivllm.core.model import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("tiny_dp")
    make_tiny_checkpoint(d, "llama", seed=1, tokenizer_from=model_dir, vocab_size=49152, hidden_size=96, num_attention_heads=6,
                         num_key_value_heads=3, intermediate_size=192, num_hidden_layers=3, tie_word_embeddings=True,
                         initializer_range=0.2)
    return str(d)


WORKLOAD = [("completion", "The capital of France is", 12, False), ("chat", "Write a haiku about the sea.", 16, True),
            ("completion", "1, 2, 3, 4,", 8, True), ("chat", "Hi", 10, False), ("completion", "def add(a, b):", 20, False),
            ("chat", "List three prime numbers.", 14, True), ("completion", "Once upon a time", 6, False),
            ("chat", "What is 2 + 2?", 12, False)]


def run_one(client, kind, text, max_tokens, stream):
    kw = dict(model="tiny", max_tokens=max_tokens, temperature=0)
    if kind == "completion":
        if not stream: return client.completions.create(prompt=text, **kw).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(prompt=text, stream=True, **kw))
    msgs = [{"role": "user", "content": text}]
    if not stream: return client.chat.completions.create(messages=msgs, **kw).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(messages=msgs, stream=True, **kw)
                   if c.choices)


def run_all(base, workload):
    "Every request of `workload` at once (one thread each): their texts, or the exception each raised."
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    out = [None] * len(workload)
    def go(i):
        try: out[i] = run_one(client, *workload[i])
        except Exception as e: out[i] = e
    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(workload))]
    for t in ts: t.start()
    for t in ts: t.join()
    return out


def metric(base, name, engine):
    m = re.search(rf'^{name}(_total)?{{engine="{engine}"}} ([0-9.e+-]+)$', httpx.get(base + "/metrics").text, re.M)
    return float(m.group(2))


def engine_pids():
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "minivllm.parallel.data" in " ".join(p.cmdline() if p.is_running() else [])]


@pytest.fixture(scope="module")
def reference(tiny):
    with running_server(tiny, *ARGS) as base:
        out = run_all(base, WORKLOAD)
    assert not any(isinstance(o, Exception) for o in out), out
    return out


def health(base):
    r = httpx.get(base + "/health", timeout=5)
    return r.status_code, r.headers.get("x-engines-alive"), r.json()


def server_process():
    "The `minivllm serve` process this test started (the parent of the engine processes)."
    return [p for p in psutil.Process().children() if "serve" in p.cmdline()][-1]


def test_dp2_equals_dp1_and_survives_a_dead_engine(tiny, reference, monkeypatch):
    # one thread per engine process: three processes with two OpenMP threads each on CI's two cores would make every
    # matrix product wait on the slowest thread (and slow the other xdist worker's tests to a crawl)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with running_server(tiny, *ARGS, "--data-parallel-size", "2") as base:
        code, alive, body = health(base)
        assert (code, alive, body["status"]) == (200, "2/2", "healthy"), body
        assert [(e["rank"], e["state"]) for e in body["engines"]] == [(0, "alive"), (1, "alive")]
        assert sorted(e["pid"] for e in body["engines"]) == sorted(engine_pids())   # the front end's pids are real
        assert run_all(base, WORKLOAD) == reference
        routed = [metric(base, "minivllm_dp_requests_routed", e) for e in (0, 1)]
        assert sum(routed) == 8 and min(routed) >= 2, routed   # both engines used
        # killing engine 1 mid-load: long requests on both engines, then SIGKILL engine 1 (its pid from /health)
        long = [("completion", "Count: 1, 2, 3,", 200, i % 2 == 0) for i in range(6)]
        res, t = [None], threading.Thread(target=lambda: res.__setitem__(0, run_all(base, long)))
        t.start()
        deadline = time.monotonic() + 120
        while metric(base, "minivllm_dp_num_requests_running", 1) < 1 and time.monotonic() < deadline: time.sleep(0.05)
        pids = {e["rank"]: e["pid"] for e in health(base)[2]["engines"]}
        os.kill(pids[1], signal.SIGKILL)
        t.join(300)
        errors = [o for o in res[0] if isinstance(o, Exception)]
        assert len(errors) == 3, res[0]   # engine 1's three requests, and only those
        assert all(f"data-parallel engine 1 (pid {pids[1]}) exited with code -9" in str(e) for e in errors), errors
        assert [len(o) > 0 for o in res[0] if not isinstance(o, Exception)] == [True] * 3
        # degraded: still 200 (the server takes requests), the body and the header say which engine is dead
        code, alive, body = health(base)
        assert (code, alive, body["status"], body["engines_alive"]) == (200, "1/2", "degraded", 1), body
        assert [(e["rank"], e["state"], e.get("reason")) for e in body["engines"]] == [
            (0, "alive", None), (1, "dead", "exited with code -9")], body
        assert metric(base, "minivllm_dp_engine_alive", 1) == 0 and metric(base, "minivllm_dp_engine_alive", 0) == 1
        # the dead engine's gauges read 0 (not its last report, a running request that has failed)
        assert [metric(base, f"minivllm_dp_{g}", 1) for g in ("num_requests_running", "kv_cache_usage_perc")] == [0, 0]
        assert run_all(base, WORKLOAD[:4]) == reference[:4]   # the server keeps serving, on engine 0
        # the last engine dies while nothing runs: /health says 503 at once, and the server exits with status 1
        server = server_process()
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (code := health(base)[0]) == 200 and time.monotonic() < deadline: time.sleep(0.05)
        code, alive, body = health(base)
        assert (code, alive, body["status"]) == (503, "0/2", "dead"), body
        assert [e["state"] for e in body["engines"]] == ["dead", "dead"]
        assert server.wait(timeout=30) == 1
    assert engine_pids() == []


@contextlib.contextmanager
def serve_at(host, *args):
    "`minivllm serve ARGS --host HOST` on a free port of HOST: yields (base URL, process); stops it afterwards."
    with socket.socket() as s:
        s.bind((host, 0)); port = s.getsockname()[1]
    proc = subprocess.Popen(["minivllm", "serve", "--host", host, "--port", str(port), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base, deadline = f"http://{host}:{port}", time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None: raise RuntimeError("server exited:\n" + proc.stdout.read())
            if time.monotonic() > deadline: raise RuntimeError("server did not start")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200: break
            except httpx.HTTPError: time.sleep(0.3)
        yield base, proc
    finally:
        proc.terminate()
        try: proc.wait(timeout=30)
        except subprocess.TimeoutExpired: proc.kill()


def test_dp_front_end_and_headless_node(tiny, reference, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with socket.socket() as s:   # the front end's RPC port (and the next two, for engines 0 and 1)
        s.bind(("127.0.0.2", 0)); rpc = s.getsockname()[1]
    dp = ("--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.2",
          "--data-parallel-rpc-port", str(rpc))
    node = subprocess.Popen(["minivllm", "serve", tiny, *ARGS, *dp, "--headless", "--host", "127.0.0.3",
                             "--data-parallel-start-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with serve_at("127.0.0.2", tiny, *ARGS, *dp) as (base, front):
            code, alive, body = health(base)
            assert (code, alive) == (200, "2/2"), body
            assert [(e["rank"], e["local"], e["state"]) for e in body["engines"]] == [(0, True, "alive"), (1, False, "alive")]
            remote = psutil.Process(body["engines"][1]["pid"])
            assert remote.parent().pid == node.pid   # engine 1 runs on the headless node ...
            conns = remote.net_connections("tcp")     # ... and reaches the front end from its own address
            assert {(c.laddr.ip, c.raddr.ip, c.raddr.port) for c in conns} == {("127.0.0.3", "127.0.0.2", rpc),
                                                                             ("127.0.0.3", "127.0.0.2", rpc + 2)}
            assert run_all(base, WORKLOAD) == reference
            routed = [metric(base, "minivllm_dp_requests_routed", e) for e in (0, 1)]
            assert sum(routed) == 8 and min(routed) >= 2, routed
            # the remote engine dies: no process of the front end's to poll, ZeroMQ's socket monitor tells it
            remote.kill()
            deadline = time.monotonic() + 10
            while health(base)[1] != "1/2" and time.monotonic() < deadline: time.sleep(0.05)
            code, alive, body = health(base)
            assert (code, alive, body["status"]) == (200, "1/2", "degraded"), body
            assert body["engines"][1]["reason"] == "lost its connection (its process or node is gone)", body
            assert run_all(base, WORKLOAD[:2]) == reference[:2]   # served by engine 0
            assert node.wait(timeout=30) == 1, node.stdout.read()   # the node's engine was killed
        assert front.returncode is not None
    finally:
        if node.poll() is None: node.kill()
        node.wait()


def headless_node(tiny):
    """A `--headless` node on 127.0.0.3 with engine 1 of 2, for a front end on 127.0.0.2: (its RPC port, the
    data-parallel flags the front end needs, the node's process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0)); rpc = s.getsockname()[1]
    dp = ("--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.2",
          "--data-parallel-rpc-port", str(rpc))
    node = subprocess.Popen(["minivllm", "serve", tiny, *ARGS, *dp, "--headless", "--host", "127.0.0.3",
                             "--data-parallel-start-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return rpc, dp, node


def test_headless_node_exits_when_its_front_end_dies(tiny, monkeypatch):
    """A `--headless` node whose front end is killed (`kill -9`: no `stop`) does not wait forever: its engine sees the
    dropped connection, says so, and exits with status 1; so does the node, within seconds."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rpc, dp, node = headless_node(tiny)
    try:
        with serve_at("127.0.0.2", tiny, *ARGS, *dp) as (base, front):
            code, alive, body = health(base)
            assert (code, alive) == (200, "2/2"), body
            remote = psutil.Process(body["engines"][1]["pid"])
            assert remote.parent().pid == node.pid
            front.kill(); front.wait()
            t0 = time.monotonic()
            rc = node.wait(timeout=60)
            elapsed = time.monotonic() - t0
        log = node.stdout.read()
        assert rc == 1, log
        assert elapsed < 15, (elapsed, log)
        assert f"data-parallel engine 1 (pid {remote.pid}): lost its connection to the front end at tcp://127.0.0.2:" \
               f"{rpc + 2}" in log, log
        assert "headless node: engine 1 exited with code 1" in log, log
        assert not remote.is_running()
    finally:
        if node.poll() is None: node.kill()
        node.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_headless_engine_stops_cleanly_with_its_front_end(tiny, monkeypatch, sig):
    """A front end that shuts down (Ctrl-C, or SIGTERM as a service manager sends it) sends `stop` before it closes:
    the headless node's engine stops, not "lost", and the node exits 0."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rpc, dp, node = headless_node(tiny)
    try:
        with serve_at("127.0.0.2", tiny, *ARGS, *dp) as (base, front):
            assert health(base)[:2] == (200, "2/2")
            front.send_signal(sig)   # the app's shutdown stops its engines (SIGTERM too)
            front.wait(timeout=60)
            assert "Traceback" not in front.stdout.read(), "the front end's Ctrl-C left a traceback"
            rc = node.wait(timeout=60)
        log = node.stdout.read()
        assert rc == 0 and "lost" not in log, log
    finally:
        if node.poll() is None: node.kill()
        node.wait()
