"""Turn validated rows into token ids and per-token target masks.

A target mask marks the tokens the model should learn to produce (1) — all tokens of
a text document, the assistant turns of a chat, the responses of a preference pair or
the completion of an unpaired example.
The loader turns it into ``loss_mask`` (a document's first token is never a target).
"""

from __future__ import annotations

from typing import Any

from astrai_core.errors import DataError


class TemplateError(ValueError):
    """The chat template cannot say which tokens belong to the assistant."""


def has_generation_markers(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "generation" in template and "endgeneration" in template


def require_chat_template(tokenizer: Any, what: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{what} needs a tokenizer with a chat template, and this one has none")


def render_text(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of text documents, each ended by the EOS token (when there is one)."""
    eos = tokenizer.eos_token_id
    docs = tokenizer(texts, add_special_tokens=True)["input_ids"]
    return [ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids for ids in docs]


def _template(tokenizer: Any, messages: list[dict], generation_prompt: bool,
              tools: list[dict] | None = None) -> str:
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt, **extra)


def render_chat(tokenizer: Any, messages: list[dict],
                first_target: int = 0) -> tuple[list[int], list[int]]:
    """Token ids of a chat and its target mask: 1 on assistant turns ``>= first_target``.

    Each assistant turn's characters are found by rendering the conversation up to it
    (with the generation prompt) and up to its end: both must be prefixes of the whole
    rendering. Tokens overlapping a turn's characters are targets. Templates that render
    earlier turns differently (not prefix-stable) fall back to ``{% generation %}``
    markers when the template has them and ``first_target`` is 0.
    """
    try:
        return _render_by_prefixes(tokenizer, messages, first_target)
    except TemplateError:
        if first_target == 0 and has_generation_markers(tokenizer):
            return _render_by_markers(tokenizer, messages)
        raise


def _render_by_prefixes(tokenizer: Any, messages: list[dict],
                        first_target: int) -> tuple[list[int], list[int]]:
    full = _template(tokenizer, messages, generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < first_target:
            continue
        prefix_text = _template(tokenizer, messages[:i], generation_prompt=True) if i else ""
        end_text = _template(tokenizer, messages[:i + 1], generation_prompt=False)
        if not (full.startswith(prefix_text) and full.startswith(end_text)
                and len(end_text) > len(prefix_text)):
            raise TemplateError("the chat template renders a conversation prefix differently "
                                "from the start of the whole conversation")
        spans.append((len(prefix_text), len(end_text)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    mask = [int(any(s < span_end and e > span_start for span_start, span_end in spans))
            for s, e in encoded["offset_mapping"]]
    return ids, mask


def _render_by_markers(tokenizer: Any, messages: list[dict]) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [int(x) for x in out["assistant_masks"]]


def render_preference(tokenizer: Any, row: dict,
                      keys: tuple[str, ...] = ("chosen", "rejected"),
                      ) -> dict[str, tuple[list[int], list[int]]]:
    """``{key: (ids, mask)}`` for each response key, by default ``chosen`` and ``rejected``
    (an unpaired row's is ``("completion",)``); mask 1 on response tokens.

    A string prompt with string responses is plain text (prompt, then response + EOS);
    otherwise each response is a conversation rendered with the chat template, a string
    prompt becoming a user message and string responses assistant messages.
    """
    plain = row["prompt"] is not None and all(isinstance(row[k], str) for k in keys)
    out = {}
    if plain:
        prompt_ids = tokenizer(row["prompt"], add_special_tokens=True)["input_ids"]
        for key in keys:
            response = render_text(tokenizer, [row[key]])[0]
            bos = tokenizer.bos_token_id
            if response and bos is not None and response[0] == bos:  # BOS only before the prompt
                response = response[1:]
            out[key] = (prompt_ids + response, [0] * len(prompt_ids) + [1] * len(response))
        return out
    prefix = row["messages"] or [{"role": "user", "content": row["prompt"]}]
    for key in keys:
        value = row[key]
        response = [{"role": "assistant", "content": value}] if isinstance(value, str) else value
        out[key] = render_chat(tokenizer, prefix + response, first_target=len(prefix))
    return out


def wraps_string_prompts(tokenizer: Any, chat_template: bool) -> bool:
    """Whether a string prompt becomes one user turn rendered with the chat template: asked
    for (``data.chat_template``) and the tokenizer has a template to render it with."""
    return chat_template and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, row: dict, tools: list[dict] | None = None,
                  chat_template: bool = True) -> tuple[str, list[int]]:
    """``(prompt_text, prompt_ids)``: messages through the chat template with the
    generation prompt appended; a string prompt likewise as one user turn when
    ``chat_template`` and the tokenizer has a template (a model trained on chats answers
    only behind its template), verbatim otherwise. ``tools``: OpenAI tool schemas the
    template is given (``tools=``), for a template that renders them."""
    messages = row["messages"]
    if row["prompt"] is not None:
        if not wraps_string_prompts(tokenizer, chat_template):
            return row["prompt"], list(tokenizer(row["prompt"], add_special_tokens=True)["input_ids"])
        messages = [{"role": "user", "content": row["prompt"]}]
    text = _template(tokenizer, messages, generation_prompt=True, tools=tools)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])
