"""vLLM's own simplest example scripts, run against minivllm after changing only the imports and the model name.

The two texts below are vLLM's `examples/offline_inference/basic/basic.py` and
`examples/offline_inference/llm_engine_example.py` as vLLM ships them (Apache-2.0, (c) the vLLM contributors).
`port()` swaps `vllm` for `minivllm` in the import lines and the model name for `None` (minivllm's embedded
SmolLM2-135M-Instruct); the test checks that nothing else changed, runs each script as `__main__`, and checks what it
printed — the greedy request against HF transformers on the same weights."""
import argparse, difflib, sys, threading
import pytest, torch
from minivllm import EngineArgs, RequestOutput
from minivllm.serve import cli

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
         ("from vllm.utils.argparse_utils import FlexibleArgumentParser", "from minivllm.serve.cli import FlexibleArgumentParser"),
         ("from vllm.engine.arg_utils import AsyncEngineArgs", "from minivllm.serve.async_engine import AsyncEngineArgs"),
         ("from vllm.sampling_params import RequestOutputKind", "from minivllm.core.config import RequestOutputKind"),
         ("from vllm.v1.engine.async_llm import AsyncLLM", "from minivllm.serve.async_engine import AsyncLLM"),
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
    # In a fresh thread, as a script starts: an event loop that another test of this worker left running in the main
    # thread would make the script's own `asyncio.run` refuse to start.
    err = []
    def main():
        try: exec(compile(src, name, "exec"), {"__name__": "__main__", "print": record})
        except BaseException as e: err.append(e)
    t = threading.Thread(target=main); t.start(); t.join()
    if err: raise err[0]
    return printed


def test_only_imports_and_model_change():
    assert changed_lines(VLLM_BASIC, port(VLLM_BASIC)) == [
        "-from vllm import LLM, SamplingParams", "+from minivllm import LLM, SamplingParams",
        '-    llm = LLM(model="facebook/opt-125m")', "+    llm = LLM(model=None)"]
    assert changed_lines(VLLM_LLM_ENGINE_EXAMPLE, port(VLLM_LLM_ENGINE_EXAMPLE)) == [
        "-from vllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams",
        "-from vllm.utils.argparse_utils import FlexibleArgumentParser",
        "+from minivllm import EngineArgs, LLMEngine, RequestOutput, SamplingParams",
        "+from minivllm.serve.cli import FlexibleArgumentParser"]
    assert changed_lines(VLLM_ASYNC_LLM_STREAMING, port(VLLM_ASYNC_LLM_STREAMING)) == [
        "-from vllm import SamplingParams", "-from vllm.engine.arg_utils import AsyncEngineArgs",
        "-from vllm.sampling_params import RequestOutputKind", "-from vllm.v1.engine.async_llm import AsyncLLM",
        "+from minivllm import SamplingParams", "+from minivllm.serve.async_engine import AsyncEngineArgs",
        "+from minivllm.core.config import RequestOutputKind", "+from minivllm.serve.async_engine import AsyncLLM",
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
            try: printed = run_script(port(VLLM_LLM_ENGINE_EXAMPLE), "llm_engine_example.py", ["--max_model_len", "512", "--dtype", "float32"], mp)
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
    # underscores are rewritten in flag names only: values keep theirs, `=` or not
    ns = p.parse_args(["--tokenizer", "my_org/my_tok", "--served_model_name=a_b", "--max_num_seqs=4"])
    assert (ns.tokenizer, ns.served_model_name, ns.max_num_seqs) == ("my_org/my_tok", "a_b", 4)
    # what FlexibleArgumentParser adds: plain argparse refuses the underscore spelling vLLM's scripts use
    plain = EngineArgs.add_cli_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit):
        plain.parse_args(["--max_model_len", "512"])


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


# vLLM's examples/offline_inference/basic/generate.py (commit 10b62e38) and chat.py (commit 45c9ce4f), and
# examples/online_serving/openai_completion_client.py (commit c45614b5) and openai_chat_completion_client.py
# (commit 4d0f8e8e), as vLLM ships them (Apache-2.0, (c) the vLLM contributors).
VLLM_GENERATE = '''\\
# SPDX-License-Identifier: Apache-2.0

from vllm import LLM, EngineArgs
from vllm.utils import FlexibleArgumentParser


def main(args: dict):
    # Pop arguments not used by LLM
    max_tokens = args.pop("max_tokens")
    temperature = args.pop("temperature")
    top_p = args.pop("top_p")
    top_k = args.pop("top_k")

    # Create an LLM
    llm = LLM(**args)

    # Create a sampling params object
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k

    # Generate texts from the prompts. The output is a list of RequestOutput
    # objects that contain the prompt, generated text, and other information.
    prompts = [
        "Hello, my name is",
        "The president of the United States is",
        "The capital of France is",
        "The future of AI is",
    ]
    outputs = llm.generate(prompts, sampling_params)
    # Print the outputs.
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")


if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    # Add engine args
    engine_group = parser.add_argument_group("Engine arguments")
    EngineArgs.add_cli_args(engine_group)
    engine_group.set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")
    # Add sampling params
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    args: dict = vars(parser.parse_args())
    main(args)
'''

