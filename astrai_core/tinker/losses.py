"""Tinker's built-in losses, per token, on target log-probs from the chunked head.

Each takes the target log-probs ``[B, T]`` (with gradient), the datums' loss inputs as
``[B, T]`` tensors and the mask of real tokens, and returns the elementwise loss (0 on
padding); the step's loss is its sum (``loss:sum``), as Tinker defines it:

- ``cross_entropy``: ``-logp * weights``;
- ``importance_sampling``: ``-exp(logp - q) * A`` (q: the sampler's log-probs);
- ``ppo``: ``-min(r A, clip(r, low, high) A)``, r = exp(logp - q); astrai's PPO-clip;
- ``cispo``: ``-sg(clip(r, low, high)) * logp * A``; astrai's CISPO;
- ``dro``: ``-(logp A - beta/2 (logp - q)^2)``;
- ``gspo``: ``-min(s_t A, clip(s_t, low, high) A)`` (GSPO-token): ``s_t`` has the value of
  the datum's sequence ratio ``exp(mean over sequence_ratio_mask of (logp - q))`` and the
  gradient of ``exp(logp)/sg(exp(logp))``, the token's own.

ppo, cispo and gspo clip at loss_fn_config's ``clip_low_threshold``/``clip_high_threshold``
(0.8/1.2), or per token at the datums' loss inputs of those names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from astrai_core.rl.policy_losses import CISPO, PPOClip
from astrai_core.tinker.engine_types import EngineRequestError

# loss name -> (the loss_fn_inputs it needs beside target_tokens, its config keys)
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages", "sequence_ratio_mask"),
}
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "gspo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
}
LossFn = Callable[[Tensor, dict[str, Tensor], Tensor, dict[str, float]], Tensor]


def loss_config(loss_fn: str, given: dict[str, float] | None) -> dict[str, float]:
    """The loss's options: its defaults overridden by ``given``; unknown keys refused."""
    if loss_fn not in LOSS_INPUTS:
        raise EngineRequestError(f"unknown loss_fn {loss_fn!r}; the built-in losses: "
                                 f"{', '.join(LOSS_INPUTS)}")
    defaults = LOSS_CONFIG[loss_fn]
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise EngineRequestError(f"loss_fn_config: {loss_fn} takes no {unknown[0]!r} "
                                 f"(its options: {allowed})")
    return {**defaults, **{key: float(value) for key, value in (given or {}).items()}}


def cross_entropy(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor,
                  config: dict[str, float]) -> Tensor:
    return torch.where(mask, -logp * inputs["weights"], 0.0)


def importance_sampling(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor,
                        config: dict[str, float]) -> Tensor:
    ratio = torch.exp(torch.where(mask, logp - inputs["logprobs"], 0.0))
    return torch.where(mask, -ratio * inputs["advantages"], 0.0)


def _thresholds(inputs: dict[str, Tensor], config: dict[str, float]
                ) -> tuple[Tensor | float, Tensor | float]:
    """(low, high) bounds of the ratio: per token when the datums carry
    ``clip_low_threshold``/``clip_high_threshold``, else loss_fn_config's."""
    return (inputs.get("clip_low_threshold", config["clip_low_threshold"]),
            inputs.get("clip_high_threshold", config["clip_high_threshold"]))


def _clip_bounds(inputs: dict[str, Tensor], config: dict[str, float]
                 ) -> tuple[Tensor | float, Tensor | float]:
    """(eps_low, eps_high) of the clip range, as astrai's policy losses take it."""
    low, high = _thresholds(inputs, config)
    return 1.0 - low, high - 1.0


def ppo(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor, config: dict[str, float]) -> Tensor:
    loss = PPOClip(*_clip_bounds(inputs, config))
    per_token, _ = loss(logprobs=logp, old_logprobs=inputs["logprobs"],
                        advantages=inputs["advantages"], response_mask=mask)
    return per_token


def cispo(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor,
          config: dict[str, float]) -> Tensor:
    loss = CISPO(*_clip_bounds(inputs, config))
    per_token, _ = loss(logprobs=logp, old_logprobs=inputs["logprobs"],
                        advantages=inputs["advantages"], response_mask=mask)
    return per_token


def dro(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor, config: dict[str, float]) -> Tensor:
    gap = torch.where(mask, logp - inputs["logprobs"], 0.0)
    objective = logp * inputs["advantages"] - 0.5 * config["beta"] * gap**2
    return torch.where(mask, -objective, 0.0)


def gspo(logp: Tensor, inputs: dict[str, Tensor], mask: Tensor, config: dict[str, float]) -> Tensor:
    in_ratio = mask & (inputs["sequence_ratio_mask"] != 0)
    gap = torch.where(in_ratio, logp.detach() - inputs["logprobs"], 0.0)
    # the datum's mean log-ratio; batch.check_datums refuses a mask that marks no token
    sequence = gap.sum(-1, keepdim=True) / in_ratio.sum(-1, keepdim=True).clamp(min=1)
    own = torch.where(mask, logp - logp.detach(), 0.0)  # value 0, the token's own gradient
    ratio = torch.exp(sequence + own)
    low, high = _thresholds(inputs, config)
    advantages = inputs["advantages"]
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return torch.where(mask, -objective, 0.0)


LOSSES: dict[str, LossFn] = {"cross_entropy": cross_entropy,
                             "importance_sampling": importance_sampling, "ppo": ppo,
                             "cispo": cispo, "dro": dro, "gspo": gspo}
