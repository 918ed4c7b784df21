"""The Responses API, `/tokenize` and `/detokenize` on a real `minivllm serve --enable-auto-tool-choice --tool-call-parser
hermes`, driven by the official `openai` client: `client.responses.create` plain (equal to `LLM.chat` on the same
messages), streamed (the typed events add up to the same reply), with function tools (calls that validate against the
tool's parameters, streamed and not), `text.format` (a JSON schema the reply follows; `responses.parse`), `reasoning`
(accepted: it changes nothing for SmolLM2), `previous_response_id` (the stored conversation continued, as `LLM.chat` on the
whole of it), a tool result fed back, an unknown id (404); the store's bound, in process."""
import json

import httpx, jsonschema, openai, pytest
from conftest import running_server

pytestmark = pytest.mark.xdist_group("responses")   # its own server: any worker

NAME = "smol"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                          "required": ["city", "unit"]}}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server():
    with running_server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "1024",
                        "--served-model-name", NAME) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def llm():
    from minivllm import LLM
    return LLM(max_model_len=1024)


def greedy_chat(llm, messages, max_tokens):
    from minivllm import SamplingParams
    return llm.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)[0].outputs[0].text


def test_plain_equals_llm_chat(client, llm):
    r = client.responses.create(model=NAME, input="Name three colors.", instructions="Answer briefly.",
                                max_output_tokens=12, temperature=0)
    want = greedy_chat(llm, [{"role": "system", "content": "Answer briefly."},
                             {"role": "user", "content": "Name three colors."}], 12)
    assert r.object == "response" and r.model == NAME and r.output_text == want
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.output_tokens <= 12 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if r.usage.output_tokens == 12 else "completed")
    # the same as a list of messages (text parts included)
    r2 = client.responses.create(model=NAME, instructions="Answer briefly.", max_output_tokens=12, temperature=0,
                                 input=[{"role": "user", "content": [{"type": "input_text", "text": "Name three colors."}]}])
    assert r2.output_text == want and client.responses.retrieve(r2.id).output_text == want


def test_streamed_events_add_up(client):
    kw = dict(model=NAME, input="Say hello in French.", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == f"response.{whole.status}" and "response.output_text.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert text == done.text == whole.output_text == events[-1].response.output_text


def check_call(item):
    assert item.type == "function_call" and item.name == "get_weather" and item.call_id
    jsonschema.validate(json.loads(item.arguments), WEATHER["parameters"])


def test_tools_required_and_named_streamed_and_not(client):
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        kw = dict(model=NAME, input=ASK, tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False,
                  max_output_tokens=48, temperature=0)
        r = client.responses.create(**kw)
        (call,) = [o for o in r.output if o.type == "function_call"]
        check_call(call)
        events = list(client.responses.create(**kw, stream=True))
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert args == done.arguments == call.arguments and done.name == call.name
        assert [o.type for o in events[-1].response.output] == [o.type for o in r.output]
    for seed in (1, 2):  # sampled: still a call that validates
        r = client.responses.create(model=NAME, input=ASK, tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=48, temperature=0.8,
                                    extra_body={"seed": seed})
        check_call(next(o for o in r.output if o.type == "function_call"))


def test_auto_is_calls_or_text(client):
    for text in (ASK, "Tell me a joke."):
        r = client.responses.create(model=NAME, input=text, tools=[WEATHER], max_output_tokens=24, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        for c in calls:
            check_call(c)
        assert calls or r.output_text


def test_previous_response_id_continues_the_conversation(client, llm):
    first = client.responses.create(model=NAME, input="My name is Ada.", instructions="Be brief.",
                                    max_output_tokens=8, temperature=0)
    second = client.responses.create(model=NAME, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    # instructions are not carried over (OpenAI's rule); the stored turns are
    want = greedy_chat(llm, [{"role": "user", "content": "My name is Ada."},
                             {"role": "assistant", "content": first.output_text},
                             {"role": "user", "content": "What is my name?"}], 8)
    assert second.output_text == want and second.previous_response_id == first.id
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model=NAME, input="Hi", previous_response_id="resp_unknown", max_output_tokens=2)


def test_round_trip_with_a_tool_result(client):
    r = client.responses.create(model=NAME, input=ASK, tools=[WEATHER], tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=48, temperature=0)
    call = next(o for o in r.output if o.type == "function_call")
    back = [{"type": "function_call_output", "call_id": call.call_id, "output": "18 celsius, sunny"}]
    r2 = client.responses.create(model=NAME, input=back, previous_response_id=r.id, tools=[WEATHER],
                                 tool_choice="none", max_output_tokens=16, temperature=0)
    assert r2.output_text and not [o for o in r2.output if o.type == "function_call"]
    # the same conversation sent whole, without the store
    whole = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True, include={"type", "call_id", "name", "arguments"})] + back
    r3 = client.responses.create(model=NAME, input=whole, tools=[WEATHER], tool_choice="none", max_output_tokens=16,
                                 temperature=0, store=False)
    assert r3.output_text == r2.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r3.id)


