"""A stand-in for llama.cpp's `llama-server`, speaking the part of its protocol minivllm's benchmarks use, so that the
client code is tested without the binary: the same command line (`-m`, `--port`, `-np`, ...), `GET /health` (503 while
"loading", then 200), and `POST /completion` with token-id prompts, non-streamed and streamed (server-sent events: an
empty first chunk, one chunk per token, a final `stop: true` chunk with the counts), `n_probs` top log-probs, shaped
as the vendored llama.cpp's tools/server/server-task.cpp writes them. Its "model" is arithmetic: the token after
`ids` is `next_token(ids)`. It refuses (HTTP 400) a request without the fields the benchmarks must send."""
import argparse, json, math, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 49152
SHORT_PROMPT = 13          # a prompt starting with this id gets one token fewer than asked (tests the length check)


def next_token(ids): return (sum(ids) * 31 + len(ids)) % VOCAB


def top_logprobs(ids, k):
    "The k most likely next tokens of `ids` and their log-probs: `next_token(ids)` first."
    t = next_token(ids)
    return [{"id": (t + j) % VOCAB, "token": f"<{(t + j) % VOCAB}>", "bytes": [], "logprob": math.log(0.5 / 2 ** j)} for j in range(k)]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a): pass

    def _json(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)

    def do_GET(self):
        if self.path != "/health": return self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
        if time.monotonic() < self.server.ready_at: return self._json(503, {"error": {"code": 503, "message": "Loading model"}})
        self._json(200, {"status": "ok"})

    def do_POST(self):
        if self.path != "/completion": return self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, n = body.get("prompt"), body.get("n_predict")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and isinstance(n, int)
                and body.get("ignore_eos") is True and body.get("cache_prompt") is False and body.get("temperature") == 0):
            return self._json(400, {"error": {"code": 400, "message": f"stub: bad request {body}"}})
        k = body.get("n_probs", 0)
        if k and body.get("post_sampling_probs") is not False: return self._json(400, {"error": {"code": 400, "message": "stub: raw probs only"}})
        ids, out, probs = list(prompt), [], []
        for _ in range(n - (1 if prompt[:1] == [SHORT_PROMPT] else 0)):
            t = next_token(ids)
            if k: probs.append({"id": t, "token": f"<{t}>", "bytes": [], "logprob": math.log(0.5), "top_logprobs": top_logprobs(ids, k)})
            out.append(t); ids.append(t)
        final = {"index": 0, "content": "", "tokens": [], "stop": True, "tokens_predicted": len(out), "tokens_evaluated": len(prompt),
                 "stop_type": "limit", "timings": {"predicted_n": len(out)}}
        if not body.get("stream"):
            res = final | {"tokens": out if body.get("return_tokens") else []}
            if k: res["completion_probabilities"] = probs
            return self._json(200, res)
        self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
        send = lambda obj: (self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode()), self.wfile.flush())
        send({"index": 0, "content": "", "tokens": [], "stop": False})              # the "request started" chunk
        time.sleep(self.server.prefill_s)
        for t in out:
            send({"index": 0, "content": f"<{t}>", "tokens": [t], "stop": False, "tokens_predicted": 1, "tokens_evaluated": len(prompt)})
            time.sleep(self.server.token_s)
        send(final)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("-m", required=True); p.add_argument("--host", default="127.0.0.1"); p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-webui", action="store_true"); p.add_argument("-np", type=int, default=1); p.add_argument("-c", type=int, default=4096)
    p.add_argument("-t", type=int); p.add_argument("-tb", type=int); p.add_argument("--cache-ram", type=int)
    p.add_argument("--version", action="store_true")
    ns = p.parse_args(argv)
    srv = ThreadingHTTPServer((ns.host, ns.port), Handler)
    srv.ready_at, srv.prefill_s, srv.token_s = time.monotonic() + 0.5, 0.05, 0.002
    srv.serve_forever()


if __name__ == "__main__":
    import sys
    if "--version" in sys.argv: print("version: 0 (stub)"); sys.exit(0)
    main()
