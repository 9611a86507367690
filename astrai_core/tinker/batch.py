"""Datums checked and padded into one batch for the model and the loss.

Datum ``i`` of length ``L`` scores ``target_tokens[t]`` from position ``t`` (Tinker's
next-token alignment). Rows are right-padded to the longest; the model's chunked head
scores the targets when they are "the last T tokens" of its input, so one pad column is
appended to the input: the positions 0…T-1 then predict columns 1…T, which carry the
targets (padding after a row never changes its real positions' outputs: attention is causal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from astrai_core.tinker.engine_types import DatumIn, EngineRequestError
from astrai_core.tinker.losses import LOSS_INPUTS

# per-token clip thresholds a policy loss takes in loss_fn_inputs, in place of loss_fn_config's
OPTIONAL_INPUTS = {"ppo": ("clip_low_threshold", "clip_high_threshold"),
                   "cispo": ("clip_low_threshold", "clip_high_threshold"),
                   "gspo": ("clip_low_threshold", "clip_high_threshold")}


@dataclass
class Batch:
    input_ids: Tensor        # [B, T + 1]: the tokens, right-padded, one more pad column
    target_ids: Tensor       # [B, T]
    attention_mask: Tensor   # [B, T + 1]
    mask: Tensor             # [B, T] bool: real positions
    inputs: dict[str, Tensor]  # loss inputs [B, T], float32
    lengths: list[int]


def check_datums(datums: list[DatumIn], loss_fn: str, vocab_size: int,
                 max_tokens: int | None = None) -> None:
    """Each datum's tokens in the vocabulary and its loss inputs of the input's length."""
    if not datums:
        raise EngineRequestError("no datums: a request needs at least one")
    needed = ("target_tokens",) + LOSS_INPUTS[loss_fn]
    optional = OPTIONAL_INPUTS.get(loss_fn, ())
    for key in optional:
        given = sum(key in d.loss_fn_inputs for d in datums)
        if 0 < given < len(datums):
            raise EngineRequestError(f"loss_fn_inputs[{key!r}]: given in {given} of "
                                     f"{len(datums)} datums; give it in all or none")
    for index, datum in enumerate(datums):
        length = len(datum.tokens)
        if length == 0:
            raise EngineRequestError(f"datum {index}: model_input has no tokens")
        if max_tokens is not None and length > max_tokens:
            raise EngineRequestError(f"datum {index}: {length} tokens, more than the "
                                     f"{max_tokens} a datum may have")
        _check_ids(np.asarray(datum.tokens), vocab_size, f"datum {index}: model_input")
        for key in needed + tuple(k for k in optional if k in datum.loss_fn_inputs):
            if key not in datum.loss_fn_inputs:
                raise EngineRequestError(f"datum {index}: loss_fn_inputs has no {key!r}, "
                                         f"which {loss_fn} needs ({', '.join(needed)})")
            value = np.asarray(datum.loss_fn_inputs[key])
            if value.shape != (length,):
                raise EngineRequestError(f"datum {index}: loss_fn_inputs[{key!r}] has shape "
                                         f"{list(value.shape)}, the input has {length} tokens")
        _check_ids(np.asarray(datum.loss_fn_inputs["target_tokens"]), vocab_size,
                   f"datum {index}: loss_fn_inputs['target_tokens']")
        if "sequence_ratio_mask" in needed and not np.any(datum.loss_fn_inputs["sequence_ratio_mask"]):
            raise EngineRequestError(f"datum {index}: loss_fn_inputs['sequence_ratio_mask'] marks "
                                     f"no token; {loss_fn}'s sequence ratio needs at least one")


def _check_ids(ids: np.ndarray, vocab_size: int, where: str) -> None:
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise EngineRequestError(f"{where}: token ids must be integers, got {ids.dtype}")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise EngineRequestError(f"{where}: token id {int(bad[0])} is out of range "
                                 f"(the vocabulary has {vocab_size} tokens)")


def build_batch(datums: list[DatumIn], loss_fn: str, device: torch.device) -> Batch:
    """The padded tensors of checked ``datums``."""
    lengths = [len(d.tokens) for d in datums]
    rows, width = len(datums), max(lengths)
    input_ids = torch.zeros(rows, width + 1, dtype=torch.long)
    target_ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width + 1, dtype=torch.long)
    keys = LOSS_INPUTS[loss_fn] + tuple(k for k in OPTIONAL_INPUTS.get(loss_fn, ())
                                        if k in datums[0].loss_fn_inputs)
    inputs = {key: torch.zeros(rows, width, dtype=torch.float32) for key in keys}
    for row, (datum, length) in enumerate(zip(datums, lengths)):
        input_ids[row, :length] = torch.as_tensor(datum.tokens, dtype=torch.long)
        attention[row, :length] = 1
        target_ids[row, :length] = torch.as_tensor(
            np.asarray(datum.loss_fn_inputs["target_tokens"], dtype=np.int64))
        for key, tensor in inputs.items():
            tensor[row, :length] = torch.as_tensor(
                np.asarray(datum.loss_fn_inputs[key], dtype=np.float32))
    mask = attention[:, :width].bool()
    return Batch(input_ids.to(device), target_ids.to(device), attention.to(device),
                 mask.to(device), {k: v.to(device) for k, v in inputs.items()}, lengths)
