"""The loss options several strategies share, each declared (described, typed, checked) once.

A strategy's ``Config`` mixes in the groups it has:

- :class:`AuxLossOption`: ``aux_loss_coef`` (every strategy with a MoE-aware loss);
- :class:`AggregationOption`: ``loss_aggregation``; :class:`LossAggregationOptions` adds
  ``norm_length`` and its check (grpo, distill);
- :class:`KLEstimatorOption`: ``kl_estimator`` (every online strategy: the KL reward
  shaping and the in-loss KL term); :class:`KLPenaltyOption`: ``kl_coef``, the in-loss
  KL term (grpo, ppo);
- :class:`EntropyOption`: ``entropy_coef``.

A strategy whose default differs redeclares only the default with :func:`redefault`, so
the description and the checks stay the owner's; e.g. grpo's ``kl_estimator`` is k3 (the
GRPO paper's in-loss estimator), every other online strategy's k1 (the log-ratio, the
classic estimator of KL reward shaping).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                          "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def redefault(owner: type[BaseModel], name: str, default: Any) -> Any:
    """``owner``'s field ``name`` with another default (same description and checks), for
    a subclass that redeclares it: ``kl_estimator: KLEstimator = redefault(
    KLEstimatorOption, "kl_estimator", "k3")``."""
    return FieldInfo.merge_field_infos(owner.model_fields[name], default=default)


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AuxLossOption(_Options):
    aux_loss_coef: float | None = Field(
        None, ge=0, description="MoE load-balancing weight (default: the model's config)")


class EntropyOption(_Options):
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight")


class KLPenaltyOption(_Options):
    kl_coef: float = Field(0.0, ge=0, description="weight of the in-loss KL to the frozen "
                           "reference (estimated with kl_estimator)")


class KLEstimatorOption(_Options):
    kl_estimator: KLEstimator = Field(
        "k1", description="KL estimator of the reward shaping (kl_in_reward_coef) and of an "
        "in-loss term (kl_coef): k1 the log-ratio, k2 half its square, k3 ratio - 1 - "
        "log-ratio; k1 by default, k3 for grpo (the GRPO paper's in-loss estimator)")


class AggregationOption(_Options):
    loss_aggregation: LossAggregation = Field(
        "token-mean", description="how the per-token losses make the loss: token-mean "
        "(over every loss token of the batch), or seq-mean-* (per sequence, i.e. row, first)")


class LossAggregationOptions(AggregationOption):
    norm_length: int | None = Field(
        None, ge=1, description="seq-mean-token-sum-norm's constant length "
        "(default: the batch's response width)")

    @model_validator(mode="after")
    def _norm_length_has_its_mode(self) -> LossAggregationOptions:
        if self.norm_length is not None and self.loss_aggregation != "seq-mean-token-sum-norm":
            raise ValueError("norm_length applies only to loss_aggregation: "
                             "seq-mean-token-sum-norm")
        return self
