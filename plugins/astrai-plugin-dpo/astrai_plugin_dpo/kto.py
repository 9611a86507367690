"""The ``kto`` strategy: Kahneman-Tversky optimization on unpaired, labelled completions.

Data: ``unpaired`` format, one completion per row with ``label`` true (desirable) or
false (undesirable). With r = log pi(y|x) - log ref(y|x) (summed over the completion's
tokens) and the reference point z0 (below), each example's loss is

    desirable:   desirable_weight   * (1 - sigmoid(beta * (r - z0)))
    undesirable: undesirable_weight * (1 - sigmoid(beta * (z0 - r)))

and the micro-batch's loss is their mean. z0 estimates KL(pi || ref) from mismatched
pairs of the same micro-batch: row i's prompt with row i-1's completion (cyclically),
z0 = max(0, mean of log pi - log ref over those pairs), without gradient. In a run of N
processes the pairs and the mean run over the global micro-batch (every process's rows,
in rank order), so z0, and with it every step, is the same as on one process. The
reference is the frozen starting policy (a LoRA policy with its adapter disabled).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from astrai_core.api import (AstraiError, AuxLossOption, FieldError, RunComponents, Strategy,
                             StrategyNeeds, frozen_reference, keep_prompt_images, pad_rows)
from astrai_plugin_dpo.losses import kto_kl_estimate, kto_loss
from astrai_plugin_dpo.pairs import response_logprobs


class KTOConfig(AuxLossOption):
    """The ``strategy:`` section of a kto run."""

    beta: float = Field(0.1, gt=0, description="strength of the KL anchor to the reference")
    desirable_weight: float = Field(1.0, gt=0, description="weight of desirable examples' "
                                    "losses")
    undesirable_weight: float = Field(1.0, gt=0, description="weight of undesirable "
                                      "examples' losses")


def mismatched_batch(batch: dict[str, Tensor], dist: Any = None) -> dict[str, Tensor]:
    """Row i: the prompt of row i followed by the completion of row i-1 (cyclically).

    A row's prompt is everything before its first target token, its completion the
    rest up to its padding; the result is right-padded like a loader batch. With ``dist``
    (a distributed run's context), i counts the rows of the global micro-batch: a
    process's first row gets the previous process's last completion. A
    vision-language model's rows keep their images, which are in their prompts.
    """
    lengths = batch["attention_mask"].sum(-1)
    targets = batch["loss_mask"].bool()
    # the first target's column; a row without targets is all prompt
    starts = torch.where(targets.any(-1), targets.int().argmax(-1), lengths).tolist()
    rows = batch["input_ids"].tolist()
    prompts = [row[:start] for row, start in zip(rows, starts)]
    completions = [row[start:end] for row, start, end in zip(rows, starts, lengths.tolist())]
    shifted = _shifted(completions, dist)
    input_ids, present = pad_rows([p + c for p, c in zip(prompts, shifted)], left=False,
                                  pad_value=0, dtype=torch.long)
    loss_mask, _ = pad_rows([[False] * len(p) + [True] * len(c) for p, c in zip(prompts, shifted)],
                            left=False, pad_value=False, dtype=torch.bool)
    # right padding: positions simply continue over it, as in the loaders' batches
    position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids).contiguous()
    device = batch["input_ids"].device
    return {"input_ids": input_ids.to(device), "attention_mask": present.long().to(device),
            "position_ids": position_ids.to(device), "loss_mask": loss_mask.to(device),
            **keep_prompt_images(batch, starts, input_ids.shape[1])}


def _shifted(completions: list[list[int]], dist: Any) -> list[list[int]]:
    """Each row's previous completion in the global micro-batch (cyclically)."""
    if dist is None or not dist.enabled:
        return completions[-1:] + completions[:-1]
    # token ids only: a few hundred ints; a context group's ranks hold the same rows
    shares = dist.all_gather_object(completions)[::dist.context_size]
    every = [c for share in shares for c in share]
    first = sum(len(share) for share in shares[:dist.data_rank])
    return [every[i - 1] for i in range(first, first + len(completions))]  # every[-1]: wrap


class KTO(Strategy):
    """KTO on ``unpaired`` data: desirable completions pushed above the reference point
    z0 (a KL estimate from mismatched pairs of the batch), undesirable ones below it."""

    Config: ClassVar[type[BaseModel]] = KTOConfig
    data_formats: ClassVar[tuple[str, ...]] = ("unpaired",)

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        # context parallel: every forward gathers the whole rows' log-probs
        return replace(super().needs(config), context_parallel=True)

    @classmethod
    def check_run(cls, config: Any, run_config: Any) -> None:
        super().check_run(config, run_config)
        if run_config.data.batch_size < 2:
            raise FieldError(("data", "batch_size"), "kto estimates its KL reference point "
                             "from mismatched pairs within a batch, so it needs at least 2 rows")

    def __init__(self, config: KTOConfig, run: RunComponents) -> None:
        super().__init__(config, run)
        self.reference = frozen_reference(run.model)

    def frozen_modules(self) -> dict[str, torch.nn.Module]:
        return {"reference": self.reference}

    def compute_loss(self, batch: Any) -> tuple[Tensor, dict[str, Any]]:
        batch = self.to_device(batch)
        dist = self.run.dist
        # The last batch of an evaluation file may hold one row, which is then paired with
        # itself (the estimate is biased, the evaluation still runs); training may not.
        rows = dist.all_reduce_sum([float(batch["input_ids"].shape[0])])[0] / dist.context_size
        if rows < 2 and torch.is_grad_enabled():
            raise AstraiError("kto needs at least 2 rows per micro-batch (its KL estimate "
                              "pairs rows); raise data.batch_size")
        # context parallel, each forward gives every rank of the group the whole rows'
        policy, aux_loss, tokens = response_logprobs(self.run.model, batch, dist)
        mismatched = mismatched_batch(batch, dist)
        with torch.no_grad():
            reference = response_logprobs(self.reference, batch, dist)[0]
            # every rank of a context group adds its rows alike: the mean is unchanged
            kl = kto_kl_estimate(response_logprobs(self.run.model, mismatched, dist)[0],
                                 response_logprobs(self.reference, mismatched, dist)[0],
                                 all_reduce_sum=dist.all_reduce_sum)
        cfg = self.config
        losses, _, metrics = kto_loss(policy, reference, batch["label"], kl, beta=cfg.beta,
                                      desirable_weight=cfg.desirable_weight,
                                      undesirable_weight=cfg.undesirable_weight)
        metrics.update(logp=policy.detach().mean(), tokens=tokens,
                       loss_weight=len(losses))  # the loss is a mean over examples
        return self.add_aux_loss(losses.mean(), aux_loss, metrics), metrics
