"""vLLM's own simplest example scripts, run against minivllm after changing only the imports and the model name.

The two texts below are vLLM's `examples/offline_inference/basic/basic.py` and
`examples/offline_inference/llm_engine_example.py` as vLLM ships them (Apache-2.0, (c) the vLLM contributors).
`port()` swaps `vllm` for `minivllm` in the import lines and the model name for `None` (minivllm's embedded
SmolLM2-135M-Instruct); the test checks that nothing else changed, runs each script as `__main__`, and checks what it
printed — the greedy request against HF transformers on the same weights."""
import argparse, difflib, sys
import pytest, torch
from minivllm import EngineArgs, RequestOutput
from minivllm import cli

pytestmark = pytest.mark.xdist_group("vllm_examples")

VLLM_BASIC = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from vllm import LLM, SamplingParams

# Sample prompts.
prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
# Create a sampling params object.
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    # Create an LLM.
    llm = LLM(model="facebook/opt-125m")
    # Generate texts from the prompts.
    # The output is a list of RequestOutput objects
    # that contain the prompt, generated text, and other information.
    outputs = llm.generate(prompts, sampling_params)
    # Print the outputs.
    print("\\nGenerated Outputs:\\n" + "-" * 60)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt:    {prompt!r}")
        print(f"Output:    {generated_text!r}")
        print("-" * 60)


if __name__ == "__main__":
    main()
'''

VLLM_LLM_ENGINE_EXAMPLE = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""
This file demonstrates using the `LLMEngine`
for processing prompts with various sampling parameters.
"""

import argparse

from vllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from vllm.utils.argparse_utils import FlexibleArgumentParser


def create_test_prompts() -> list[tuple[str, SamplingParams]]:
    """Create a list of test prompts with their sampling parameters."""
    return [
        (
            "A robot may not injure a human being",
            SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1),
        ),
        (
            "To be or not to be,",
            SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2),
        ),
        (
            "What is the meaning of life?",
            SamplingParams(n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.1),
        ),
    ]


def process_requests(engine: LLMEngine, test_prompts: list[tuple[str, SamplingParams]]):
    """Continuously process a list of prompts and handle the outputs."""
    request_id = 0

    print("-" * 50)
    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1

        request_outputs: list[RequestOutput] = engine.step()

        for request_output in request_outputs:
            if request_output.finished:
                print(request_output)
                print("-" * 50)


def initialize_engine(args: argparse.Namespace) -> LLMEngine:
    """Initialize the LLMEngine from the command line arguments."""
    engine_args = EngineArgs.from_cli_args(args)
    return LLMEngine.from_engine_args(engine_args)


def parse_args():
    parser = FlexibleArgumentParser(
        description="Demo on using the LLMEngine class directly"
    )
    parser = EngineArgs.add_cli_args(parser)
    return parser.parse_args()


def main(args: argparse.Namespace):
    """Main function that sets up and runs the prompt processing."""
    engine = initialize_engine(args)
    test_prompts = create_test_prompts()
    process_requests(engine, test_prompts)


if __name__ == "__main__":
    args = parse_args()
    main(args)
'''

VLLM_ASYNC_LLM_STREAMING = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
\"\"\"
Simple example demonstrating streaming offline inference with AsyncLLM (V1 engine).

This script shows the core functionality of vLLM's AsyncLLM engine for streaming
token-by-token output in offline inference scenarios. It demonstrates DELTA mode
streaming where you receive new tokens as they are generated.

Usage:
    python examples/offline_inference/async_llm_streaming.py
\"\"\"

import asyncio

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM


async def stream_response(engine: AsyncLLM, prompt: str, request_id: str) -> None:
    \"\"\"
    Stream response from AsyncLLM and display tokens as they arrive.

    This function demonstrates the core streaming pattern:
    1. Create SamplingParams with DELTA output kind
    2. Call engine.generate() and iterate over the async generator
    3. Print new tokens as they arrive
    4. Handle the finished flag to know when generation is complete
    \"\"\"
    print(f"\\n🚀 Prompt: {prompt!r}")
    print("💬 Response: ", end="", flush=True)

    # Configure sampling parameters for streaming
    sampling_params = SamplingParams(
        max_tokens=100,
        temperature=0.8,
        top_p=0.95,
        seed=42,  # For reproducible results
        output_kind=RequestOutputKind.DELTA,  # Get only new tokens each iteration
    )

    try:
        # Stream tokens from AsyncLLM
        async for output in engine.generate(
            request_id=request_id, prompt=prompt, sampling_params=sampling_params
        ):
            # Process each completion in the output
            for completion in output.outputs:
                # In DELTA mode, we get only new tokens generated since last iteration
                new_text = completion.text
                if new_text:
                    print(new_text, end="", flush=True)

            # Check if generation is finished
            if output.finished:
                print("\\n✅ Generation complete!")
                break

    except Exception as e:
        print(f"\\n❌ Error during streaming: {e}")
        raise


