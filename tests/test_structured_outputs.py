"""Structured outputs end to end on SmolLM2: JSON schemas of many shapes (greedy and sampled) parse and validate, choices
and regexes match, free requests in a mixed batch are untouched, constrained requests survive preemption, bad specs fail
alone, and the server returns schema-valid JSON to the official `openai` client (streamed and not)."""
import json, re
import jsonschema, pytest
from conftest import running_server
from minivllm import LLM, SamplingParams
from minivllm.core.config import StructuredOutputsParams

pytestmark = pytest.mark.xdist_group("structured_outputs")  # one worker builds its module fixtures (engines, checkpoints) once

S = lambda maxlen=10: {"type": "string", "maxLength": maxlen}
SCHEMAS = [
    {"type": "object", "properties": {"name": S()}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score"]},
    {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "y": {"type": "integer", "minimum": -5, "maximum": 5}},
     "required": ["x", "y"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S(6), "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"name": S(), "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                                                 "required": ["name", "age"]}}, "required": ["person"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "boolean"}},
                                                                                   "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"points": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]}}}, "required": ["points"]},
    {"type": "object", "properties": {"name": S(), "nickname": S(6)}, "required": ["name"]},                     # an optional field
    {"type": "object", "properties": {"status": {"const": "done"}, "code": {"type": "integer", "minimum": 100, "maximum": 599}},
     "required": ["status", "code"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}}, "required": ["value"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["id"]},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"}}, "required": ["date"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                                                                                         "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 50}, "minItems": 2, "maxItems": 4},   # an array at the top
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "population": {"type": "integer", "minimum": 0, "maximum": 10000000},
                                      "capital": {"type": "boolean"}}, "required": ["city", "population", "capital"]},
    {"type": "object", "properties": {"title": S(12), "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                                      "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "sf"]}, "maxItems": 2}},
     "required": ["title", "year", "genres"]},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"enum": ["C", "F"]}},
     "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"email": S(12), "roles": {"type": "array", "items": {"enum": ["admin", "dev"]},
                                                                                                        "maxItems": 2}}, "required": ["email", "roles"]},
                                      "active": {"type": "boolean"}}, "required": ["user", "active"]},
    {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 4},
                                      "name": S(8), "vaccinated": {"type": "boolean"}}, "required": ["kind", "legs", "name", "vaccinated"]},
]


def chat(llm, q):
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def llm():
    llm = LLM(max_model_len=512, num_gpu_blocks_override=160, max_num_seqs=64)
    yield llm
    del llm


def json_params(schema, i, greedy, **kw):
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=i % 2 == 0)   # half with any whitespace
    return SamplingParams(temperature=0 if greedy else 0.8, seed=None if greedy else i, max_tokens=120, structured_outputs=so, **kw)


def test_json_schemas_greedy_and_sampled(llm):
    assert len(SCHEMAS) >= 20
    prompts, params = [], []
    for i, s in enumerate(SCHEMAS):
        p = chat(llm, f"Answer with JSON following this schema: {json.dumps(s)}")
        prompts += [p, p]; params += [json_params(s, i, True), json_params(s, i, False)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for k, o in enumerate(outs):
        c, schema = o.outputs[0], SCHEMAS[k // 2]
        assert c.finish_reason == "stop", (k, c.text)
        jsonschema.validate(json.loads(c.text), schema)


def test_choice_regex_n_and_logprobs(llm):
    choices = ["Paris", "London", "Berlin", "Madrid"]
    regexes = [r"\d{3}-\d{4}", r"[A-Z][a-z]+ [A-Z][a-z]+", r"(yes|no), because [a-z ]{1,20}\.", r"#[0-9a-f]{6}"]
    prompts, params = [], []
    for i in range(4):
        prompts.append(chat(llm, "What is the capital of France?"))
        params.append(SamplingParams(temperature=0 if i == 0 else 1.0, seed=i, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=choices)))
    for i, rx in enumerate(regexes):
        prompts.append(chat(llm, "Give me an example."))
        params.append(SamplingParams(temperature=0 if i % 2 else 0.9, seed=i, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=rx)))
    prompts.append(chat(llm, "A small JSON object please."))
    params.append(SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=100, structured_outputs=StructuredOutputsParams(json=SCHEMAS[17])))
    prompts.append(chat(llm, "A digit?"))     # logprobs are those of the masked distribution: only digits are left
    params.append(SamplingParams(temperature=0, max_tokens=2, logprobs=20, structured_outputs=StructuredOutputsParams(regex="[0-9]")))
    outs = llm.generate(prompts, params, use_tqdm=False)
    for o in outs[:4]: assert o.outputs[0].text in choices and o.outputs[0].finish_reason == "stop"
    for o, rx in zip(outs[4:8], regexes): assert re.fullmatch(rx, o.outputs[0].text), (rx, o.outputs[0].text)
    assert len(outs[8].outputs) == 3
    for c in outs[8].outputs: jsonschema.validate(json.loads(c.text), SCHEMAS[17])
    c = outs[9].outputs[0]
    assert re.fullmatch("[0-9]", c.text)
    lp = c.logprobs[0]
    finite = {t: l.logprob for t, l in lp.items() if l.logprob > float("-inf")}
    tok = llm.get_tokenizer()
    assert all(re.fullmatch("[0-9]", tok.decode([t])) for t in finite)
    assert sum(2.718281828459045 ** v for v in finite.values()) == pytest.approx(1.0, abs=1e-3)


