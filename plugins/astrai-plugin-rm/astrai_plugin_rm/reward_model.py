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

A reward model trained on a vision-language model scores prompts with images: the call's
``images`` (a column of the prompts, one list per completion: PIL images, or paths and
``data:`` URLs) fill the image placeholders that the chat template wrote in the prompt,
which the model's processor expands into each image's tokens (``templated`` prompts).

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

    def image_row(self, prompt: str, completion: str, images: list[Any]
                  ) -> tuple[list[int], dict[str, Any]]:
        """(token ids, image inputs) of a templated prompt whose image placeholders stand
        for ``images``, and its completion; never cut (its image tokens would be)."""
        from astrai_core.api import AstraiError, open_image, process_prompt, processor_of

        where = f"reward_model {self.config.path}"
        processor = processor_of(self._tokenizer)
        if processor is None:
            raise AstraiError(f"{where}: the prompts have images, and this reward model takes "
                              "none (a text-only model)")
        if self.config.render not in ("auto", "templated") or not (
                self._prefix and prompt.startswith(self._prefix)):
            raise AstraiError(f"{where}: prompts with images are scored as rendered by the "
                              "chat template (render: templated or auto)")
        opened = [image if hasattr(image, "convert") else open_image(image, Path.cwd())
                  for image in images]
        ids, tensors = process_prompt(processor, prompt + self._turn_end(completion), opened)
        limit = self.config.max_length
        if limit and len(ids) > limit:
            raise AstraiError(f"{where}: a prompt with images is {len(ids)} tokens, over "
                              f"max_length {limit}; its image tokens are never cut")
        return ids, tensors

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        import torch

        from astrai_core.api import prompt_images

        if self._model is None:
            self._load()
        device = next(self._model.parameters()).device
        pad = self._model.pad_id if self._model.pad_id is not None else 0
        images = columns.get("images") or [None] * len(prompts)
        rows = [self.image_row(p, c, i) if i else (self.token_ids(p, c), None)
                for p, c, i in zip(prompts, completions, images, strict=True)]
        model_type = getattr(self._model.backbone.config, "model_type", "")
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(rows), self.config.batch_size):
                chunk = rows[start:start + self.config.batch_size]
                width = max(len(r) for r, _ in chunk)
                ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in chunk], device=device)
                mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in chunk],
                                    device=device)
                tensors = [t for _, t in chunk]
                pixels = prompt_images(tensors, width, model_type, device, left=False) \
                    if any(tensors) else None
                scores += self._model(ids, mask, images=pixels).tolist()
        return scores
