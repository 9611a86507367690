"""The incremental detokenizer, the stop holdback, and the engine against the torch sampler."""

from __future__ import annotations

import threading

import pytest
import torch

from astrai_core.sampling import SamplingParams
from astrai_core.sampling.torch_sampler import TorchSampler
from astrai_core.serving.detokenize import IncrementalDetokenizer, StopStringHoldback
from astrai_core.serving.engine import BatchingEngine
from astrai_core.serving.sequence import EngineRequest, FinishEvent
from astrai_core.testing.serving import wait_for_stats


@pytest.fixture(scope="module")
def model_and_tokenizer(random_checkpoint):
    from astrai_core.checkpoints.native import load_pretrained
    from astrai_core.data.tokenizer import load_tokenizer

    return load_pretrained(random_checkpoint).eval(), load_tokenizer(random_checkpoint)


def test_detokenizer_never_emits_half_a_character(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    text = "Sunny \U0001F31E and caf\u00e9 \u4e2d\u6587 today"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # the emoji spans several tokens
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.push(t) for t in ids] + [detokenizer.finish()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_detokenizer_flushes_an_incomplete_character_at_the_end(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    ids = tokenizer("ok \U0001F31E", add_special_tokens=False)["input_ids"][:-1]
    detokenizer = IncrementalDetokenizer(tokenizer)
    joined = "".join(detokenizer.push(t) for t in ids)
    assert joined == "ok "
    assert detokenizer.finish() == tokenizer.decode(ids)[len("ok "):]


def test_stop_holdback_cuts_and_holds_only_possible_starts():
    holdback = StopStringHoldback(["END", "##"])
    assert holdback.push("abc E") == ("abc ", False)
    assert holdback.push("x #") == ("Ex ", False)
    assert holdback.push("y EN") == ("#y ", False)
    assert holdback.push("D tail") == ("", True)
    assert holdback.push("more") == ("", True)
    assert holdback.finish() == ""
    unfinished = StopStringHoldback(["END"])
    assert unfinished.push("the EN") == ("the ", False)
    assert unfinished.finish() == "EN"


def test_engine_matches_the_torch_sampler_with_staggered_joins(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = [[5, 9, 12], [7, 3], [1, 2, 3, 4, 5, 6, 7], [40], [11, 22, 33, 44, 55]] * 2
    params = [SamplingParams(max_new_tokens=6 + 2 * i, temperature=0.0 if i % 2 else 0.9,
                             top_k=8 if i % 3 else 0, top_p=0.9 if i % 4 == 0 else 1.0, seed=i)
              for i in range(len(prompts))]
    expected = TorchSampler(model).generate(prompts, params)
    engine = BatchingEngine(model, tokenizer, max_batch_size=4)  # fewer slots: requests wait and join later
    results: dict[int, tuple] = {}
    finished = threading.Semaphore(0)

    def sink_for(i):
        tokens, logprobs = [], []

        def sink(event):
            if isinstance(event, FinishEvent):
                results[i] = (tokens, logprobs, event.reason)
                finished.release()
            else:
                tokens.append(event.token_id)
                logprobs.append(event.logprob)
        return sink

    try:
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.submit(EngineRequest(prompt, p), sink_for(i))
        for _ in prompts:
            assert finished.acquire(timeout=120)
        for i, completion in enumerate(expected):
            tokens, logprobs, reason = results[i]
            assert tokens == completion.token_ids
            assert torch.allclose(torch.tensor(logprobs), torch.tensor(completion.logprobs), atol=1e-5, rtol=0)
            assert reason == completion.finish_reason
        assert wait_for_stats(engine, lambda s: s.active == 0 and s.finished == len(prompts))
        assert engine.stats().max_active == 4
    finally:
        engine.close()


def test_sampler_adapter_replays_completions_through_the_same_bookkeeping(model_and_tokenizer):
    """SamplerEngine (the --sampler vllm path) over the torch sampler: same tokens, stops applied on replay."""
    from astrai_core.serving.sampler_engine import SamplerEngine

    model, tokenizer = model_and_tokenizer
    prompt = tokenizer("Tell me a story", add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    full = TorchSampler(model, tokenizer).generate([prompt], greedy)[0]
    stop = full.text[4:7]
    engine = SamplerEngine(TorchSampler(model, tokenizer), tokenizer, max_context=1024,
                           vocab_size=len(tokenizer))
    events: dict[int, list] = {0: [], 1: []}
    done = threading.Semaphore(0)

    def sink_for(i):
        def sink(event):
            events[i].append(event)
            if isinstance(event, FinishEvent):
                done.release()
        return sink

    try:
        engine.submit(EngineRequest(prompt, greedy), sink_for(0))
        engine.submit(EngineRequest(prompt, greedy.model_copy(update={"stop": (stop,)})), sink_for(1))
        assert done.acquire(timeout=120) and done.acquire(timeout=120)
    finally:
        engine.close()
    tokens = [e.token_id for e in events[0] if not isinstance(e, FinishEvent)]
    assert tokens == full.token_ids and events[0][-1].reason == full.finish_reason
    text = "".join(e.text for e in events[1])
    assert text == full.text[:full.text.index(stop)] and events[1][-1].reason == "stop"


def test_token_by_token_choice_equals_the_non_streamed_message(model_and_tokenizer):
    """Tokens -> detokenizer -> Hermes parser -> chat deltas, with an emoji split across tokens
    inside the content and inside a tool call's arguments: the deltas a client accumulates equal
    the non-streamed message."""
    from astrai_core.serving.choices import ChatChoice
    from astrai_core.serving.detokenize import IncrementalDetokenizer
    from astrai_core.serving.sequence import TokenEvent

    _, tokenizer = model_and_tokenizer
    output = ('Sunny \U0001F31E <tool_call>\n{"name": "note", "arguments": {"text": "\U0001F31E </tool_call>"}}'
              '\n</tool_call>')
    ids = tokenizer(output, add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer)
    choice = ChatChoice(0, tokenizer, parse_tools=True, want_logprobs=False)
    parts = []
    for token in ids:
        parts += choice.on_event(TokenEvent(token, 0.0, None, detokenizer.push(token)))
    parts += choice.on_event(FinishEvent("stop", detokenizer.finish(), len(ids)))
    content = "".join(p["delta"].get("content", "") for p in parts)
    arguments = "".join(tc["function"].get("arguments", "") for p in parts for tc in p["delta"].get("tool_calls", []))
    message = choice.message_choice()
    assert content == message["message"]["content"] == "Sunny \U0001F31E "
    assert arguments == message["message"]["tool_calls"][0]["function"]["arguments"]
    assert arguments == '{"text": "\U0001F31E </tool_call>"}'
    assert message["finish_reason"] == "tool_calls" and parts[-1]["finish_reason"] == "tool_calls"
