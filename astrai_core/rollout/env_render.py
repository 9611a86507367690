"""Environment messages -> the tokens appended after an assistant turn.

The messages are rendered by the tokenizer's own chat template, so a model sees tool
results exactly as it would in serving. The model's tokens are never re-tokenized: the
template renders a stand-in conversation whose assistant turn is a marker, and the tokens
appended are those of the text after the marker (the assistant turn's closing, the
messages and the next assistant generation prompt). When the model already closed its
turn with an end-of-turn token, the closing it wrote is not appended a second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astrai_core.errors import ConfigError

_MARKER = "\u2063astrai-assistant-turn\u2063"  # invisible separators: no template edits them
_STAND_IN = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARKER}]


class MessageRenderer:
    """Renders environment messages with ``tokenizer``'s chat template."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("a multi-turn environment needs a tokenizer with a chat template "
                              "(it renders the tool messages)")
        self.tokenizer = tokenizer

    def suffix_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """The template's text after an assistant turn's content, up to the next turn's start."""
        full = self.tokenizer.apply_chat_template(_STAND_IN + list(messages), tokenize=False,
                                                  add_generation_prompt=True)
        at = full.rfind(_MARKER)
        if at < 0:
            raise ConfigError("the chat template does not render assistant content verbatim, "
                              "so tool messages cannot be placed after a turn")
        return full[at + len(_MARKER):]

    def tokens(self, messages: Sequence[dict[str, Any]], last_model_token: int | None,
               stop_token_ids: Sequence[int]) -> list[int]:
        """Token ids to append after the model's turn that ended with ``last_model_token``."""
        text = self.suffix_text(messages)
        if last_model_token is not None and last_model_token in stop_token_ids:
            closing = self.tokenizer.decode([last_model_token], skip_special_tokens=False)
            if closing and text.startswith(closing):
                text = text[len(closing):]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