VLLM_CHAT = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from vllm import LLM, EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def create_parser():
    parser = FlexibleArgumentParser()
    # Add engine args
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")
    # Add sampling params
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    # Add example params
    parser.add_argument("--chat-template-path", type=str)

    return parser


def main(args: dict):
    # Pop arguments not used by LLM
    max_tokens = args.pop("max_tokens")
    temperature = args.pop("temperature")
    top_p = args.pop("top_p")
    top_k = args.pop("top_k")
    chat_template_path = args.pop("chat_template_path")

    # Create an LLM
    llm = LLM(**args)

    # Create sampling params object
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k

    def print_outputs(outputs):
        print("\\nGenerated Outputs:\\n" + "-" * 80)
        for output in outputs:
            prompt = output.prompt
            generated_text = output.outputs[0].text
            print(f"Prompt: {prompt!r}\\n")
            print(f"Generated text: {generated_text!r}")
            print("-" * 80)

    print("=" * 80)

    # In this script, we demonstrate how to pass input to the chat method:
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {
            "role": "user",
            "content": "Write an essay about the importance of higher education.",
        },
    ]
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
    print_outputs(outputs)

    # You can run batch inference with llm.chat API
    conversations = [conversation for _ in range(10)]

    # We turn on tqdm progress bar to verify it's indeed running batch inference
    outputs = llm.chat(conversations, sampling_params, use_tqdm=True)
    print_outputs(outputs)

    # A chat template can be optionally supplied.
    # If not, the model will use its default chat template.
    if chat_template_path is not None:
        with open(chat_template_path) as f:
            chat_template = f.read()

        outputs = llm.chat(
            conversations,
            sampling_params,
            use_tqdm=False,
            chat_template=chat_template,
        )
        print_outputs(outputs)


if __name__ == "__main__":
    parser = create_parser()
    args: dict = vars(parser.parse_args())
    main(args)
'''

VLLM_OPENAI_COMPLETION_CLIENT = '''\
# SPDX-License-Identifier: Apache-2.0

from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"


def main():
    client = OpenAI(
        # defaults to os.environ.get("OPENAI_API_KEY")
        api_key=openai_api_key,
        base_url=openai_api_base,
    )

    models = client.models.list()
    model = models.data[0].id

    # Completion API
    stream = False
    completion = client.completions.create(
        model=model,
        prompt="A robot may not injure a human being",
        echo=False,
        n=2,
        stream=stream,
        logprobs=3)

    print("-" * 50)
    print("Completion results:")
    if stream:
        for c in completion:
            print(c)
    else:
        print(completion)
    print("-" * 50)


if __name__ == "__main__":
    main()
'''

VLLM_OPENAI_CHAT_CLIENT = '''\
# SPDX-License-Identifier: Apache-2.0
"""Example Python client for OpenAI Chat Completion using vLLM API server
NOTE: start a supported chat completion model server with `vllm serve`, e.g.
    vllm serve meta-llama/Llama-2-7b-chat-hf
"""

import argparse

from openai import OpenAI

# Modify OpenAI's API key and API base to use vLLM's API server.
openai_api_key = "EMPTY"
openai_api_base = "http://localhost:8000/v1"

messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {
        "role": "assistant",
        "content": "The Los Angeles Dodgers won the World Series in 2020.",
    },
    {"role": "user", "content": "Where was it played?"},
]


def parse_args():
    parser = argparse.ArgumentParser(description="Client for vLLM API server")
    parser.add_argument(
        "--stream", action="store_true", help="Enable streaming response"
    )
    return parser.parse_args()


def main(args):
    client = OpenAI(
        # defaults to os.environ.get("OPENAI_API_KEY")
        api_key=openai_api_key,
        base_url=openai_api_base,
    )

    models = client.models.list()
    model = models.data[0].id

    # Chat Completion API
    chat_completion = client.chat.completions.create(
        messages=messages,
        model=model,
        stream=args.stream,
    )

    print("-" * 50)
    print("Chat completion results:")
    if args.stream:
        for c in chat_completion:
            print(c)
    else:
        print(chat_completion)
    print("-" * 50)


if __name__ == "__main__":
    args = parse_args()
    main(args)
