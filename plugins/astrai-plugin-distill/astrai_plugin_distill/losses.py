"""Per-token distillation losses over a student's and a teacher's logits.

Every function takes logits rows ``student`` and ``teacher`` [n, V] (one row per response
token, the logits that predict it) and returns the per-token loss [n]; both distributions
are softened by the same ``temperature`` (softmax(logits / T)). Write p_s and p_t for the
student's and the teacher's distributions at one position:

* ``reverse_kl``:  KL(p_s || p_t) = sum_v p_s(v) (log p_s(v) - log p_t(v)), exact over the
  whole vocabulary (the mode-seeking divergence of on-policy distillation);
* ``sampled_reverse_kl``: the one-sample estimate log p_s(y) - log p_t(y) of the same KL at
  the token y actually in the row, as a score-function loss: its value is the estimate,
  its gradient (log p_s(y) - log p_t(y)) * grad log p_s(y) (valid on the student's own
  samples only);
* ``forward_kl``:  KL(p_t || p_s), over the teacher's ``top_k`` most likely tokens when
  given, both distributions renormalised over that set;
* ``generalized_jsd``: GKD's generalized Jensen-Shannon divergence with mixture
  m = beta p_t + (1 - beta) p_s: beta KL(p_t || m) + (1 - beta) KL(p_s || m), with
  beta = 0 the forward KL and beta = 1 the reverse KL (the conventions of TRL's
  ``GKDTrainer.generalized_jsd_loss``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

TokenLoss = Callable[[Tensor, Tensor, Tensor], Tensor]  # (student, teacher, targets) -> [n]


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) along the last dimension, from finite log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _log_probs(student: Tensor, teacher: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    return (F.log_softmax(student / temperature, dim=-1),
            F.log_softmax(teacher / temperature, dim=-1))


def reverse_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(p_s || p_t) per row, over the whole vocabulary."""
    log_s, log_t = _log_probs(student, teacher, temperature)
    return _kl(log_s, log_t)


def sampled_reverse_kl(student: Tensor, teacher: Tensor, targets: Tensor,
                       temperature: float = 1.0) -> Tensor:
    """log p_s(y) - log p_t(y) at each row's token y, with the score-function gradient."""
    log_s, log_t = _log_probs(student, teacher, temperature)
    index = targets.unsqueeze(-1)
    logp_s = log_s.gather(-1, index).squeeze(-1)
    logp_t = log_t.gather(-1, index).squeeze(-1)
    estimate = (logp_s - logp_t).detach()
    return estimate + estimate * (logp_s - logp_s.detach())  # value: estimate


def forward_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0,
               top_k: int | None = None) -> Tensor:
    """KL(p_t || p_s) per row; with ``top_k``, over the teacher's k most likely tokens,
    both distributions renormalised over them."""
    if top_k is not None and top_k < teacher.shape[-1]:
        index = teacher.topk(top_k, dim=-1).indices
        student, teacher = student.gather(-1, index), teacher.gather(-1, index)
    log_s, log_t = _log_probs(student, teacher, temperature)
    return _kl(log_t, log_s)


def generalized_jsd(student: Tensor, teacher: Tensor, beta: float = 0.5,
                    temperature: float = 1.0) -> Tensor:
    """beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student, teacher, temperature)
    if beta == 1.0:
        return reverse_kl(student, teacher, temperature)
    log_s, log_t = _log_probs(student, teacher, temperature)
    mixture = torch.logsumexp(torch.stack([log_s + math.log(1 - beta),
                                           log_t + math.log(beta)]), dim=0)
    return beta * _kl(log_t, mixture) + (1 - beta) * _kl(log_s, mixture)


def token_loss(loss: str, *, beta: float = 0.5, temperature: float = 1.0,
               top_k: int | None = None, estimator: str = "exact") -> TokenLoss:
    """The (student logits, teacher logits, target ids) -> [n] function a config names."""
    if loss == "reverse_kl" and estimator == "sampled":
        return lambda s, t, y: sampled_reverse_kl(s, t, y, temperature)
    if loss == "reverse_kl":
        return lambda s, t, y: reverse_kl(s, t, temperature)
    if loss == "forward_kl":
        return lambda s, t, y: forward_kl(s, t, temperature, top_k)
    if loss == "jsd":
        return lambda s, t, y: generalized_jsd(s, t, beta, temperature)
    raise ValueError(f"unknown distillation loss {loss!r}")


def with_nll(loss: TokenLoss) -> TokenLoss:
    """``loss``, the student's negative log-likelihood of each row's token (at temperature
    1), and whether the token is the teacher's most likely one (1.0 or 0.0), stacked:
    [n, 3]."""
    def all_three(student: Tensor, teacher: Tensor, targets: Tensor) -> Tensor:
        nll = -F.log_softmax(student, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        agrees = (teacher.argmax(-1) == targets).to(nll.dtype)
        return torch.stack([loss(student, teacher, targets), nll, agrees], dim=-1)

    return all_three
