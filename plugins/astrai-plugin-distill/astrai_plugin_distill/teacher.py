"""The teacher: checked against the student before any work, loaded frozen, and run.

A teacher is any checkpoint directory astrai loads (``load_pretrained``: a native
checkpoint, a LoRA training checkpoint with its adapter applied). Its distributions are
compared with the student's token by token, so both must share one tokenizer: the run
plan refuses a teacher whose vocabulary size or tokenizer files differ from the
student's, naming both directories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from astrai_core.api import (FieldError, context_split, has_chunked_head, load_pretrained,
                             local_part, splits_rows)

TEACHER = ("strategy", "teacher")
# The files that define the token ids (a chat template or other settings may differ).
VOCAB_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
               "added_tokens.json")


def _vocab_size(directory: Path) -> int | None:
    """``vocab_size`` of a checkpoint's config.json; None when it has none."""
    try:
        return int(json.loads((directory / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _student_vocab(model: Any, tokenizer_dir: Path) -> int | None:
    """The student's vocabulary: its checkpoint's, its from-scratch config's, or (as a
    from-scratch model gets by default) its tokenizer's size."""
    if model.path is not None:
        return _vocab_size(Path(model.path))
    if (model.config or {}).get("vocab_size") is not None:
        return int(model.config["vocab_size"])
    if not (tokenizer_dir / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()


def check_teacher(teacher: Path, model: Any) -> None:
    """The teacher directory is a checkpoint whose tokenizer is the student's (``model``:
    the run config's ``model:`` section); FieldError on ``strategy.teacher`` otherwise."""
    if not teacher.is_dir() or not (teacher / "config.json").is_file():
        raise FieldError(TEACHER, f"teacher checkpoint directory {str(teacher)!r} does not "
                         "exist or holds no config.json")
    student_dir = Path(model.tokenizer or model.path)
    student_vocab = _student_vocab(model, student_dir)
    teacher_vocab = _vocab_size(teacher)
    if student_vocab is not None and teacher_vocab is not None and student_vocab != teacher_vocab:
        raise FieldError(TEACHER, f"the teacher {teacher} has a vocabulary of {teacher_vocab} "
                         f"tokens and the student ({model.path or student_dir}) one of "
                         f"{student_vocab}: distillation needs one shared tokenizer")
    if not student_dir.is_dir():  # not a local directory (a hub id): nothing to compare
        return
    for name in VOCAB_FILES:
        mine, theirs = student_dir / name, teacher / name
        if not mine.is_file() and not theirs.is_file():
            continue
        if not (mine.is_file() and theirs.is_file()) or mine.read_bytes() != theirs.read_bytes():
            raise FieldError(TEACHER, f"the teacher's tokenizer ({theirs}) differs from the "
                             f"student's ({mine}): distillation needs one shared tokenizer")


def load_teacher(path: Path, device: torch.device) -> nn.Module:
    """The teacher on ``device``, in eval mode, without gradients (the trainer keeps it
    frozen and, distributed, shards it like a reference)."""
    teacher = load_pretrained(path, device=device)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def _is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@torch.no_grad()
def teacher_head(teacher: nn.Module, input_ids: Tensor, mask: Tensor, dist: Any = None,
                 **forward: Any) -> tuple[Tensor, Tensor | None]:
    """The teacher's side of the loss at the positions predicting ``mask`` [B, S - 1]
    (True: a response token of ``input_ids[:, 1:]``).

    A native teacher gives (final hidden states [M, H] at those positions, its head
    weight [V, H]) for :func:`astrai_core.api.chunked_logits_map`; the weight is copied
    out of a sharded teacher's forward, where FSDP2 had gathered it (it is freed after).
    Any other model gives (its float32 logits [M, V] there, None). ``dist`` (the run's):
    with ``parallel.context_parallel``, this rank's shard of the rows only (the student's
    shard: :func:`astrai_plugin_distill.forward.student_token_losses`).
    """
    def at_mask(per_position: Tensor) -> Tensor:  # [B, S, ...] -> [M, ...]
        return per_position[:, :-1][mask]

    if splits_rows(dist):  # the shard's positions, and the mask's part of them
        input_ids, shard = context_split(input_ids, dist, **forward)
        local_mask, forward = local_part(mask, shard), {"context_shard": shard}

        def at_mask(per_position: Tensor) -> Tensor:
            return per_position[local_mask]

    if not has_chunked_head(teacher):
        return at_mask(teacher(input_ids, **forward)["logits"]).float(), None
    sharded = _is_sharded(teacher)

    def capture(hidden: Tensor, weight: Tensor) -> dict[str, Tensor]:
        return {"hidden": at_mask(hidden), "weight": weight.clone() if sharded else weight}

    out = teacher(input_ids, head=capture, **forward)
    return out["hidden"], out["weight"]
