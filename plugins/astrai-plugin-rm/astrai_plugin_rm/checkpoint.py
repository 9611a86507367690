"""Reward-model checkpoints: a native checkpoint plus ``score.safetensors`` (the score head).

The ``rm`` strategy's checkpoints are these (the trainer saves the head as the trained
module ``score``); so are the directories ``python -m astrai_plugin_rm import`` writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from astrai_core.api import CheckpointError, load_pretrained, load_tokenizer
from astrai_plugin_rm.scoring import SCORE_HEAD, RewardModel, new_score_head, reward_pad_id

SCORE_FILE = f"{SCORE_HEAD}.safetensors"


def score_file(directory: str | Path) -> Path:
    """``directory/score.safetensors``; a clear error when the directory has none."""
    path = Path(directory) / SCORE_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a reward model: it has no {SCORE_FILE} (train one with "
            "strategy rm, or import a Hugging Face sequence classifier with "
            "`python -m astrai_plugin_rm import SRC DST`)")
    return path


def load_score_weight(directory: str | Path) -> torch.Tensor:
    """The score head's weight [1, hidden] from a reward-model checkpoint."""
    from safetensors.torch import load_file

    tensors = load_file(str(score_file(directory)))
    weight = tensors.get("weight")
    if weight is None or weight.dim() != 2 or weight.shape[0] != 1:
        raise CheckpointError(f"{Path(directory) / SCORE_FILE} must hold one tensor 'weight' "
                              f"of shape [1, hidden], got {sorted(tensors)}")
    return weight


def load_reward_model(directory: str | Path, *, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> tuple[RewardModel, Any]:
    """(the reward model in eval mode, its tokenizer) of a reward-model checkpoint."""
    weight = load_score_weight(directory)
    backbone = load_pretrained(directory, dtype=dtype, device=device)
    if weight.shape[1] != backbone.config.hidden_size:
        raise CheckpointError(f"{Path(directory) / SCORE_FILE}: the score head is "
                              f"{weight.shape[1]} wide, the model {backbone.config.hidden_size}")
    parameter = next(backbone.parameters())
    score = new_score_head(weight.shape[1], 0.0, parameter)
    with torch.no_grad():
        score.weight.copy_(weight)
    tokenizer = load_tokenizer(directory)
    return RewardModel(backbone, score, reward_pad_id(tokenizer)).eval(), tokenizer
