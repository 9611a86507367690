"""The ``orpo`` strategy: odds ratio preference optimization, without a reference model.

Loss per pair: the chosen response's NLL per token, ``-avg(chosen)``, plus ``beta`` (the
paper's lambda) times the odds-ratio term ``-log sigmoid(log odds(chosen) - log
odds(rejected))``, where ``odds(y) = p / (1 - p)`` and ``p`` is the response's
length-normalised probability (exp of its mean token log-prob). The micro-batch's loss
is the mean over its pairs, so accumulated micro-batches and N processes take the
1-process step. Pairs come from preference data or from rollouts (see
:mod:`astrai_plugin_dpo.pair_strategy`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field
from torch import Tensor

from astrai_plugin_dpo.losses import orpo_loss
from astrai_plugin_dpo.pair_strategy import PairConfig, PairStrategy


class ORPOConfig(PairConfig):
    """The ``strategy:`` section of an orpo run."""

    beta: float = Field(0.1, gt=0, description="weight of the odds-ratio term (the paper's "
                        "lambda) beside the chosen responses' NLL")


class ORPO(PairStrategy):
    """ORPO: the chosen responses' NLL plus beta times -log sigmoid of the log odds ratio
    of chosen over rejected (length-normalised probabilities); no reference model."""

    Config: ClassVar[type[BaseModel]] = ORPOConfig

    def compute_loss(self, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        batch = self.on_device(batch)
        chosen, rejected, aux_loss, tokens = self.pair_logprobs(self.run.model, batch)
        chosen_avg, rejected_avg = self.average_logprobs(batch, chosen, rejected)
        odds_losses, metrics = orpo_loss(chosen_avg, rejected_avg, beta=self.config.beta)
        nll = -chosen_avg  # per pair: a mean over its own tokens
        loss = (nll + odds_losses).mean()
        metrics.update(nll=nll.detach().mean(), odds_ratio_loss=odds_losses.detach().mean(),
                       chosen_logp=chosen.detach().mean(), rejected_logp=rejected.detach().mean(),
                       tokens=tokens, loss_weight=len(odds_losses))
        return self.add_aux_loss(loss, aux_loss, metrics), metrics