def test_text_format_json_schema_and_parse(client):
    "`text.format` constrains the reply to the schema, greedy and sampled; `responses.parse` reads it into a model."
    from pydantic import BaseModel
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                             "country": {"type": "string", "maxLength": 12}},
            "required": ["city", "country"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "place", "schema": city, "strict": True}
    for temperature, seed in ((0, None), (1.0, 1)):
        r = client.responses.create(model=NAME, input="Name a famous city.", text={"format": fmt}, max_output_tokens=48,
                                    temperature=temperature, extra_body={"seed": seed})
        jsonschema.validate(json.loads(r.output_text), city)
        assert r.status == "completed" and r.text.format.type == "json_schema" and r.text.format.name == "place"
    r = client.responses.create(model=NAME, input="Reply with a JSON object.", text={"format": {"type": "json_object"}},
                                max_output_tokens=32, temperature=0)
    assert r.status == "incomplete" or isinstance(json.loads(r.output_text), dict)

    class Place(BaseModel):
        city: str
        country: str

    p = client.responses.parse(model=NAME, input="Name a famous city and its country.", text_format=Place,
                               max_output_tokens=64, temperature=0)
    assert isinstance(p.output_parsed, Place) and p.output_parsed.city


def test_reasoning_changes_nothing_for_a_model_without_it(client):
    "SmolLM2's chat template knows no reasoning: `reasoning` is accepted and the greedy reply is the one without it."
    kw = dict(model=NAME, input="Name three colors.", max_output_tokens=12, temperature=0)
    plain = client.responses.create(**kw)
    for reasoning in ({"effort": "low"}, {"effort": "high", "summary": "auto"}):
        r = client.responses.create(**kw, reasoning=reasoning)
        assert r.output_text == plain.output_text and r.reasoning.effort == reasoning["effort"]
    assert client.responses.create(**kw, text={"verbosity": "medium"}).output_text == plain.output_text


def test_bad_requests_are_clear_400s(client):
    with pytest.raises(openai.BadRequestError, match="text.verbosity") as e:
        client.responses.create(model=NAME, input="Hi", text={"verbosity": "low"})
    assert e.value.body["param"] == "text.verbosity"
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: reasoning.tokens"):
        client.responses.create(model=NAME, input="Hi", reasoning={"effort": "low", "tokens": 100})
    with pytest.raises(openai.BadRequestError, match="needs a name and a schema") as e:
        client.responses.create(model=NAME, input="Hi", text={"format": {"type": "json_schema", "name": "x"}})
    assert e.value.body["param"] == "text.format"
    with pytest.raises(openai.BadRequestError, match="Only function tools"):
        client.responses.create(model=NAME, input="Hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.responses.create(model=NAME, input=[{"type": "image_generation_call", "id": "x"}])


def test_tokenize_and_detokenize(server, client, llm):
    tok = llm.get_tokenizer()
    t = httpx.post(server + "/tokenize", json={"prompt": "The capital of France is", "return_token_strs": True}).json()
    assert t["tokens"] == tok("The capital of France is").input_ids and t["count"] == len(t["tokens"])
    assert t["max_model_len"] == 1024 and t["token_strs"] == tok.convert_ids_to_tokens(t["tokens"])
    assert httpx.post(server + "/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": "The capital of France is"}
    msgs = [{"role": "user", "content": "Name three colors."}]
    n = httpx.post(server + "/tokenize", json={"model": NAME, "messages": msgs}).json()["count"]
    assert n == client.chat.completions.create(model=NAME, messages=msgs, max_tokens=1).usage.prompt_tokens
    with_tools = httpx.post(server + "/tokenize", json={"messages": msgs, "tools": [{"type": "function", "function": {
        k: WEATHER[k] for k in ("name", "description", "parameters")}}]}).json()["count"]
    assert with_tools > n  # the tools are rendered into the prompt, as for a chat
    for body in ({}, {"prompt": "a", "messages": msgs}, {"prompt": "a", "model": "nope"}):
        assert httpx.post(server + "/tokenize", json=body).status_code in (400, 404)
    assert httpx.post(server + "/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_the_store_is_bounded(tmp_path, model_dir):
    "In process, on a tiny model: past `max_stored` replies the oldest is dropped (then a 404), the newest kept."
    from fastapi.testclient import TestClient
    from minivllm.serve.async_engine import AsyncLLMEngine
    from minivllm.core.arg_utils import EngineArgs
    from minivllm.core.model import make_tiny_checkpoint
    from minivllm.serve.responses import add_responses_route
    from minivllm.serve.server import base_app
    make_tiny_checkpoint(str(tmp_path), "llama", tokenizer_from=model_dir, vocab_size=49152)
    engine = AsyncLLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), max_model_len=128))
    try:
        c = TestClient(add_responses_route(base_app(engine, "tiny"), max_stored=2))
        ids = [c.post("/v1/responses", json={"input": f"Hi {i}", "max_output_tokens": 2}).json()["id"] for i in range(3)]
        assert [c.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]
        r = c.post("/v1/responses", json={"input": "Go on", "previous_response_id": ids[0], "max_output_tokens": 2})
        assert r.status_code == 404 and r.json()["error"] == {"message": f"Response with id '{ids[0]}' not found.",
                                                               "type": "NotFoundError", "param": "previous_response_id", "code": 404}
    finally:
        engine.shutdown()
