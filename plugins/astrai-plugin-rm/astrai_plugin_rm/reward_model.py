"""The ``reward_model`` reward function: a trained reward model scores each completion.

``{name: reward_model, path: RM_DIR, batch_size: 16}``: ``RM_DIR`` is a reward-model
checkpoint (a step of an ``rm`` run, or an imported Hugging Face classifier). Each
(prompt, completion) becomes the tokens the rm strategy saw for a preference pair
(``render``):

- ``text``: a plain prompt and completion (prompt, completion, EOS), as plain-string
  preference rows are rendered (:func:`astrai_core.api.render_preference`);
- ``templated``: the prompt was already rendered by the chat template with its generation
  prompt (what prompt data written as ``messages`` gives a reward); the completion is
  closed as the template closes an assistant turn, as chat preference rows are rendered;
- ``chat``: the prompt is a user message's content, rendered with the completion as a
  chat through the template;
- ``auto`` (default): ``templated`` when the prompt starts the way the chat template starts
  a user turn, else ``text``.

The model is loaded on first use (checking a config does not load it) on the run's device,
and scores in batches under ``torch.no_grad``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


_PROBE = "\x00probe\x00"  # a user message no real prompt contains


class RewardModelReward:
    """Scores with a reward model; see the module docstring."""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

        path: str = Field(description="reward-model checkpoint directory")
        batch_size: int = Field(16, ge=1, description="sequences per forward")
        render: Literal["auto", "text", "templated", "chat"] = Field(
            "auto", description="how (prompt, completion) become tokens (see the docs)")
        device: str = Field("auto", description="device backend to score on (auto: the best "
                            "available, as the run picks it)")
        dtype: str | None = Field(None, description="e.g. bfloat16 (default: the checkpoint's)")
        max_length: int | None = Field(None, ge=1, description="keep the last N tokens")

        @field_validator("path")
        @classmethod
        def _exists(cls, value: str) -> str:
            if not (Path(value) / "score.safetensors").is_file():
                raise ValueError(f"{value} is not a reward-model checkpoint (no "
                                 "score.safetensors)")
            return value

    def __init__(self, **options: Any) -> None:
        self.config = self.Config(**options)
        self._model: Any = None
        self._tokenizer: Any = None
        self._prefix: str | None = None

    def _load(self) -> None:
        import torch

        from astrai_core.api import process_registry, resolve_device
        from astrai_plugin_rm.checkpoint import load_reward_model

        cfg = self.config
        device = resolve_device(process_registry(), cfg.device).device(
            int(os.environ.get("LOCAL_RANK", 0)))  # each rank of a run scores on its own
        dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
        self._model, self._tokenizer = load_reward_model(cfg.path, device=device, dtype=dtype)
        self._prefix = self._user_turn_prefix()

    def token_ids(self, prompt: str, completion: str) -> list[int]:
        """The tokens the reward model scores for one (prompt, completion)."""
        from astrai_core.api import render_preference

        render = self.config.render
        if render == "auto":
            render = "templated" if self._prefix and prompt.startswith(self._prefix) \
                else "text"
        if render == "templated":
            ids = self._tokenizer(prompt + self._turn_end(completion),
                                  add_special_tokens=False)["input_ids"]
        else:
            if render == "chat":
                row = {"prompt": None, "messages": [{"role": "user", "content": prompt}],
                       "chosen": [{"role": "assistant", "content": completion}]}
            else:
                row = {"prompt": prompt, "messages": None, "chosen": completion}
            row["rejected"] = row["chosen"]
            ids = render_preference(self._tokenizer, row)["chosen"][0]
        limit = self.config.max_length
        return list(ids[-limit:] if limit else ids)

    def _user_turn_prefix(self) -> str | None:
        """What the chat template writes before a first user message's content (None
        without a template)."""
        if not getattr(self._tokenizer, "chat_template", None):
            return None
        text = self._tokenizer.apply_chat_template([{"role": "user", "content": _PROBE}],
                                                   tokenize=False)
        return text[:text.index(_PROBE)] or None

    def _turn_end(self, completion: str) -> str:
        """The completion as the template writes an assistant turn after the generation
        prompt (its end-of-turn token included)."""
        from astrai_core.api import AstraiError

        user = [{"role": "user", "content": _PROBE}]
        head = self._tokenizer.apply_chat_template(user, add_generation_prompt=True,
                                                   tokenize=False)
        full = self._tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": completion}], tokenize=False)
        if not full.startswith(head):
            raise AstraiError(f"reward_model {self.config.path}: its chat template does not "
                              "continue the generation prompt with the assistant turn; use "
                              "render: chat or text")
        return full[len(head):]

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        import torch

        if self._model is None:
            self._load()
        device = next(self._model.parameters()).device
        pad = self._model.pad_id if self._model.pad_id is not None else 0
        scores: list[float] = []
        rows = [self.token_ids(p, c) for p, c in zip(prompts, completions, strict=True)]
        with torch.no_grad():
            for start in range(0, len(rows), self.config.batch_size):
                chunk = rows[start:start + self.config.batch_size]
                width = max(len(r) for r in chunk)
                ids = torch.tensor([r + [pad] * (width - len(r)) for r in chunk], device=device)
                mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk],
                                    device=device)
                scores += self._model(ids, mask).tolist()
        return scores
