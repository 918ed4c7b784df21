"""Tool calling (lesson 06c) beyond the lesson's cells: streamed and finished readings agree on randomly built
replies cut at random places, and on a reply fed token by token through the real tokenizer, as the server
streams it; the rendered prompt of a round trip reads back through the parser."""

import json
import random

import pytest

from minivllm.features.tool_calling import (
    Hermes2ProToolParser,
    NamedToolParser,
    RequiredToolParser,
    ToolCallStream,
    plan_tools,
    render_chat,
    tool_message,
)

# Characters a scanner could trip on. Not "</tool_call>": in the Hermes format (here as in vLLM's regex) that tag
# ends the call wherever it stands, inside a JSON string too.
TRICKY = ["}", "{", '"', "\\", "<tool_call>", "é", "\n", ",", ":", "[", "]", " "]


def random_value(rng: random.Random, depth: int = 0):
    "A JSON value with nesting and strings full of the characters a scanner could trip on."
    kind = rng.choice(["str", "int", "float", "bool", "null"] + (["list", "obj"] if depth < 3 else []))
    if kind == "str":
        return "".join(rng.choice(TRICKY + list("abc xyz")) for _ in range(rng.randint(0, 8)))
    if kind == "int":
        return rng.randint(-1000, 1000)
    if kind == "float":
        return round(rng.uniform(-10, 10), 3)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def random_args(rng):
    return {f"a{i}": random_value(rng, 1) for i in range(rng.randint(0, 4))}


def dumps(obj, rng):
    "JSON text spaced one of the ways a model may space it."
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]),
                      indent=rng.choice([None, None, 2]))


def stream(parser, text: str, cuts: list[int]):
    "Feed `text` to `parser` cut at `cuts`, then finish; the content and the calls a client would assemble."
    deltas, prev = [], ""
    for k in cuts + [len(text)]:
        cur = text[:k]
        deltas.append(parser.extract_tool_calls_streaming(prev, cur, cur[len(prev):]))
        prev = cur
    deltas = [d for d in deltas + [parser.finish_streaming(text)] if d is not None]
    calls = {}
    for d in deltas:
        for t in d.tool_calls:
            c = calls.setdefault(t.index, [t.name, ""])
            assert t.id is None or c[0] == t.name  # the name comes once, with the id
            c[1] += t.arguments or ""
    return "".join(d.content or "" for d in deltas) or None, [tuple(c) for c in calls.values()]


def finished(parser, text):
    info = parser.extract_tool_calls(text)
    return info.content, [(c.function.name, c.function.arguments) for c in info.tool_calls]


@pytest.mark.parametrize("seed", range(60))
def test_stream_matches_finished_reading(seed):
    rng = random.Random(seed)
    calls = [{"name": f"fn_{i}", "arguments": random_args(rng)} for i in range(rng.randint(1, 3))]
    if rng.random() < 0.3:  # "arguments" written before "name"
        calls = [{"arguments": c["arguments"], "name": c["name"]} for c in calls]
    prefix = rng.choice(["", "\n", "Let me check that.\n", "a < b, and <tool"[: rng.randint(0, 16)] + " ok\n"])
    body = "\n".join(f"<tool_call>\n{dumps(c, rng)}\n</tool_call>" for c in calls)
    cases = [
        (Hermes2ProToolParser, prefix + body),
        (RequiredToolParser, dumps(calls, rng)),
        (lambda: NamedToolParser(name="f"), dumps(calls[0]["arguments"], rng)),
    ]
    for make, text in cases:
        want = finished(make(), text)
        assert want[1], text  # well-formed: calls found
        for (name, args), c in zip(want[1], calls):
            assert json.loads(args) == c["arguments"]
        for _ in range(5):
            cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
            assert stream(make(), text, cuts) == want, (text, cuts)


@pytest.mark.parametrize("seed", range(20))
def test_malformed_is_content_in_both_readings(seed):
    "JSON broken before the name is complete: the finished reading is text, and the stream says the same."
    rng = random.Random(seed)
    good = json.dumps({"name": "fn", "arguments": random_args(rng)})
    broken = good[: rng.randint(1, good.index('"fn"'))] + rng.choice(["", "}", "]", " oops"])
    text = "Sure.\n<tool_call>" + broken + "</tool_call>"
    want = finished(Hermes2ProToolParser(), text)
    assert want == (text, [])
    cuts = sorted(rng.sample(range(1, len(text)), 8))
    assert stream(Hermes2ProToolParser(), text, cuts) == want


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    from minivllm.core.model_files import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def test_stream_token_by_token_matches_message(tok):
    "The server's two paths, fed SmolLM2's tokens one at a time: the same content, calls and finish reason."
    reply = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo", '
             '"days": [1, 2]}}\n</tool_call>\n<tool_call>{"name": "set_timer", "arguments": {"minutes": 5}}'
             "</tool_call>")
    plan = plan_tools({"tools": [{"type": "function", "function": {"name": n}} for n in ("get_weather", "set_timer")]},
                      enable_auto_tool_choice=True, tool_call_parser="hermes")
    msg, why = tool_message(plan, reply, "stop")
    ids = tok(reply, add_special_tokens=False).input_ids
    st, chunks, text = ToolCallStream(plan), [], ""
    for k in range(len(ids)):  # incremental detokenization: each step adds the text of one more token
        new = tok.decode(ids[: k + 1])
        chunks.append(st.delta(new[len(text):]))
        text = new
    last, why_s = st.finish("stop")
    chunks = [c for c in chunks + [last] if c]
    content = "".join(c.get("content", "") for c in chunks)
    calls = {}
    for c in chunks:
        for t in c.get("tool_calls", []):
            d = calls.setdefault(t["index"], {"id": t.get("id"), "name": t["function"].get("name"), "arguments": ""})
            d["arguments"] += t["function"].get("arguments", "")
    assert (why, why_s) == ("tool_calls", "tool_calls")
    assert content == msg["content"] == "I will check.\n"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]]
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls.values())


def test_round_trip_prompt_reads_back(tok):
    "A conversation with a call and its result: the rendered assistant turn parses back to the same call."
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "chatcmpl-tool-1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    msgs = [{"role": "user", "content": "Oslo?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "-3 C"}]
    prompt = render_chat(tok, msgs, tools, add_generation_prompt=True)
    turn = prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    info = Hermes2ProToolParser().extract_tool_calls(turn)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert "<tool_response>\n-3 C\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")
