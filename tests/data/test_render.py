"""Chat loss masks cover exactly the assistant tokens; preference and prompt rendering."""

from __future__ import annotations

import pytest

from astrai_core.data.render import (_render_by_markers, render_chat, render_preference,
                                     render_prompt)
from astrai_core.data.tokenize import tokenize_source
from astrai_core.errors import DataError

CONVERSATION = [
    {"role": "system", "content": "answer with a number"},
    {"role": "user", "content": "12+35="},
    {"role": "assistant", "content": "47"},
    {"role": "user", "content": "9-13="},
    {"role": "assistant", "content": "-4"},
]


def masked_runs(tokenizer, ids, mask) -> list[str]:
    """The decoded text of each contiguous run of masked tokens."""
    runs, current = [], []
    for token, flag in zip(ids, mask):
        if flag:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def test_arith_chat_mask_is_the_assistant_answers(arith_tokenizer):
    ids, mask = render_chat(arith_tokenizer, CONVERSATION)
    assert arith_tokenizer.decode(ids) == ("<|system|>answer with a number<|end|><|user|>12+35="
                                           "<|end|><|assistant|>47<|end|><|user|>9-13=<|end|>"
                                           "<|assistant|>-4<|end|>")
    assert masked_runs(arith_tokenizer, ids, mask) == ["47<|end|>", "-4<|end|>"]


def test_prefix_method_agrees_with_generation_markers(arith_tokenizer):
    # Two independent ways to find the assistant tokens: prefix rendering and the
    # template's {% generation %} blocks (transformers' return_assistant_tokens_mask).
    for messages in (CONVERSATION, CONVERSATION[1:3]):
        assert render_chat(arith_tokenizer, messages) == _render_by_markers(arith_tokenizer, messages)


def test_chatml_bpe_mask_with_multi_character_tokens(chatml_tokenizer):
    messages = [{"role": "user", "content": "what is the capital of france?"},
                {"role": "assistant", "content": "paris is the capital"},
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "how are you today"}]
    ids, mask = render_chat(chatml_tokenizer, messages)
    assert max(len(chatml_tokenizer.decode([t])) for t in ids) > 3  # real merges happened
    assert masked_runs(chatml_tokenizer, ids, mask) == [
        "paris is the capital<|im_end|>\n", "how are you today<|im_end|>\n"]
    # Everything else (headers, user turns) carries no loss.
    unmasked = chatml_tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    assert unmasked == ("<|im_start|>user\nwhat is the capital of france?<|im_end|>\n"
                        "<|im_start|>assistant\n<|im_start|>user\nhello there<|im_end|>\n"
                        "<|im_start|>assistant\n")


UNSTABLE = ("{% for m in messages %}{% if loop.last %}[last]{% endif %}"
            "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_template_that_is_not_prefix_stable_is_a_data_error(chatml_dir, write_jsonl, tmp_path):
    from astrai_core.data import load_tokenizer

    tokenizer = load_tokenizer(chatml_dir)
    tokenizer.chat_template = UNSTABLE
    path = write_jsonl("c.jsonl", [{"messages": CONVERSATION[1:3]}])
    with pytest.raises(DataError, match=r"c.jsonl, line 1: the chat template renders"):
        tokenize_source(path, "chat", tokenizer, tmp_path / "cache")


def test_unstable_template_with_generation_markers_falls_back(chatml_dir):
    from astrai_core.data import load_tokenizer

    tokenizer = load_tokenizer(chatml_dir)
    tokenizer.chat_template = UNSTABLE.replace(
        "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>",
        "<{{ m['role'] }}>{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
        "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}</{{ m['role'] }}>")
    ids, mask = render_chat(tokenizer, CONVERSATION[1:3])
    assert masked_runs(tokenizer, ids, mask) == ["47"]


def test_chat_without_template_is_a_data_error(chatml_dir, write_jsonl, tmp_path):
    from astrai_core.data import load_tokenizer

    tokenizer = load_tokenizer(chatml_dir)
    tokenizer.chat_template = None
    path = write_jsonl("c.jsonl", [{"messages": CONVERSATION[1:3]}])
    with pytest.raises(DataError, match="needs a tokenizer with a chat template"):
        tokenize_source(path, "chat", tokenizer, tmp_path / "cache")


def test_preference_plain_text_masks_only_the_response(chatml_tokenizer):
    row = {"prompt": "the capital of france is", "messages": None,
           "chosen": " paris", "rejected": " the lazy dog"}
    out = render_preference(chatml_tokenizer, row)
    for key, response in (("chosen", " paris<|im_end|>"), ("rejected", " the lazy dog<|im_end|>")):
        ids, mask = out[key]
        assert chatml_tokenizer.decode(ids) == row["prompt"] + response
        assert masked_runs(chatml_tokenizer, ids, mask) == [response]


def test_preference_conversation_masks_only_the_final_response(arith_tokenizer):
    row = {"prompt": None, "messages": CONVERSATION[:4],
           "chosen": [{"role": "assistant", "content": "-4"}], "rejected": "5"}
    out = render_preference(arith_tokenizer, row)
    assert masked_runs(arith_tokenizer, *out["chosen"]) == ["-4<|end|>"]  # not the earlier "47"
    assert masked_runs(arith_tokenizer, *out["rejected"]) == ["5<|end|>"]
    prompt_len = out["chosen"][1].index(1)
    assert out["chosen"][0][:prompt_len] == out["rejected"][0][:prompt_len]


def test_prompt_rendering(arith_tokenizer):
    text, ids = render_prompt(arith_tokenizer, {"prompt": None, "messages": CONVERSATION[1:2]})
    assert text == "<|user|>12+35=<|end|><|assistant|>"
    assert arith_tokenizer.decode(ids) == text and len(ids) == 9
    text, ids = render_prompt(arith_tokenizer, {"prompt": "7*8=", "messages": None},
                              chat_template=False)
    assert text == "7*8=" and arith_tokenizer.convert_ids_to_tokens(ids) == ["7", "*", "8", "="]
    # By default a string prompt is one user turn, rendered exactly as the messages are.
    as_messages = render_prompt(arith_tokenizer, {"prompt": None, "messages": [
        {"role": "user", "content": "7*8="}]})
    assert render_prompt(arith_tokenizer, {"prompt": "7*8=", "messages": None}) == as_messages
