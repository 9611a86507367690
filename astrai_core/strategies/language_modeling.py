"""Next-token prediction: the `seq` (pretraining text) and `sft` (chat) strategies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from astrai_core.config.strategy_needs import StrategyNeeds
from astrai_core.data.image_batch import NOT_SPLIT, has_image_inputs, model_images
from astrai_core.distributed.context_rows import context_parallel_logprobs
from astrai_core.errors import ConfigError
from astrai_core.model.head import target_logprobs
from astrai_core.rl.options import AuxLossOption
from astrai_core.training.strategy import Strategy


def next_token_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over target tokens, and their count.

    ``logprobs[b, t - 1]``: the log-prob of ``input_ids[b, t]`` from position t - 1 (see
    :func:`target_logprobs`); ``loss_mask[b, t]`` marks token t as a target.
    """
    return _mean_over_targets(logprobs, loss_mask[:, 1:].bool())


def _mean_over_targets(logprobs: torch.Tensor, targets: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean negative log-prob where ``targets`` [same shape] is true, and the count."""
    count = targets.sum()
    loss = -torch.where(targets, logprobs, 0.0).sum() / count.clamp(min=1)
    return loss, count


def router_metrics(router_stats: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """MoE diagnostics averaged over layers (empty for dense models)."""
    if not router_stats:
        return {}
    names = ("entropy", "dead_fraction", "load_imbalance")
    return {f"moe/{name}": torch.stack([torch.as_tensor(layer[name], dtype=torch.float32)
                                        for layer in router_stats]).mean()
            for name in names}


class LanguageModelingConfig(AuxLossOption):
    """The ``strategy:`` section of a seq or sft run."""


class LanguageModeling(Strategy):
    """Cross-entropy on the targets the data pipeline marks, plus the MoE auxiliary loss."""

    Config: ClassVar[type[BaseModel]] = LanguageModelingConfig

    @classmethod
    def needs(cls, config: Any) -> StrategyNeeds:
        # its loss sums over target tokens: a row's tokens may be split over ranks
        return replace(super().needs(config), context_parallel=True, loss_on_token_shards=True)

    def compute_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = self.to_device(batch)
        ids = batch["input_ids"]
        if self.run.dist.context_size > 1 and has_image_inputs(batch):
            raise ConfigError(NOT_SPLIT)
        if self.run.dist.context_size > 1:  # this rank's shard of every row's tokens
            output = context_parallel_logprobs(self.run.model, batch, self.run.dist)
            loss, count = _mean_over_targets(output["logprobs"], output["trained"])
        else:
            # the chunked head scores every next token: no [B, S, V] logits (model/head.py)
            # a vision-language model's rows: their pixels, as the family takes them
            images = model_images(self.run.model, batch)
            output = target_logprobs(self.run.model, ids, ids[:, 1:],
                                     attention_mask=batch.get("attention_mask"),
                                     position_ids=batch.get("position_ids"),
                                     **({"images": images} if images else {}))
            loss, count = next_token_loss(output["logprobs"], batch["loss_mask"])
        # loss_weight: the mean runs over `count` targets, so accumulated micro-batches are
        # weighted by their targets and grad_accum_steps equals one big batch.
        metrics: dict[str, Any] = {"lm_loss": loss.detach(), "tokens": count,
                                   "loss_weight": count}
        loss = self.add_aux_loss(loss, output["aux_loss"], metrics)
        metrics.update(router_metrics(output["router_stats"]))
        return loss, metrics


class Seq(LanguageModeling):
    """Pretraining on raw text: every token is a target."""

    data_formats = ("text",)


class Sft(LanguageModeling):
    """Supervised fine-tuning on chats (only assistant tokens are targets) and on
    prompt-completion pairs (only the completion, unless ``data.completion_only_loss`` is
    off)."""

    data_formats = ("chat", "prompt_completion", "text")