async def main():
    print("🔧 Initializing AsyncLLM...")

    # Create AsyncLLM engine with simple configuration
    engine_args = AsyncEngineArgs(
        model="meta-llama/Llama-3.2-1B-Instruct",
        enforce_eager=True,  # Faster startup for examples
    )
    engine = AsyncLLM.from_engine_args(engine_args)

    try:
        # Example prompts to demonstrate streaming
        prompts = [
            "The future of artificial intelligence is",
            "In a galaxy far, far away",
            "The key to happiness is",
        ]

        print(f"🎯 Running {len(prompts)} streaming examples...")

        # Process each prompt
        for i, prompt in enumerate(prompts, 1):
            print(f"\\n{'=' * 60}")
            print(f"Example {i}/{len(prompts)}")
            print(f"{'=' * 60}")

            request_id = f"stream-example-{i}"
            await stream_response(engine, prompt, request_id)

            # Brief pause between examples
            if i < len(prompts):
                await asyncio.sleep(0.5)

        print("\\n🎉 All streaming examples completed!")

    finally:
        # Always clean up the engine
        print("🔧 Shutting down engine...")
        engine.shutdown()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("\\n🛑 Interrupted by user")
'''



# the only edits: the imports, and the model name (None: minivllm's embedded model)
EDITS = [("from vllm import ", "from minivllm import "),
         ("from vllm.utils.argparse_utils import FlexibleArgumentParser", "from minivllm.cli import FlexibleArgumentParser"),
         ("from vllm.engine.arg_utils import AsyncEngineArgs", "from minivllm.async_engine import AsyncEngineArgs"),
         ("from vllm.sampling_params import RequestOutputKind", "from minivllm.config import RequestOutputKind"),
         ("from vllm.v1.engine.async_llm import AsyncLLM", "from minivllm.async_engine import AsyncLLM"),
         ('LLM(model="facebook/opt-125m")', "LLM(model=None)"),
         ('model="meta-llama/Llama-3.2-1B-Instruct",', "model=None,")]


def port(src: str) -> str:
    for a, b in EDITS: src = src.replace(a, b)
    return src


def changed_lines(a: str, b: str) -> list[str]:
    return [l for l in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def run_script(src: str, name: str, argv: list[str], monkeypatch) -> list:
    "Run `src` as `__main__` in this process; return the objects it printed (they are printed too)."
    printed = []
    def record(*args, **kw):
        printed.extend(args)
        print(*args, **kw)
    monkeypatch.setattr(sys, "argv", [name] + argv)
    exec(compile(src, name, "exec"), {"__name__": "__main__", "print": record})
    return printed


def test_only_imports_and_model_change():
    assert changed_lines(VLLM_BASIC, port(VLLM_BASIC)) == [
        "-from vllm import LLM, SamplingParams", "+from minivllm import LLM, SamplingParams",
        '-    llm = LLM(model="facebook/opt-125m")', "+    llm = LLM(model=None)"]
    assert changed_lines(VLLM_LLM_ENGINE_EXAMPLE, port(VLLM_LLM_ENGINE_EXAMPLE)) == [
        "-from vllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams",
        "-from vllm.utils.argparse_utils import FlexibleArgumentParser",
        "+from minivllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams",
        "+from minivllm.cli import FlexibleArgumentParser"]
    assert changed_lines(VLLM_ASYNC_LLM_STREAMING, port(VLLM_ASYNC_LLM_STREAMING)) == [
        "-from vllm import SamplingParams", "-from vllm.engine.arg_utils import AsyncEngineArgs",
        "-from vllm.sampling_params import RequestOutputKind", "-from vllm.v1.engine.async_llm import AsyncLLM",
        "+from minivllm import SamplingParams", "+from minivllm.async_engine import AsyncEngineArgs",
        "+from minivllm.config import RequestOutputKind", "+from minivllm.async_engine import AsyncLLM",
        '-        model="meta-llama/Llama-3.2-1B-Instruct",', "+        model=None,"]


def test_basic_example(monkeypatch, tokenizer):
    printed = run_script(port(VLLM_BASIC), "basic.py", [], monkeypatch)
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is", "The future of AI is"]
    lines = [l for l in printed if isinstance(l, str) and l.startswith(("Prompt:", "Output:"))]
    assert [l for l in lines if l.startswith("Prompt:")] == [f"Prompt:    {p!r}" for p in prompts]
    outs = [eval(l[len("Output:"):].strip()) for l in lines if l.startswith("Output:")]
    assert len(outs) == 4 and all(isinstance(o, str) and o for o in outs)
    assert all(len(tokenizer(o, add_special_tokens=False).input_ids) <= 17 for o in outs)   # vLLM's default max_tokens=16


@pytest.fixture(scope="module")
def engine_example():
    "Run llm_engine_example.py once (on first use, inside a test); its finished RequestOutputs by request id."
    cache = {}
    def get():
        if not cache:
            mp = pytest.MonkeyPatch()
            try: printed = run_script(port(VLLM_LLM_ENGINE_EXAMPLE), "llm_engine_example.py", ["--max_model_len", "512"], mp)
            finally: mp.undo()
            cache.update({o.request_id: o for o in printed if isinstance(o, RequestOutput)})
        return cache
    return get


def test_llm_engine_example(engine_example, tokenizer, hf_greedy):
    outs = engine_example()
    assert sorted(outs) == ["0", "1", "2"] and all(o.finished for o in outs.values())
    assert [o.prompt for o in (outs["0"], outs["1"], outs["2"])] == [
        "A robot may not injure a human being", "To be or not to be,", "What is the meaning of life?"]
    # request 0 is greedy: HF transformers gives the same 16 tokens (vLLM's default max_tokens) on the same weights
    o0 = outs["0"].outputs[0]
    assert o0.token_ids == hf_greedy(outs["0"].prompt_token_ids, 16)[:len(o0.token_ids)] and len(o0.token_ids) in range(1, 17)
    assert o0.text == tokenizer.decode(o0.token_ids, skip_special_tokens=True)
    # request 1: one sampled sequence (top_k=5, presence penalty); request 2: n=2 sequences, indexed 0 and 1
    assert len(outs["1"].outputs) == 1 and 1 <= len(outs["1"].outputs[0].token_ids) <= 16
    assert [c.index for c in outs["2"].outputs] == [0, 1] and all(1 <= len(c.token_ids) <= 16 for c in outs["2"].outputs)
    for o in outs.values():
        for c in o.outputs: assert c.finish_reason in ("length", "stop")


def test_llm_engine_example_logprobs(engine_example, hf_model):
    "Request 0 asks for logprobs=1 and prompt_logprobs=1: the values are HF's log-softmax at the same positions."
    o = engine_example()["0"]
    c = o.outputs[0]
    ids = o.prompt_token_ids + c.token_ids
    with torch.no_grad(): lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), -1)
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    for k, (t, d) in enumerate(zip(c.token_ids, c.logprobs)):
        pos = len(o.prompt_token_ids) + k - 1
        assert t in d and abs(d[t].logprob - lp[pos, t].item()) < 1e-3 and d[t].rank == 1   # greedy: the top token
        assert len(d) <= 2                                                                  # the sampled token + top-1
    assert o.prompt_logprobs is not None and len(o.prompt_logprobs) == len(o.prompt_token_ids) and o.prompt_logprobs[0] is None
    for k, (t, d) in enumerate(zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:])):
        assert t in d and abs(d[t].logprob - lp[k, t].item()) < 1e-3


def test_flexible_argument_parser_and_cli_args():
    "What the example relies on: `--max_model_len` = `--max-model-len`; from_cli_args(add_cli_args(...)) round-trips."
    p = EngineArgs.add_cli_args(cli.FlexibleArgumentParser(description="x"))
    a = EngineArgs.from_cli_args(p.parse_args(["--max_model_len", "512", "--block-size=32", "--no-enable-prefix-caching",
                                               "--scheduling_policy=priority"]))
    assert a == EngineArgs(max_model_len=512, block_size=32, enable_prefix_caching=False, scheduling_policy="priority")
    assert EngineArgs.from_cli_args(p.parse_args([])) == EngineArgs()
    assert isinstance(p, argparse.ArgumentParser)


def test_async_llm_streaming_example(monkeypatch):
    "AsyncLLM streaming with deltas: each streamed response is the sync engine's text for the same seeded params."
    printed = run_script(port(VLLM_ASYNC_LLM_STREAMING), "async_llm_streaming.py", [], monkeypatch)
    text = "".join(x if isinstance(x, str) else "" for x in printed)
    assert "All streaming examples completed!" in text and "Error during streaming" not in text
    responses = [r.split("\n✅ Generation complete!")[0] for r in text.split("💬 Response: ")[1:]]
    assert len(responses) == 3 and all(responses)
    # the first one, again, with the sync engine: a seeded request gives the same text
    from minivllm import LLMEngine, SamplingParams
    e = LLMEngine.from_engine_args(EngineArgs(enforce_eager=True))
    e.add_request("r", "The future of artificial intelligence is", SamplingParams(max_tokens=100, temperature=0.8, top_p=0.95, seed=42))
    out = None
    while e.has_unfinished_requests(): out = next((o for o in e.step() if o.finished), out)
    assert responses[0] == out.outputs[0].text
