"""``astrai serve`` on a vision-language model: chat messages with data:-URL images are
answered through the model's processor and the torch sampler, with log-probs equal to the
sampler called directly on the processor's own prompt and pixels; another image changes
them; remote URLs, undecodable images and images for a text-only model are 400s."""

from __future__ import annotations

import base64
import io

import openai
import pytest

from astrai_core.testing.hf_vlms import tiny_image, write_vlm_dir
from astrai_core.testing.serving import live_server

QUESTION = "What is this?"


def _data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _messages(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module", params=["gemma3", "qwen2_5_vl"])
def vlm_server(tmp_path_factory, request):
    from astrai_core.checkpoints.hf_model import load_transformers_model, write_backend_record
    from astrai_core.checkpoints.manifest import write_manifest

    family = request.param
    directory = write_vlm_dir(tmp_path_factory.mktemp("vlm") / family, family)
    write_backend_record(load_transformers_model(directory), directory)
    write_manifest(directory)  # a checkpoint as a transformers-backend run writes it
    with live_server(directory) as live:
        yield live


def _direct(live, image, max_new: int):
    """The torch sampler on the processor's own rendering of the chat and its pixels."""
    from astrai_core.sampling.params import SamplingParams
    from astrai_core.sampling.torch_sampler import TorchSampler

    processor = live.tokenizer.astrai_processor  # loaded beside the tokenizer
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[[image]], add_special_tokens=False, return_tensors="pt")
    images = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0,
                            stop_token_ids=(processor.tokenizer.eos_token_id,))
    return TorchSampler(live.model, processor.tokenizer).generate(
        [out["input_ids"][0].tolist()], params, images=[images])[0]


def _reply(live, image, stream: bool = False):
    client = live.client()
    kwargs = dict(model="tiny", messages=_messages(_data_url(image)), max_tokens=5,
                  temperature=0, logprobs=True)
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_an_image_request_equals_the_torch_sampler_with_the_same_pixels(vlm_server):
    choice = _reply(vlm_server, tiny_image(0))
    expected = _direct(vlm_server, tiny_image(0), 5)
    served = [entry.logprob for entry in choice.logprobs.content]
    assert len(served) == len(expected.logprobs) >= 1
    assert served == pytest.approx(expected.logprobs, abs=1e-5)
    assert choice.message.content == vlm_server.tokenizer.decode(
        [t for t in expected.token_ids if t != vlm_server.tokenizer.eos_token_id],
        skip_special_tokens=True)
    assert _reply(vlm_server, tiny_image(0), stream=True) == choice.message.content


def test_another_image_changes_the_answer(vlm_server):
    first = _reply(vlm_server, tiny_image(0)).logprobs.content[0]
    other = _reply(vlm_server, tiny_image(7)).logprobs.content[0]
    assert first.token != other.token or abs(first.logprob - other.logprob) > 1e-4


def _refused(live, url: str) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        live.client().chat.completions.create(model="tiny", messages=_messages(url), max_tokens=2)
    return caught.value.message


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "http://127.0.0.1/a.png",
                                 "/etc/hostname", "file:///etc/hostname"])
def test_a_url_that_is_not_data_is_refused(vlm_server, url):
    message = _refused(vlm_server, url)
    assert "never fetches URLs" in message and "data: URL" in message
    assert "messages[0].content[0]" in message


@pytest.mark.parametrize("url", ["data:image/png;base64,not-base64!!", "data:image/png;base64,aGVsbG8=",
                                 "data:image/png,rawtext"])
def test_an_undecodable_image_names_its_part(vlm_server, url):
    message = _refused(vlm_server, url)
    assert "messages[0].content[0]" in message and "cannot be decoded" in message


def test_a_text_only_model_refuses_images(server):
    message = _refused(server, _data_url(tiny_image(0)))
    assert "takes no images" in message and "messages[0].content[0]" in message


def test_a_sampler_without_images_refuses_them(vlm_server):
    """A VLM behind a sampler whose ``generate`` takes no images (as vLLM's) is a 400,
    not a prompt whose image tokens no pixels fill."""
    import json

    from astrai_core.serving.prepare import Preparer
    from astrai_core.serving.protocol import APIError
    from astrai_core.serving.sampler_engine import SamplerEngine

    class TextSampler:
        def generate(self, prompts, params):
            raise AssertionError("never reached")

    engine = SamplerEngine(TextSampler(), vlm_server.tokenizer, max_context=256, vocab_size=300)
    try:
        body = json.dumps({"model": "tiny", "messages": _messages(_data_url(tiny_image(0)))})
        with pytest.raises(APIError, match="sampler takes no images"):
            Preparer(engine, "tiny", None, 8).chat(body.encode(), "application/json")
    finally:
        engine.close()
