"""The engine on the Triton backend (run by the Triton interpreter on the CPU, so in a subprocess with
TRITON_INTERPRET=1 set before Triton is imported) gives exactly the greedy tokens of the torch backend on a tiny
random Llama, with chunked prefill and prefix caching on."""
import json, os, subprocess, sys, textwrap

SCRIPT = textwrap.dedent('''
    import json, sys, tempfile, torch
    from minivllm.core.model_files import resolve_model
    from minivllm.core.model import make_tiny_checkpoint
    from minivllm import LLMEngine, EngineArgs, SamplingParams, TokensPrompt
    d = tempfile.mkdtemp()
    make_tiny_checkpoint(d, "llama", vocab_size=49152, hidden_size=64, num_attention_heads=4, num_key_value_heads=BACKEND_KV,
                         head_dim=16, max_position_embeddings=256, tokenizer_from=resolve_model(None))
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 49152, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 49152, (n,), generator=g).tolist() for n in (3, 25, 9)] + [torch.randint(0, 49152, (70,), generator=g).tolist()]
    res = {}
    for backend in ("torch", "triton"):
        eng = LLMEngine.from_engine_args(EngineArgs(model=d, attention_backend=backend, max_num_batched_tokens=32,
                                                    block_size=16, max_model_len=256, enable_prefix_caching=True))
        sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        eng.add_request("first", TokensPrompt(prompt_token_ids=prompts[0]), sp)
        out = {}
        while eng.has_unfinished_requests(): out.update({o.request_id: o for o in eng.step()})   # "first" fills the prefix cache
        for i, p in enumerate(prompts[1:]): eng.add_request(str(i), TokensPrompt(prompt_token_ids=p), sp)
        while eng.has_unfinished_requests(): out.update({o.request_id: o for o in eng.step()})
        res[backend] = dict(tokens={k: o.outputs[0].token_ids for k, o in out.items()},
                            cached={k: o.num_cached_tokens for k, o in out.items()})
    print(json.dumps(res))
''')


def run(num_kv_heads):
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT.replace("BACKEND_KV", str(num_kv_heads))], capture_output=True, text=True,
                       env=env, timeout=1500)
    assert r.returncode == 0, r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_triton_backend_matches_torch_backend_greedy():
    res = run(num_kv_heads=2)   # GQA 2:1
    assert res["triton"]["tokens"] == res["torch"]["tokens"]
    assert res["triton"]["cached"]["0"] >= 32 and res["triton"]["cached"]["1"] >= 32   # prefix-cache hits went through the kernel
    assert res["triton"]["cached"]["2"] == 0