'''


EDITS += [("from vllm.utils import FlexibleArgumentParser", "from minivllm.serve.cli import FlexibleArgumentParser"),
          ('set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")', "set_defaults(model=None)")]


def port_client(src: str, base_url: str) -> str:
    "An OpenAI client script pointed at the test server (its only edit: the API base, vLLM's http://localhost:8000/v1)."
    return src.replace('openai_api_base = "http://localhost:8000/v1"', f'openai_api_base = "{base_url}/v1"')


def test_more_examples_change_only_imports_and_model():
    assert changed_lines(VLLM_GENERATE, port(VLLM_GENERATE)) == [
        "-from vllm import LLM, EngineArgs", "-from vllm.utils import FlexibleArgumentParser",
        "+from minivllm import LLM, EngineArgs", "+from minivllm.serve.cli import FlexibleArgumentParser",
        '-    engine_group.set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")', "+    engine_group.set_defaults(model=None)"]
    assert changed_lines(VLLM_CHAT, port(VLLM_CHAT)) == [
        "-from vllm import LLM, EngineArgs", "-from vllm.utils.argparse_utils import FlexibleArgumentParser",
        "+from minivllm import LLM, EngineArgs", "+from minivllm.serve.cli import FlexibleArgumentParser",
        '-    parser.set_defaults(model="meta-llama/Llama-3.2-1B-Instruct")', "+    parser.set_defaults(model=None)"]
    for src in (VLLM_OPENAI_COMPLETION_CLIENT, VLLM_OPENAI_CHAT_CLIENT):
        assert changed_lines(src, port_client(src, "http://127.0.0.1:1")) == [
            '-openai_api_base = "http://localhost:8000/v1"', '+openai_api_base = "http://127.0.0.1:1/v1"']


def test_generate_example(monkeypatch, hf_greedy, tokenizer):
    "generate.py: every engine flag through `LLM(**vars(args))`, sampling from `get_default_sampling_params()`; greedy = HF."
    printed = run_script(port(VLLM_GENERATE), "generate.py", ["--max-model-len", "512", "--dtype", "float32", "--max-tokens", "8",
                                                                "--temperature", "0", "--trust-remote-code"], monkeypatch)
    lines = [l for l in printed if isinstance(l, str) and l.startswith("Prompt: ")]
    assert len(lines) == 4
    for l in lines:
        prompt, text = eval("(" + l[len("Prompt: "):].replace(", Generated text: ", ", ", 1) + ")")
        ids = tokenizer(prompt).input_ids
        assert text == tokenizer.decode(hf_greedy(ids, 8), skip_special_tokens=True)


def test_chat_example(monkeypatch, tmp_path):
    "chat.py: one conversation, then ten as a batch, then ten with a chat template read from a file."
    tpl = tmp_path / "template.jinja"
    tpl.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>")
    printed = run_script(port(VLLM_CHAT), "chat.py", ["--max-model-len", "1024", "--max-tokens", "4", "--temperature", "0",
                                                     "--chat-template-path", str(tpl)], monkeypatch)
    prompts = [eval(l[len("Prompt: "):]) for l in printed if isinstance(l, str) and l.startswith("Prompt: ")]
    texts = [eval(l[len("Generated text: "):]) for l in printed if isinstance(l, str) and l.startswith("Generated text: ")]
    assert len(prompts) == len(texts) == 21
    assert "<|im_start|>user\nHello<|im_end|>" in prompts[0] and len(set(prompts[:11])) == 1
    assert len(set(texts[:11])) == 1                                  # greedy: the batch gives the single answer
    assert prompts[11].startswith("<system>You are a helpful assistant\n<user>Hello") and prompts[11].endswith("<assistant>")


@pytest.fixture(scope="module")
def server():
    from conftest import running_server
    with running_server("--max-model-len", "1024") as base: yield base


def test_openai_completion_client_example(server, monkeypatch):
    printed = run_script(port_client(VLLM_OPENAI_COMPLETION_CLIENT, server), "openai_completion_client.py", [], monkeypatch)
    from openai.types import Completion
    c, = [x for x in printed if isinstance(x, Completion)]
    assert len(c.choices) == 2 and sorted(ch.index for ch in c.choices) == [0, 1]
    for ch in c.choices:
        assert ch.text and len(ch.logprobs.tokens) == len(ch.logprobs.top_logprobs) >= 1
        assert all(1 <= len(t) <= 4 for t in ch.logprobs.top_logprobs)   # the sampled token and the top 3
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens <= 32


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_client_example(server, monkeypatch, stream):
    printed = run_script(port_client(VLLM_OPENAI_CHAT_CLIENT, server), "openai_chat_completion_client.py",
                         ["--stream"] if stream else [], monkeypatch)
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    if stream:
        chunks = [x for x in printed if isinstance(x, ChatCompletionChunk)]
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks).strip()
    else:
        c, = [x for x in printed if isinstance(x, ChatCompletion)]
        assert c.choices[0].message.role == "assistant" and c.choices[0].message.content.strip()
