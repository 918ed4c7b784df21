"""Tool calling through a real `minivllm serve --enable-auto-tool-choice --tool-call-parser hermes`, driven by the
official `openai` client: required and named calls (streamed and not) that validate against the tool's parameters,
"auto" whose reply is either well-formed calls or text, a round trip with a tool result, and vLLM's 400s."""
import json

import jsonschema, pytest
import openai
from conftest import running_server


pytestmark = pytest.mark.xdist_group("tool_calling_server")   # its own servers: any worker

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIMER = {"type": "function", "function": {
    "name": "set_timer", "description": "Start a timer",
    "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}},
                   "required": ["minutes"]}}}
TOOLS = [WEATHER, TIMER]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAME = "smol"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    # float32: the streamed twin of a request hits the prefix cache its first run left, and in bfloat16 (the default on
    # CPUs with AVX512-BF16) a cache hit rounds differently from a full prefill, so greedy texts could part
    with running_server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "1024",
                        "--served-model-name", NAME, "--dtype", "float32") as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)


def check_calls(calls):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


def assemble(stream):
    "The content, calls (id, name, arguments) and finish reason a client builds from a streamed chat."
    content, calls, finish = "", {}, None
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            c = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
            if t.id:
                c["id"], c["name"] = t.id, t.function.name
            c["arguments"] += t.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_required_call_validates(client):
    for temperature, seed in ((0, None), (0.8, 1), (0.8, 2)):
        r = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=96, temperature=temperature, seed=seed)
        check_calls(r.choices[0].message.tool_calls)
        assert r.choices[0].finish_reason == "tool_calls"


def test_named_call_streamed_equals_not(client):
    kw = dict(model=NAME, messages=ASK, tools=TOOLS, max_tokens=96, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = client.chat.completions.create(**kw)
    (call,) = r.choices[0].message.tool_calls
    check_calls([call])
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "stop"
    content, calls, finish = assemble(client.chat.completions.create(**kw, stream=True))
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]
    assert finish == "stop" and not content


def test_auto_is_calls_or_text(client):
    "The model decides: either well-formed calls (finish_reason tool_calls) or plain text, the same streamed."
    for messages in (ASK, [{"role": "user", "content": "Tell me a joke."}]):
        kw = dict(model=NAME, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=40, temperature=0)
        m = client.chat.completions.create(**kw).choices[0]
        if m.message.tool_calls:
            check_calls(m.message.tool_calls)
            assert m.finish_reason == "tool_calls"
        else:
            assert m.message.content is not None and m.finish_reason in ("stop", "length")
        content, calls, _ = assemble(client.chat.completions.create(**kw, stream=True))
        assert (content or None) == (m.message.content or None)
        assert [(c["name"], c["arguments"]) for c in calls] == [
            (t.function.name, t.function.arguments) for t in m.message.tool_calls or []]


def test_round_trip_with_tool_result(client):
    r = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=96, temperature=0)
    msg = r.choices[0].message
    follow = ASK + [msg.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 celsius, sunny"}]
    r2 = client.chat.completions.create(model=NAME, messages=follow, tools=TOOLS, tool_choice="none",
                                        max_tokens=24, temperature=0)
    assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls


def test_errors_are_vllms_400s(client):
    with pytest.raises(openai.BadRequestError, match="does not match any of the specified"):
        client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="`tools` must be set"):
        client.chat.completions.create(model=NAME, messages=ASK, tool_choice="required", max_tokens=4)


def test_auto_without_the_flag_is_a_400():
    with running_server("--max-model-len", "512", "--served-model-name", NAME) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)
        with pytest.raises(openai.BadRequestError, match='"auto" tool choice requires --enable-auto-tool-choice'):
            c.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, max_tokens=4)
