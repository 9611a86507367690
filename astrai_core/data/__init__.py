"""Data: JSONL sources, tokenization with a cache, packing, mixing and resumable loaders.

Typical use by the trainer::

    cfg = DataConfig.model_validate(raw["data"]).resolve_paths(config_dir)
    tokenizer = load_tokenizer(model_dir)
    train = build_train_loader(cfg, tokenizer)      # endless; train.state_dict() to resume
    evaluation = build_eval_loader(cfg, tokenizer)  # None, or re-iterable single pass
    batch = next(train)

Importing this package does not import torch; the loaders do. Copying tokenizer files
into a checkpoint is ``astrai_core.checkpoints.native_files.copy_tokenizer_files``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astrai_core.data.config import DataConfig, EvalSourceConfig, SourceConfig
from astrai_core.data.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from astrai_core.data.build import build_eval_loader, build_train_loader
    from astrai_core.data.loader import PromptRecord

_LAZY = {"build_train_loader": "astrai_core.data.build",
         "build_eval_loader": "astrai_core.data.build",
         "PromptRecord": "astrai_core.data.loader",
         "fill_columns": "astrai_core.data.mixing"}

__all__ = ["DataConfig", "SourceConfig", "EvalSourceConfig", "load_tokenizer", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
