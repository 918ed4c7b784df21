"""Prompt embeddings (lesson 08b) through `minivllm serve --enable-prompt-embeds`, as vLLM's
`prompt_embed_inference_with_openai_client.py` sends them: the official `openai` client, `prompt=""` and
`extra_body={"prompt_embeds": <base64 of torch.save(tensor)>}`. The model's own embeddings of a prompt's tokens give
that prompt's greedy completion; random vectors give what offline `LLM(enable_prompt_embeds=True)` gives; bad input and
a server without the flag are clear 400s."""
import base64, io

import openai, pytest, torch
from conftest import running_server
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.core.model_files import resolve_model

pytestmark = pytest.mark.xdist_group("prompt_embeds")   # its own servers: any worker
ARGS = ("--dtype", "float32", "--max-model-len", "256", "--served-model-name", "smol")


def b64(t: torch.Tensor) -> str:
    "vLLM's `tensor2base64`: the tensor as `torch.save` writes it, base64-encoded."
    buf = io.BytesIO()
    torch.save(t, buf)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def weights():
    path = resolve_model(None)
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def client():
    with running_server(*ARGS, "--enable-prompt-embeds") as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)


def test_embeds_of_a_prompt_give_its_completion(client, weights):
    tok, hf = weights
    text = "The capital of France is"
    ids = tok(text).input_ids
    embeds = hf.get_input_embeddings().weight[ids].detach()
    by_text = client.completions.create(model="smol", prompt=text, max_tokens=12, temperature=0)
    by_embeds = client.completions.create(model="smol", prompt="", max_tokens=12, temperature=0,
                                          extra_body={"prompt_embeds": b64(embeds)})
    assert by_embeds.choices[0].text == by_text.choices[0].text and by_text.choices[0].text
    assert by_embeds.usage.prompt_tokens == len(ids)
    stream = client.completions.create(model="smol", prompt="", max_tokens=12, temperature=0, stream=True,
                                       extra_body={"prompt_embeds": b64(embeds)})
    assert "".join(c.choices[0].text for c in stream if c.choices) == by_text.choices[0].text


def test_random_vectors_as_offline(client):
    e = torch.randn(7, 576, generator=torch.Generator().manual_seed(3)) * 0.05
    served = client.completions.create(model="smol", prompt="", max_tokens=8, temperature=0,
                                       extra_body={"prompt_embeds": b64(e)})
    llm = LLM(dtype="float32", max_model_len=256, enable_prompt_embeds=True, num_gpu_blocks_override=64)
    offline = llm.generate({"prompt_embeds": e}, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    assert served.choices[0].text == offline.outputs[0].text


def test_bad_embeddings_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="base64 torch tensor"):
        client.completions.create(model="smol", prompt="", extra_body={"prompt_embeds": "bm90IGEgdGVuc29y"})
    with pytest.raises(openai.BadRequestError, match=r"\[num_tokens, 576\]"):
        client.completions.create(model="smol", prompt="", extra_body={"prompt_embeds": b64(torch.zeros(3, 5))})
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.completions.create(model="smol", prompt="Hi", extra_body={"prompt_embeds": b64(torch.zeros(3, 576))})
    with pytest.raises(openai.BadRequestError, match="needs a prompt"):
        client.completions.create(model="smol", prompt=None)


def test_a_server_without_the_flag_refuses_them():
    with running_server(*ARGS) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)
        with pytest.raises(openai.BadRequestError, match="enable_prompt_embeds=True"):
            c.completions.create(model="smol", prompt="", extra_body={"prompt_embeds": b64(torch.zeros(3, 576))})
