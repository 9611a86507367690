"""Does the run fit the model: checks at plan time that need the model's config only.

- ``model.lora.target_modules`` on the native decoder names its projections (a
  transformers family's names are resolved on its model, when it is built);
- ``data.seq_len``, when set, fits the model's context (``max_position_embeddings``: for a
  RoPE-scaled model, the scaled length its config states, or its YaRN factor times the
  original length it states), when the run's batches are
  sequences of that length (the prompt and generation lengths are checked by
  :mod:`astrai_core.config.prompt_budget`);
- :func:`check_memory`, once the device backend is chosen and before the model loads:
  one micro-batch's activations (a coarse estimate) against the memory the device has.
"""

from __future__ import annotations

from typing import Any

from astrai_core.checkpoints.model_source import TRANSFORMERS, ModelSource
from astrai_core.config.prompt_budget import model_context
from astrai_core.config.schema import RunConfig
from astrai_core.data.config import BATCH_KIND
from astrai_core.errors import FieldError
from astrai_core.log import get_logger


def check_model_fit(config: RunConfig, source: ModelSource | None) -> None:
    """A FieldError naming the field when ``config`` asks for more than the model has."""
    lora = config.model.lora
    if lora is not None and (source is None or source.backend != TRANSFORMERS):
        message = lora.unknown_native_target()
        if message is not None:
            raise FieldError(("model", "lora", "target_modules"), message)
    if not uses_seq_len(config.data):
        return
    context = model_context(config, source)
    seq_len = config.data.seq_len
    if context is None or seq_len <= context[0]:
        return
    window, where = context
    if "seq_len" not in config.data.model_fields_set:  # the default: warn_default_seq_len
        return
    raise FieldError(("data", "seq_len"), f"{seq_len} tokens exceed the model's context of "
                     f"{window} positions ({where}); use at most {window}")


def warn_default_seq_len(config: RunConfig, source: ModelSource | None) -> None:
    """A warning, once the plan holds (a plan error stays one line), when ``data.seq_len``
    was left at its default and that default exceeds the model's context."""
    if "seq_len" in config.data.model_fields_set or not uses_seq_len(config.data):
        return
    context = model_context(config, source)
    if context is not None and config.data.seq_len > context[0]:
        get_logger("astrai.config").warning(
            f"data.seq_len's default {config.data.seq_len} exceeds the model's context of "
            f"{context[0]} positions ({context[1]}); set data.seq_len")


def uses_seq_len(data: Any) -> bool:
    """True when the run's training or evaluation batches are cut to ``data.seq_len``
    (every format but ``prompt``)."""
    formats = [s.format for s in data.sources]
    formats += [e.format for e in [data.eval, *data.eval_sets] if e is not None]
    return any(BATCH_KIND[f] != "prompt" for f in formats)


# Bytes of activations kept per token, per hidden unit, per layer, for 16-bit compute
# (attention and MLP inputs, norms, softmax, dropout-free: about 34 bytes, the figure of
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models").
_ACTIVATION_BYTES = 34
_HEADROOM = 4  # refuse only a run estimated to need this many times the memory there is


def model_config_fields(config: RunConfig, source: ModelSource | None) -> dict[str, Any] | None:
    """The model's config: a from-scratch model's ``model.config``, else its directory's
    config.json (a multimodal config's language model); None where it cannot be read."""
    import json
    from pathlib import Path

    if config.model.path is None:
        return dict(config.model.config or {})
    directory = Path(config.model.path) if source is None else Path(source.directory)
    try:
        fields = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return (fields.get("text_config") or fields) if isinstance(fields, dict) else None


def model_dims(config: RunConfig, source: ModelSource | None) -> dict[str, int] | None:
    """hidden size, layers and vocabulary of the model, from its config (None: unread)."""
    fields = model_config_fields(config, source)
    if fields is None:
        return None
    layers = fields.get("num_layers", fields.get("num_hidden_layers"))
    # a from-scratch model's vocabulary is its tokenizer's, unknown here: no logits term
    dims = {"hidden": fields.get("hidden_size"), "layers": layers,
            "vocab": fields.get("vocab_size") or 0}
    return dims if all(isinstance(v, int) and v >= 0 for v in dims.values()) \
        and dims["hidden"] and dims["layers"] else None


def activation_bytes(config: RunConfig, dims: dict[str, int], context: int) -> tuple[int, str]:
    """(an estimate of one micro-batch's activation memory, the sizes it is made of):
    rows x tokens x hidden x layers x 34 bytes (16-bit; twice that in float32), only one
    layer's worth plus each layer's input under activation checkpointing, and the float32
    logits and their gradient where the loss takes the full logits (sequence batches;
    the other strategies score through the chunked head)."""
    data, trainer = config.data, config.trainer
    kind = BATCH_KIND[data.sources[0].format] if data.sources else "prompt"
    tokens = data.seq_len if kind != "prompt" else min(context, (data.max_prompt_len or context))
    rows = -(-data.batch_size // trainer.grad_accum_steps) * (2 if kind == "preference" else 1)
    if trainer.micro_batch_tokens is not None:
        rows, tokens = 1, trainer.micro_batch_tokens
    width = 2 if config.model.dtype != "float32" or trainer.mixed_precision == "bf16" else 4
    per_layer = rows * tokens * dims["hidden"] * _ACTIVATION_BYTES * width // 2
    if config.parallel.activation_checkpointing:
        total = per_layer + rows * tokens * dims["hidden"] * width * dims["layers"]
    else:
        total = per_layer * dims["layers"]
    logits = kind == "sequence" and dims["vocab"] > 0
    if logits:
        total += 2 * rows * tokens * dims["vocab"] * 4
    sizes = (f"{rows} rows x {tokens} tokens x hidden {dims['hidden']} x {dims['layers']} "
             f"layers" + (f" + logits over {dims['vocab']} tokens" if logits else ""))
    return total, sizes


def check_memory(config: RunConfig, source: ModelSource | None, available: int | None,
                 where: str) -> None:
    """A FieldError naming the sizes when the activations alone are estimated to need
    more than four times the ``available`` bytes of ``where`` (the device backend's
    figure; None: unknown, nothing is checked). The margin is wide on purpose: the
    estimate is coarse, and only a run that cannot fit is refused."""
    dims = model_dims(config, source)
    context = model_context(config, source)
    if available is None or dims is None:
        return
    need, sizes = activation_bytes(config, dims, context[0] if context else 4096)
    if need > _HEADROOM * available:
        field = ("trainer", "micro_batch_tokens") if config.trainer.micro_batch_tokens \
            else ("data", "batch_size")
        raise FieldError(field, f"activations of about {_size(need)} ({sizes}) cannot fit "
                         f"the {_size(available)} of {where}; lower data.batch_size "
                         "or data.seq_len, raise trainer.grad_accum_steps, or set "
                         "parallel.activation_checkpointing")


def _size(count: int) -> str:
    """``count`` bytes, in the largest binary unit that keeps a figure of at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
