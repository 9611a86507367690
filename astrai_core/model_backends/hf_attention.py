"""astrai's attention inside a transformers model: packed rows attended per document, and
context parallelism (``parallel.context_parallel``).

The families below call their attention through transformers' ``AttentionInterface``
with the module's own scaling and sliding window (Gemma 3's sliding layers, Mistral's
window). :func:`install` selects ``astrai_<implementation>`` on such a model (for its
``sdpa`` or ``eager``): in a forward that hands the layers a :class:`WholeRows` (the
``astrai_rows`` keyword, which the layers pass on to their attention), it attends
through the native decoder's code (:func:`~astrai_core.model.attention.attend_rows`:
SDPA per document on CPU, flash-attn's varlen kernel on CUDA, the context-parallel
all-to-alls around it) under the whole rows' mask or document layout, and transformers
builds no mask of its own; in every other forward it is the implementation it replaced,
with that implementation's masks, so those numbers do not change.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from astrai_core.model.attention import attend_rows
from astrai_core.model.context_parallel import ContextShard
from astrai_core.model.document_attention import DocumentLayout, Scores
from astrai_core.model.masks import AttentionBias, build_attention_bias

# model_type of the families whose attention modules astrai's attention function serves.
FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
ROWS_KEYWORD = "astrai_rows"
_PREFIX = "astrai_"
_REPLACED = ("sdpa", "eager")
# Set while a forward that carries WholeRows builds its masks: they are not needed then.
_ROWS_FORWARD: ContextVar[bool] = ContextVar("astrai_rows_forward", default=False)


@dataclass(eq=False)
class WholeRows:
    """The whole rows one forward attends over: their mask and position ids [B, S] (the
    layout of their documents where they are packed), and, under context parallelism, this
    rank's shard. Each layer's sliding window gets its bias, built once per forward."""

    seq: int
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    context: ContextShard | None = None
    layout: DocumentLayout | None = None
    _biases: dict[int | None, AttentionBias] = field(default_factory=dict)

    @classmethod
    def of_shard(cls, shard: ContextShard) -> WholeRows:
        return cls(shard.positions.shape[1], shard.attention_mask, shard.positions, shard)

    def bias(self, window: int | None, dtype: torch.dtype, device: torch.device
             ) -> AttentionBias:
        key = window if window is not None and window < self.seq else None
        if key not in self._biases:
            if self.layout is not None:
                bias = AttentionBias(None, is_causal=True, documents=self.layout, window=key)
            else:
                bias = build_attention_bias(
                    query_len=self.seq, past_len=0, attention_mask=self.attention_mask,
                    position_ids=self.position_ids, sliding_window=key, dtype=dtype,
                    device=device)
            bias.context = self.context
            self._biases[key] = bias
        return self._biases[key]


def install(hf_model: Any) -> bool:
    """Select astrai's attention on ``hf_model`` where its family and attention
    implementation allow it; whether it is selected."""
    config = hf_model.config
    implementation = str(getattr(config, "_attn_implementation", None))
    if implementation.startswith(_PREFIX):
        register(implementation)
        return True
    if (config.model_type not in FAMILIES or implementation not in _REPLACED
            or getattr(config, "use_bidirectional_attention", False)):
        return False
    register(_PREFIX + implementation)
    hf_model.set_attn_implementation(_PREFIX + implementation)
    return True


def register(name: str) -> None:
    """Register ``name`` (``astrai_sdpa`` or ``astrai_eager``) with transformers: in this
    process, once (a model unpickled in another process registers it again there)."""
    replaced = name.removeprefix(_PREFIX)
    if replaced not in _REPLACED:
        raise ValueError(f"{name}: astrai's attention replaces one of {_REPLACED}")
    _register(replaced)


@functools.cache
def _register(replaced: str) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    masks = ALL_MASK_ATTENTION_FUNCTIONS[replaced]

    def mask(*args: Any, **kwargs: Any) -> Any:
        return None if _ROWS_FORWARD.get() else masks(*args, **kwargs)

    AttentionInterface.register(_PREFIX + replaced, functools.partial(_attention, replaced))
    AttentionMaskInterface.register(_PREFIX + replaced, mask)


@contextlib.contextmanager
def rows_forward(active: bool) -> Iterator[None]:
    """Around a forward whose layers get a :class:`WholeRows`: transformers' mask
    functions then build nothing (the rows carry the mask)."""
    token = _ROWS_FORWARD.set(active)
    try:
        yield
    finally:
        _ROWS_FORWARD.reset(token)


def _attention(replaced: str, module: torch.nn.Module, query: torch.Tensor,
               key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention call: query [B, H, S, D], key/value [B, KV, S, D] ->
    ([B, S, H, D], no weights)."""
    rows: WholeRows | None = kwargs.pop(ROWS_KEYWORD, None)
    if rows is None:
        return _replaced(replaced, module)(module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("dropout"):
        raise ValueError("attention dropout is not supported for packed rows or context "
                         "parallelism on the transformers backend; set the model's "
                         "attention_dropout to 0")
    scores = Scores(kwargs.get("scaling"), kwargs.get("softcap"))
    bias = rows.bias(kwargs.get("sliding_window"), query.dtype, query.device)
    return attend_rows(query, key, value, bias, scores).contiguous(), None


def _replaced(replaced: str, module: torch.nn.Module) -> Callable[..., Any]:
    """The implementation astrai's replaced: sdpa's, or the family's own eager function."""
    if replaced == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[replaced]
