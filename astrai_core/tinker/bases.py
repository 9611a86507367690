"""The base models a Tinker engine offers, each loaded once and frozen.

``--model NAME=PATH``: PATH is what ``model.path`` takes in a run config (a native
checkpoint, a Hugging Face directory, or a hub id in the cache), resolved the same way
(:mod:`astrai_core.checkpoints.model_source`): natively where an importer takes the
family, else through transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from astrai_core.errors import AstraiError
from astrai_core.tinker.adapters import AdapterSlots
from astrai_core.tinker.engine_types import BaseModelFacts

DEFAULT_MAX_LORA_RANK = 128


@dataclass
class LoadedBase:
    """One base model in memory, its adapters, and what clients may learn of it."""

    facts: BaseModelFacts
    model: nn.Module
    model_type: str          # the Hugging Face model_type whose names peft files use
    directory: Path          # where it was loaded from (its tokenizer lives there)
    slots: AdapterSlots


def load_base(name: str, path: str, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu", max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
              cache_dir: str | None = None, registry: Any = None) -> LoadedBase:
    """Load ``path`` as the base model ``name`` (frozen, in eval mode, on ``device``)."""
    from astrai_core.checkpoints.hf.source import default_model_type
    from astrai_core.checkpoints.lora_files import model_type_of
    from astrai_core.checkpoints.model_source import (TRANSFORMERS, describe,
                                                      model_directory)
    from astrai_core.plugins import process_registry

    registry = registry or process_registry()
    try:
        source = describe(path, None, registry)
        directory = model_directory(source, registry, cache_dir)
        if source.backend == TRANSFORMERS:
            from astrai_core.checkpoints.hf_model import load_transformers_model

            model = load_transformers_model(directory, dtype=dtype)
        else:
            from astrai_core.checkpoints.native import load_pretrained

            model = load_pretrained(directory, dtype=dtype)
    except AstraiError as exc:
        raise AstraiError(f"--model {name}={path}: {exc}") from None
    model = model.to(device).eval()
    model_type = source.model_type or (model_type_of(directory) if source.native_checkpoint
                                       else default_model_type(model.config))
    facts = BaseModelFacts(name=name, tokenizer_path=str(source.directory),
                           vocab_size=int(model.config.vocab_size),
                           max_context=int(getattr(model.config, "max_position_embeddings",
                                                   0) or 0),
                           max_lora_rank=max_lora_rank)
    return LoadedBase(facts, model, model_type, Path(source.directory), AdapterSlots(model))
