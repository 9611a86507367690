"""How long a prompt may be: what the model's context leaves after the generation.

A prompt and its completion share the model's context (``max_position_embeddings``; for
a YaRN-scaled model whose config states its original length there, as Qwen2.5's does,
that length times the YaRN factor), so
``data.max_prompt_len`` defaults to the context less the tokens generated after it: the
sampler's ``max_new_tokens`` for rollouts, ``trainer.eval_max_new_tokens`` for evaluation
by generation (the larger of the two when a run does both). A generation length that
leaves no room for a prompt, or a ``max_prompt_len`` that does not fit beside it, is a
plan-time error naming the fields; single prompts that are too long are skipped when the
data is loaded (one warning with their count, and the ``data/prompts_skipped`` metric).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.errors import FieldError

_CONFIG_FILE = "config.json"  # a native checkpoint's (astrai_core.checkpoints.native_files)
_DEFAULT_CONTEXT = 4096       # ModelConfig.max_position_embeddings's default


def model_context(config: RunConfig, source: Any = None) -> tuple[int, str] | None:
    """(the model's context in tokens, where it is set), or None when a checkpoint's
    config.json cannot be read (loading the model then says why). ``source``: the
    resolved ``model.path`` (a ModelSource: a hub id's local directory)."""
    model = config.model
    if model.path is None:
        fields = model.config or {}
        return _scaled(fields, int(fields.get("max_position_embeddings", _DEFAULT_CONTEXT)),
                       "model.config.max_position_embeddings")
    directory = Path(model.path) if source is None else Path(source.directory)
    path = directory / _CONFIG_FILE
    try:
        fields = json.loads(path.read_text())
        fields = fields.get("text_config") or fields  # a multimodal config's language model
        context = fields.get("max_position_embeddings", _DEFAULT_CONTEXT)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(context, int):
        return None
    return _scaled(fields, context, f"max_position_embeddings of {path}")


def _scaled(fields: dict[str, Any], context: int, where: str) -> tuple[int, str]:
    """(context, where) stretched by a YaRN RoPE scaling: its factor times the original
    length it was trained at (``original_max_position_embeddings``, by default
    ``max_position_embeddings``), when that is longer than ``max_position_embeddings``."""
    rope = fields.get("rope_scaling") or fields.get("rope_parameters") or {}
    if not isinstance(rope, dict) or (rope.get("rope_type") or rope.get("type")) != "yarn":
        return context, where
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings", context)
    if not isinstance(factor, (int, float)) or not isinstance(original, int):
        return context, where
    scaled = int(factor * original)
    if scaled <= context:
        return context, where
    return scaled, f"{where} with its YaRN factor {factor:g} over {original} positions"


def _generation(config: RunConfig, needs: StrategyNeeds, sampling: dict[str, Any]
                ) -> tuple[int, str] | None:
    """(the most tokens generated after a prompt, the field that sets it), or None when
    the run reads no prompts."""
    from astrai_core.sampling.params import SamplingParams

    lengths = []
    if needs.rollouts:
        lengths.append((int(sampling.get("max_new_tokens",
                                         SamplingParams.model_fields["max_new_tokens"].default)),
                        "sampler.max_new_tokens"))
    evaluations = [config.data.eval, *config.data.eval_sets]
    if any(e is not None and e.format == "prompt" for e in evaluations):
        lengths.append((config.trainer.eval_max_new_tokens, "trainer.eval_max_new_tokens"))
    return max(lengths) if lengths else None


def resolve_max_prompt_len(config: RunConfig, needs: StrategyNeeds,
                           sampling: dict[str, Any]) -> RunConfig:
    """``config`` with ``data.max_prompt_len`` set (its default: the context less the
    generation); a FieldError when no prompt, or no prompt of that length, fits."""
    generation = _generation(config, needs, sampling)
    context = model_context(config)
    if generation is None or context is None:
        return config
    (tokens, tokens_field), (window, window_field) = generation, context
    if tokens >= window:
        path = tuple(tokens_field.split("."))
        raise FieldError(path, f"{tokens} generated tokens leave no room for a prompt in the "
                         f"model's context of {window} tokens ({window_field}); lower it")
    limit = config.data.max_prompt_len
    if limit is not None and limit + tokens > window:
        raise FieldError(("data", "max_prompt_len"),
                         f"{limit} prompt tokens + {tokens_field} {tokens} = {limit + tokens} "
                         f"exceed the model's context of {window} tokens ({window_field}); "
                         f"lower one of them (at most {window - tokens} prompt tokens fit)")
    if limit is not None:
        return config
    data = config.data.model_copy(update={"max_prompt_len": window - tokens})
    return config.model_copy(update={"data": data})
