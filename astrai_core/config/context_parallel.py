"""``parallel.context_parallel``: checked at plan time, before anything is built.

N ranks split each row's tokens, so the run's processes must form whole groups of N, the
global batch must split over the data-parallel groups, the strategy must run on shards
of its rows' tokens (its needs say so), the model must be the native decoder or a
transformers family whose attention astrai runs (``model_backends/hf_attention.py``), and
the query heads must divide by N (Ulysses attention hands each rank H/N of them; KV heads
that N does not divide are replicated, not refused).
"""

from __future__ import annotations

from typing import Any

from astrai_core.checkpoints.model_source import TRANSFORMERS
from astrai_core.config.model_fit import model_config_fields
from astrai_core.config.schema import RunConfig
from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.errors import FieldError
from astrai_core.model_backends.hf_attention import FAMILIES

PATH = ("parallel", "context_parallel")


def check_context_parallel(config: RunConfig, needs: StrategyNeeds, source: Any,
                           world: int) -> None:
    """A FieldError naming the field when the run cannot split its rows over N ranks (a
    one-process run ignores the parallel section)."""
    size = config.parallel.context_parallel
    if size == 1 or world == 1:
        return
    if world % size:
        raise FieldError(PATH, f"{size} ranks per context group do not divide the {world} "
                         "processes of this run")
    if not needs.context_parallel:
        raise FieldError(PATH, f"strategy {config.strategy.name!r} does not split its rows' "
                         "tokens over ranks yet (docs/long-context.md lists those that "
                         "do); remove context_parallel")
    if source is not None and source.backend == TRANSFORMERS and source.model_type not in FAMILIES:
        raise FieldError(PATH, f"model_type {source.model_type!r} runs on the transformers "
                         "backend, where context parallelism supports "
                         f"{', '.join(FAMILIES)}; remove context_parallel")
    heads = _query_heads(config, source)
    if heads is not None and heads % size:
        raise FieldError(PATH, f"the model's {heads} query heads do not divide over {size} "
                         f"ranks (Ulysses attention gives each rank {heads}/{size} of them); "
                         "use a context_parallel that divides them")


def _query_heads(config: RunConfig, source: Any) -> int | None:
    """The model's query heads, from its config (None where it cannot be read)."""
    fields = model_config_fields(config, source) or {}
    heads = fields.get("num_heads", fields.get("num_attention_heads"))
    return int(heads) if isinstance(heads, int) else None
