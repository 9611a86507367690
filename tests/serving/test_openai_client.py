"""The server through the official ``openai`` client (max_retries=0) on 127.0.0.1."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from astrai_core.sampling import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler

USER = [{"role": "user", "content": "Tell me a story about a cat."}]


def _stream_chat(client, **kwargs):
    """(joined content, finish_reason per choice, chunks) of a streamed chat completion."""
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    content: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return content, finish, chunks


def test_models_lists_the_served_name(server):
    assert [m.id for m in server.client().models.list().data] == ["tiny"]


def test_streamed_content_joined_equals_non_streamed(server):
    client = server.client()
    args = dict(model="tiny", messages=USER, temperature=1.0, seed=7, max_tokens=40)
    whole = client.chat.completions.create(**args)
    content, finish, chunks = _stream_chat(client, **args)
    assert content[0] == whole.choices[0].message.content and content[0]
    assert finish[0] == whole.choices[0].finish_reason
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]  # the role once per choice


def test_completions_stream_equals_non_streamed(server):
    client = server.client()
    args = dict(model="tiny", prompt="Hello! How can I", temperature=0.8, seed=3, max_tokens=30)
    whole = client.completions.create(**args)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **args))
    assert streamed == whole.choices[0].text and whole.choices[0].text


def test_stop_string_ends_the_text_and_never_leaks(server):
    client = server.client()
    greedy = client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=40)
    text = greedy.choices[0].message.content
    assert len(text) > 12
    stop = text[8:11]  # a stop string taken from the greedy output
    expected = text[:text.index(stop)]
    cut = client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=40, stop=[stop])
    assert cut.choices[0].message.content == expected
    assert cut.choices[0].finish_reason == "stop"
    content, finish, chunks = _stream_chat(client, model="tiny", messages=USER, temperature=0, max_tokens=40,
                                           stop=stop)
    assert content[0] == expected and finish[0] == "stop"
    assert all(stop not in (c.choices[0].delta.content or "") for c in chunks if c.choices)


def test_max_tokens_gives_length_and_usage(server):
    client = server.client()
    bias = {str(server.tokenizer.eos_token_id): -100}  # no early end
    for key in ("max_tokens", "max_completion_tokens"):
        out = client.chat.completions.create(model="tiny", messages=USER, temperature=0, logit_bias=bias,
                                             **{key: 5})
        assert out.choices[0].finish_reason == "length"
        assert out.usage.completion_tokens == 5
        assert out.usage.prompt_tokens == len(server.chat_prompt_ids(USER))
        assert out.usage.total_tokens == out.usage.prompt_tokens + 5
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, temperature=0, max_tokens=5,
                                                 logit_bias=bias, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    assert [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason] == ["length"]


def test_usage_chunk_only_when_asked(server):
    chunks = list(server.client().chat.completions.create(model="tiny", messages=USER, max_tokens=3,
                                                          stream=True))
    assert all(c.usage is None and c.choices for c in chunks)


def test_n_two_gives_two_choices_streamed_and_not(server):
    client = server.client()
    args = dict(model="tiny", messages=USER, temperature=1.0, seed=11, max_tokens=20, n=2)
    whole = client.chat.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.choices[0].message.content != whole.choices[1].message.content
    content, _, chunks = _stream_chat(client, **args)
    assert content == {c.index: c.message.content for c in whole.choices}
    first_seen = []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.index not in first_seen:
                first_seen.append(choice.index)
    assert first_seen == [0, 1]  # choices first appear in index order


def test_logprobs_equal_the_torch_sampler(server):
    client = server.client()
    out = client.chat.completions.create(model="tiny", messages=USER, temperature=0.7, seed=5,
                                         max_tokens=12, logprobs=True, top_logprobs=3,
                                         extra_body={"top_k": 20})
    prompt = server.chat_prompt_ids(USER)
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=20, seed=5,
                            stop_token_ids=(server.tokenizer.eos_token_id,))
    expected = TorchSampler(server.model, server.tokenizer).generate([prompt], params)[0]
    entries = out.choices[0].logprobs.content
    assert [e.token for e in entries] == [server.tokenizer.decode([t]) for t in expected.token_ids]
    assert torch.allclose(torch.tensor([e.logprob for e in entries]), torch.tensor(expected.logprobs),
                          atol=1e-5, rtol=0)
    for entry in entries:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and entry.logprob <= tops[0] + 1e-6


def test_error_cases_raise_the_matching_client_exceptions(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=USER)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=USER, temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.post("/chat/completions", cast_to=httpx.Response, content=b'{"model": "tiny", "messages": [',
                    options={"headers": {"Content-Type": "application/json"}})
    with pytest.raises(openai.BadRequestError):
        client.post("/chat/completions", cast_to=httpx.Response, content=b"model=tiny",
                    options={"headers": {"Content-Type": "text/plain"}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=USER, tools=[], tool_choice="required")
    with pytest.raises(openai.UnprocessableEntityError) as too_long:
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=10**6)
    assert too_long.value.body["code"] == "context_length_exceeded"
    raw = httpx.post(f"{server.base_url}/chat/completions", content=b"{", headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_sse_frames_end_with_a_blank_line_and_done(server):
    with httpx.stream("POST", f"{server.base_url}/chat/completions", timeout=60,
                      json={"model": "tiny", "messages": USER, "max_tokens": 4, "stream": True}) as response:
        body = b"".join(response.iter_bytes()).decode()
    frames = body.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    assert all(f.startswith("data: ") and "\n" not in f for f in frames[:-1])


def test_completions_take_token_ids_and_lists_and_report_legacy_logprobs(server):
    client = server.client()
    ids = server.tokenizer("Hello! How can I", add_special_tokens=False)["input_ids"]
    out = client.completions.create(model="tiny", prompt=ids, temperature=0, max_tokens=6, logprobs=2)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.token_logprobs) == out.usage.completion_tokens == len(logprobs.tokens)
    for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs, strict=True):
        assert 1 <= len(top) <= 2  # keyed by text: byte pieces that decode alike share a key
        if len(top) == 2:
            assert max(top.values()) == pytest.approx(lp, abs=1e-6)  # greedy: the top token
    assert out.usage.prompt_tokens == len(ids)
    by_text = client.completions.create(model="tiny", prompt="Hello! How can I", temperature=0, max_tokens=6)
    assert by_text.choices[0].text == out.choices[0].text
    two = client.completions.create(model="tiny", prompt=["Hello! How can I", "The quick brown"], temperature=0,
                                    max_tokens=6)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text == out.choices[0].text