def test_mixed_batch_leaves_free_requests_alone():
    """Constrained neighbours change nothing for unconstrained requests. In float32: in bfloat16 a request's
    log-probs move by up to ~0.1 between running alone and in a batch (GEMM row blocking, prefix-cache hits),
    with every attention backend, so a near tie could flip a greedy token for reasons that have nothing to do
    with the masks."""
    llm = LLM(dtype="float32", max_model_len=512, num_gpu_blocks_override=160, max_num_seqs=64)
    free = [chat(llm, "Tell me about Paris."), chat(llm, "Write a haiku about the sea.")]
    fp = [SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0.9, seed=7, max_tokens=24)]
    alone = [o.outputs[0].token_ids for o in llm.generate(free, fp, use_tqdm=False)]
    cons = SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMAS[7]))
    creg = SamplingParams(temperature=0.7, seed=1, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=r"[a-z]{3,8}"))
    mixed = llm.generate([chat(llm, "A person as JSON."), free[0], chat(llm, "A word."), free[1]], [cons, fp[0], creg, fp[1]], use_tqdm=False)
    assert [mixed[1].outputs[0].token_ids, mixed[3].outputs[0].token_ids] == alone
    jsonschema.validate(json.loads(mixed[0].outputs[0].text), SCHEMAS[7])
    assert re.fullmatch(r"[a-z]{3,8}", mixed[2].outputs[0].text)


def test_invalid_spec_fails_alone(llm):
    engine = llm.llm_engine
    engine.add_request("good", chat(llm, "A color."), SamplingParams(temperature=0, max_tokens=10,
                                                                    structured_outputs=StructuredOutputsParams(choice=["red", "blue"])))
    for bad, msg in [(dict(json={"type": "nonsense"}), "nonsense"), (dict(regex="(ab"), "parenthesis"),
                     (dict(json="{not json"), "not JSON"), (dict(grammar="root ::= missing"), "missing")]:
        with pytest.raises(ValueError, match=msg):
            engine.add_request("bad", chat(llm, "x"), SamplingParams(max_tokens=5, structured_outputs=StructuredOutputsParams(**bad)))
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o
    assert list(done) == ["good"] and done["good"].outputs[0].text in ("red", "blue")
    with pytest.raises(ValueError, match="Unsupported type"):
        llm.generate(["hi"], SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "nonsense"})), use_tqdm=False)
    assert llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids


def test_preemption_keeps_constrained_requests_valid():
    small = LLM(max_model_len=160, num_gpu_blocks_override=10, block_size=16, max_num_seqs=8)
    schemas = [SCHEMAS[i] for i in (7, 17, 19, 21, 18, 20)]
    prompts = [chat(small, f"Give me a JSON object, number {i}.") for i in range(len(schemas))]
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=100, structured_outputs=StructuredOutputsParams(json=s)) for i, s in enumerate(schemas)]
    outs = small.generate(prompts, params, use_tqdm=False)
    assert small.llm_engine.engine_core.scheduler.num_preemptions > 0
    for o, s in zip(outs, schemas):
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        jsonschema.validate(json.loads(o.outputs[0].text), s)
    assert small.llm_engine.engine_core.extension("structured_outputs").manager.states == {}


def test_server_json_schema_through_openai_client():
    import openai
    schema = SCHEMAS[18]
    rf = {"type": "json_schema", "json_schema": {"name": "movie", "schema": schema, "strict": True}}
    with running_server("--served-model-name", "smol", "--max-model-len", "512") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "Describe a movie as JSON."}]
        r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=100, temperature=0, response_format=rf)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        assert r.choices[0].finish_reason == "stop"
        s = client.chat.completions.create(model="smol", messages=msgs, max_tokens=100, temperature=0.8, seed=3, response_format=rf, stream=True)
        jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in s if c.choices)), schema)
        c = client.completions.create(model="smol", prompt="A JSON object:", max_tokens=60, temperature=0,
                                      extra_body={"response_format": {"type": "json_object"}})   # vLLM takes it on completions too
        jsonschema.validate(json.loads(c.choices[0].text), {"type": "object"})
        assert c.choices[0].finish_reason == "stop"                  # the object is complete, not cut by max_tokens
        c = client.completions.create(model="smol", prompt="A movie as JSON:", max_tokens=100, temperature=0,
                                      extra_body={"response_format": rf})
        jsonschema.validate(json.loads(c.choices[0].text), schema)
        assert c.choices[0].finish_reason == "stop"
        c = client.completions.create(model="smol", prompt="The answer is", max_tokens=5, temperature=0, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert c.choices[0].text in ("yes", "no")
        with pytest.raises(openai.BadRequestError, match="parenthesis"):
            client.completions.create(model="smol", prompt="x", max_tokens=5, extra_body={"structured_outputs": {"regex": "(ab"}})
        with pytest.raises(openai.BadRequestError, match="Unsupported type"):
            client.chat.completions.create(model="smol", messages=msgs, max_tokens=5, stream=True,
                                           response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
        r = client.chat.completions.create(model="smol", messages=msgs, max_tokens=100, temperature=0, response_format=rf)   # still serving
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
